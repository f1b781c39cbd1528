// StepReporter's rules (src/runtime/step_reporter.h) on made-up traces:
// no job, no communicator.
#include "src/runtime/step_reporter.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace {

using holdfast::OpState;
using holdfast::OpType;
using holdfast::TraceRecord;

TraceRecord Op(uint64_t seq, OpType op, OpState state, int64_t enqueued,
               int64_t started, int64_t ended, int64_t coll_seq = -1) {
  TraceRecord r;
  r.seq = seq;
  r.op = op;
  r.state = state;
  r.enqueued_ns = enqueued;
  r.started_ns = started;
  r.ended_ns = ended;
  r.coll_seq = coll_seq;
  return r;
}

}  // namespace

TEST_CASE(
    "step reporter: a step counts the collectives completed since the last "
    "report, and the arrival of those it issued") {
  const int64_t start = 1000;  // the step's start
  const std::vector<TraceRecord> trace = {
      // Counted by the last report.
      Op(0, OpType::kAllReduce, OpState::kCompleted, 900, 950, 1100),
      // Not a collective.
      Op(1, OpType::kSend, OpState::kCompleted, 1100, 1100, 1900),
      Op(2, OpType::kAllReduce, OpState::kCompleted, 1200, 1300, 1700),
      Op(3, OpType::kBroadcast, OpState::kCompleted, 1600, 1700, 1800),
      // Not completed.
      Op(4, OpType::kAllReduce, OpState::kStarted, 1700, 1800, 0),
      // Issued before the step began: inside counts, arrival not.
      Op(5, OpType::kAllGather, OpState::kCompleted, 800, 1800, 2000),
  };
  holdfast::CollectiveTimes t = holdfast::TimeCollectives(trace, 1, start);
  CHECK(t.inside == absl::Nanoseconds(400 + 100 + 200));
  CHECK(t.arrival == absl::Nanoseconds((200 + 600) / 2));
  CHECK(t.next_seq == 6);
  // Nothing new since: nothing counted, the place kept.
  t = holdfast::TimeCollectives(trace, 6, start);
  CHECK(t.inside == absl::ZeroDuration());
  CHECK(t.arrival == absl::ZeroDuration());
  CHECK(t.next_seq == 6);
}

TEST_CASE(
    "step reporter: time the process was paused inside a collective is not "
    "time spent waiting there") {
  // Paused 1250-1450 (inside op 2, 1300-1700: 150 of it) and 1750-1900
  // (inside op 3, 1700-1800: 50 of it; the rest between the ops).
  const std::deque<holdfast::Pause> pauses = {
      {100, 200}, {1250, 1450}, {1750, 1900}};
  CHECK(holdfast::PausedWithin(pauses, 1300, 1700) == 150);
  CHECK(holdfast::PausedWithin(pauses, 1700, 1800) == 50);
  CHECK(holdfast::PausedWithin(pauses, 0, 5000) == 100 + 200 + 150);
  CHECK(holdfast::PausedWithin(pauses, 200, 1250) == 0);
  CHECK(holdfast::PausedWithin(pauses, 1800, 1700) == 0);
  const std::vector<TraceRecord> trace = {
      Op(2, OpType::kAllReduce, OpState::kCompleted, 1200, 1300, 1700),
      Op(3, OpType::kBroadcast, OpState::kCompleted, 1600, 1700, 1800),
  };
  const holdfast::CollectiveTimes t =
      holdfast::TimeCollectives(trace, 2, 1000, [&](int64_t from, int64_t to) {
        return holdfast::PausedWithin(pauses, from, to);
      });
  CHECK(t.inside == absl::Nanoseconds(400 - 150 + 100 - 50));
  CHECK(t.arrival == absl::Nanoseconds((200 + 600) / 2));
}

TEST_CASE(
    "step reporter: the collective a member is inside is the newest one "
    "started and not ended") {
  std::vector<TraceRecord> trace = {
      Op(0, OpType::kAllReduce, OpState::kCompleted, 1, 2, 3, 6),
      Op(1, OpType::kAllReduce, OpState::kStarted, 4, 5, 0, 7),
  };
  CHECK(holdfast::CollectiveInside(trace) == 7);
  // One enqueued behind it has not started: still inside 7.
  trace.push_back(Op(2, OpType::kAllReduce, OpState::kEnqueued, 6, 0, 0, 8));
  trace.push_back(Op(3, OpType::kRecv, OpState::kStarted, 6, 7, 0));
  CHECK(holdfast::CollectiveInside(trace) == 7);
  trace[1].state = OpState::kCompleted;
  CHECK(holdfast::CollectiveInside(trace) == -1);
  CHECK(holdfast::CollectiveInside({}) == -1);
}

TEST_CASE(
    "step reporter: the peers with the most retransmissions go, in slot "
    "order when all fit") {
  const std::vector<int64_t> all = {0, 5, 0, 9, 2};
  using Counts = std::vector<std::pair<int, int64_t>>;
  CHECK(holdfast::MostRetransmits(all, 2) == Counts{{3, 9}, {1, 5}});
  CHECK(holdfast::MostRetransmits(all, 16) == Counts{{1, 5}, {3, 9}, {4, 2}});
  CHECK(holdfast::MostRetransmits({0, 0}, 16).empty());
}
