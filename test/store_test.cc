#include <catch2/catch.hpp>
#include <thread>

#include "holdfast/store.h"
#include "test/support/process_group.h"

using holdfast::Store;

namespace {
void ExerciseStore(Store& store) {
  REQUIRE(store.Set("a/b", "1").ok());
  auto v = store.Get("a/b", absl::Seconds(1));
  REQUIRE(v.ok());
  CHECK(*v == "1");
  REQUIRE(store.Set("a/b", std::string("x\0y", 3)).ok());
  CHECK(*store.Get("a/b", absl::Seconds(1)) == std::string("x\0y", 3));

  auto missing = store.TryGet("nope");
  REQUIRE(missing.ok());
  CHECK(!missing->has_value());

  // Get times out with DeadlineExceeded naming the key.
  auto late = store.Get("never", absl::Milliseconds(50));
  REQUIRE(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(late.status().message().find("never") != absl::string_view::npos);

  // Wait returns once another thread sets the keys.
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(30));
    (void)store.Set("k1", "v");
    (void)store.Set("k2", "v");
  });
  CHECK(store.Wait({"k1", "k2"}, absl::Seconds(5)).ok());
  setter.join();

  auto partial = store.Wait({"k1", "k3"}, absl::Milliseconds(50));
  REQUIRE(partial.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(partial.message().find("k3") != absl::string_view::npos);

  CHECK(store.Set("", "x").code() == absl::StatusCode::kInvalidArgument);
}
}  // namespace

TEST_CASE("memory store semantics") {
  auto store = holdfast::NewMemoryStore();
  ExerciseStore(*store);
}

TEST_CASE("file store semantics") {
  auto store = holdfast::NewFileStore(holdfast::proc::MakeTempDir());
  REQUIRE(store.ok());
  ExerciseStore(**store);
}

TEST_CASE("prefix store isolates namespaces") {
  auto base = holdfast::NewMemoryStore();
  auto g1 = holdfast::NewPrefixStore("g1/", base);
  REQUIRE(g1->Set("k", "one").ok());
  CHECK(*base->Get("g1/k", absl::Seconds(1)) == "one");
  CHECK(!base->TryGet("k")->has_value());
  ExerciseStore(*g1);
}

TEST_CASE("file store rejects a path that is not a directory") {
  auto store = holdfast::NewFileStore("/dev/null");
  CHECK(!store.ok());
  CHECK(holdfast::NewFileStore("").status().code() ==
        absl::StatusCode::kInvalidArgument);
}
