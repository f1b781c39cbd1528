#include "src/trace/trace_ring.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <thread>

using holdfast::DataType;
using holdfast::OpState;
using holdfast::OpType;
using holdfast::TraceRecord;
using holdfast::trace::TraceRing;

namespace {
TraceRecord Rec(uint64_t seq) {
  TraceRecord r;
  r.seq = seq;
  r.generation = 3;
  r.coll_seq = static_cast<int64_t>(seq);
  r.op = OpType::kBroadcast;
  r.dtype = DataType::kBFloat16;
  r.peer = 2;
  r.count = 10 + seq;
  r.bytes = 2 * (10 + seq);
  r.enqueued_ns = 100 + static_cast<int64_t>(seq);
  return r;
}
}  // namespace

TEST_CASE("trace ring records every transition of an op") {
  TraceRing ring(8);
  ring.Begin(Rec(0));
  ring.Transition(0, OpState::kStarted, 150);
  ring.Transition(0, OpState::kTimedOut, 900, 4);
  auto snap = ring.Snapshot();
  REQUIRE(snap.size() == 1);
  const TraceRecord& r = snap[0];
  CHECK(r.seq == 0);
  CHECK(r.generation == 3);
  CHECK(r.op == OpType::kBroadcast);
  CHECK(r.dtype == DataType::kBFloat16);
  CHECK(r.peer == 2);
  CHECK(r.count == 10);
  CHECK(r.bytes == 20);
  CHECK(r.state == OpState::kTimedOut);
  CHECK(r.enqueued_ns == 100);
  CHECK(r.started_ns == 150);
  CHECK(r.ended_ns == 900);
  CHECK(r.status_code == 4);
}

TEST_CASE("trace ring keeps the newest capacity records oldest first") {
  TraceRing ring(4);
  for (uint64_t s = 0; s < 10; ++s) ring.Begin(Rec(s));
  auto snap = ring.Snapshot();
  REQUIRE(snap.size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(snap[i].seq == 6 + i);
  // A transition for an overwritten op must not touch its slot's new owner.
  ring.Transition(2, OpState::kCompleted, 5000);
  for (const auto& r : ring.Snapshot()) CHECK(r.state == OpState::kEnqueued);
}

TEST_CASE("trace ring snapshot is consistent under a concurrent writer") {
  TraceRing ring(16);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t s = 0; !stop.load(); ++s) {
      TraceRecord r = Rec(s);
      ring.Begin(r);
      ring.Transition(s, OpState::kStarted, r.enqueued_ns + 1);
      ring.Transition(s, OpState::kCompleted, r.enqueued_ns + 2);
    }
  });
  for (int i = 0; i < 2000; ++i) {
    for (const auto& r : ring.Snapshot()) {
      // Fields written together must be seen together.
      REQUIRE(r.count == 10 + r.seq);
      REQUIRE(r.bytes == 2 * r.count);
      REQUIRE(r.enqueued_ns == 100 + static_cast<int64_t>(r.seq));
    }
  }
  stop = true;
  writer.join();
}

TEST_CASE("trace JSON follows the documented schema") {
  TraceRing ring(4);
  ring.Begin(Rec(0));
  ring.Transition(0, OpState::kStarted, 150);
  ring.Transition(0, OpState::kCompleted, 170);
  auto doc = nlohmann::json::parse(
      holdfast::trace::ToJson(ring.Snapshot(), 1, 4, 3, 1000, 2000, "why"));
  CHECK(doc["schema"] == "holdfast.trace.v1");
  CHECK(doc["rank"] == 1);
  CHECK(doc["size"] == 4);
  CHECK(doc["generation"] == 3);
  CHECK(doc["abort_reason"] == "why");
  CHECK(doc["clock"]["mono_ns"] == 1000);
  REQUIRE(doc["ops"].size() == 1);
  auto op = doc["ops"][0];
  CHECK(op["op"] == "Broadcast");
  CHECK(op["root"] == 2);
  CHECK(op["dtype"] == "bfloat16");
  CHECK(op["state"] == "completed");
  CHECK(op["status"] == "OK");
  CHECK(op["ended_ns"] == 170);
  CHECK(!op.contains("peer"));
  CHECK(!op.contains("tag"));
  // A Send: its peer and tag instead of a root.
  TraceRecord send = Rec(1);
  send.op = OpType::kSend;
  send.tag = 7;
  ring.Begin(send);
  doc = nlohmann::json::parse(
      holdfast::trace::ToJson(ring.Snapshot(), 1, 4, 3, 1000, 2000, "why"));
  REQUIRE(doc["ops"].size() == 2);
  op = doc["ops"][1];
  CHECK(op["op"] == "Send");
  CHECK(op["peer"] == 2);
  CHECK(op["tag"] == 7);
  CHECK(!op.contains("root"));
}
