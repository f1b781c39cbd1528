// AbortQueue (src/runtime/abort_queue.h) as an object: no job, no
// controller.
#include "src/runtime/abort_queue.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

// What the abort function saw, and on which thread.
struct Seen {
  absl::Mutex mu;
  std::vector<std::pair<int64_t, std::string>> aborts ABSL_GUARDED_BY(mu);
  std::vector<std::thread::id> threads ABSL_GUARDED_BY(mu);

  size_t size() {
    absl::MutexLock lock(&mu);
    return aborts.size();
  }
};

}  // namespace

TEST_CASE(
    "abort queue: aborts run in order on a thread of their own, and a slow "
    "one does not hold up the thread that queues") {
  Seen seen;
  absl::Notification release;
  holdfast::AbortQueue q([&](int64_t upto, const std::string& reason) {
    if (upto == 1) release.WaitForNotification();  // a slow abort
    absl::MutexLock lock(&seen.mu);
    seen.aborts.emplace_back(upto, reason);
    seen.threads.push_back(std::this_thread::get_id());
  });
  // The first abort blocks the abort thread; the queuing thread goes on.
  q.Queue(1, "one");
  q.Queue(2, "two");
  q.Queue(3, "three");
  CHECK(seen.size() == 0);
  release.Notify();
  q.Stop();  // waits for what was queued
  absl::MutexLock lock(&seen.mu);
  REQUIRE(seen.aborts.size() == 3);
  CHECK(seen.aborts[0] == std::make_pair(int64_t{1}, std::string("one")));
  CHECK(seen.aborts[1] == std::make_pair(int64_t{2}, std::string("two")));
  CHECK(seen.aborts[2] == std::make_pair(int64_t{3}, std::string("three")));
  for (const std::thread::id& id : seen.threads) {
    CHECK(id != std::this_thread::get_id());
    CHECK(id == seen.threads[0]);
  }
}

TEST_CASE("abort queue: nothing is queued after Stop") {
  Seen seen;
  holdfast::AbortQueue q([&](int64_t upto, const std::string& reason) {
    absl::MutexLock lock(&seen.mu);
    seen.aborts.emplace_back(upto, reason);
  });
  q.Queue(4, "before");
  q.Stop();
  q.Queue(5, "after");
  q.Stop();  // a second Stop is harmless
  absl::MutexLock lock(&seen.mu);
  REQUIRE(seen.aborts.size() == 1);
  CHECK(seen.aborts[0].first == 4);
}
