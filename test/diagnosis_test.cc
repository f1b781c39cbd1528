// The culprit analysis (src/diagnosis/diagnosis.h) on hand-made evidence of
// four slots: the trace tails and heartbeats that each fault leaves.
#include "src/diagnosis/diagnosis.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace {

using holdfast::DataType;
using holdfast::OpState;
using holdfast::OpType;
using holdfast::TraceRecord;
using holdfast::diagnosis::Diagnose;
using holdfast::diagnosis::Diagnosis;
using holdfast::diagnosis::DiagnosisKind;
using holdfast::diagnosis::SlotEvidence;
using Liveness = SlotEvidence::Liveness;

// An all-reduce record: collective `seq` of `count` floats in `state`.
TraceRecord AllReduce(int64_t seq, OpState state, uint64_t count = 1024) {
  TraceRecord r;
  r.seq = static_cast<uint64_t>(seq);
  r.coll_seq = seq;
  r.op = OpType::kAllReduce;
  r.dtype = DataType::kFloat32;
  r.count = count;
  r.state = state;
  r.started_ns = state == OpState::kEnqueued ? 0 : 1000 + seq;
  return r;
}

// A slot that completed collectives first..last and is in `next` (in
// `state`, if next >= 0).
SlotEvidence Slot(int slot, int64_t first, int64_t last, int64_t next = -1,
                  OpState state = OpState::kStarted) {
  SlotEvidence s;
  s.slot = slot;
  s.answered = true;
  s.phase = holdfast::diagnosis::Phase::kCollective;
  s.step = 12;
  for (int64_t c = first; c <= last; ++c) {
    s.trace.push_back(AllReduce(c, OpState::kCompleted));
  }
  if (next >= 0) s.trace.push_back(AllReduce(next, state));
  s.collective_seq = next >= 0 ? next : last;
  return s;
}

SlotEvidence Gone(int slot, Liveness how) {
  SlotEvidence s;
  s.slot = slot;
  s.liveness = how;
  return s;
}

bool Mentions(const Diagnosis& d, const std::string& text) {
  return d.evidence.find(text) != std::string::npos;
}

}  // namespace

TEST_CASE(
    "diagnosis: a killed slot is the culprit and the waiting ones victims") {
  // Slot 2 was SIGKILLed during collective #7: the others entered #7 and
  // timed out in it.
  const Diagnosis d =
      Diagnose({Slot(0, 0, 6, 7, OpState::kTimedOut),
                Slot(1, 0, 6, 7, OpState::kTimedOut), Gone(2, Liveness::kDead),
                Slot(3, 0, 6, 7, OpState::kTimedOut)});
  CHECK(d.kind == DiagnosisKind::kDead);
  CHECK(d.culprits == std::vector<int>{2});
  CHECK(d.victims == std::vector<int>{0, 1, 3});
  CHECK(d.coll_seq == 7);
  CHECK(d.confidence == 1.0);
  CHECK(Mentions(d, "slot 2: the process is gone"));
}

TEST_CASE("diagnosis: slot 0 frozen is named like any other slot") {
  // SIGSTOP on slot 0: no heartbeat, no trace. Nothing presumes rank 0
  // innocent.
  SlotEvidence stopped = Gone(0, Liveness::kSilent);
  stopped.phase = holdfast::diagnosis::Phase::kCollective;
  stopped.collective_seq = 5;
  stopped.step = 4;
  stopped.still_ms = 900;
  const Diagnosis d =
      Diagnose({stopped, Slot(1, 0, 4, 5), Slot(2, 0, 4, 5), Slot(3, 0, 4, 5)});
  CHECK(d.kind == DiagnosisKind::kFrozen);
  CHECK(d.culprits == std::vector<int>{0});
  CHECK(d.victims == std::vector<int>{1, 2, 3});
  CHECK(Mentions(d, "slot 0: no heartbeat (stopped or wedged)"));
  CHECK(Mentions(d,
                 "slot 0 last seen in collective #5 at step 4 (its step "
                 "still for 900 ms)"));
}

TEST_CASE("diagnosis: a slot hung in compute never entered the collective") {
  // Slot 3's step thread is stuck in its own code: it heartbeats, answers,
  // computes, and its trace ends at #8 while the others wait in #9.
  SlotEvidence hung = Slot(3, 0, 8);
  hung.phase = holdfast::diagnosis::Phase::kComputing;
  hung.still_ms = 3200;
  const Diagnosis d = Diagnose({Slot(0, 0, 8, 9, OpState::kTimedOut),
                                Slot(1, 0, 8, 9), Slot(2, 0, 8, 9), hung});
  CHECK(d.kind == DiagnosisKind::kComputeHang);
  CHECK(d.culprits == std::vector<int>{3});
  CHECK(d.victims == std::vector<int>{0, 1, 2});
  CHECK(d.coll_seq == 9);
  CHECK(d.op == OpType::kAllReduce);
  CHECK(d.count == 1024);
  CHECK(Mentions(d, "slot 3 is alive (phase computing"));
  CHECK(Mentions(d, "last entered #8"));
  CHECK(Mentions(d, "still for 3200 ms"));
}

TEST_CASE(
    "diagnosis: a slot that never entered the collective is not accused "
    "when nobody timed out waiting for it") {
  // Slot 1's op failed at #9 (an injected transport error) and the group
  // was aborted while slot 3 was still computing: slot 3 is innocent.
  SlotEvidence computing = Slot(3, 0, 8);
  computing.phase = holdfast::diagnosis::Phase::kComputing;
  const Diagnosis d = Diagnose(
      {Slot(0, 0, 8, 9, OpState::kAborted), Slot(1, 0, 8, 9, OpState::kFailed),
       Slot(2, 0, 8, 9, OpState::kAborted), computing});
  CHECK(d.kind == DiagnosisKind::kUndecided);
  CHECK(d.culprits.empty());
  CHECK(Mentions(d, "nobody timed out waiting for it"));
  CHECK_FALSE(holdfast::diagnosis::Actionable(d));
}

TEST_CASE("diagnosis: a mismatch names the slot that called differently") {
  SlotEvidence odd = Slot(2, 0, 3);
  odd.trace.push_back(AllReduce(4, OpState::kStarted, /*count=*/2048));
  const Diagnosis d =
      Diagnose({Slot(0, 0, 3, 4), Slot(1, 0, 3, 4), odd, Slot(3, 0, 3, 4)});
  CHECK(d.kind == DiagnosisKind::kMismatch);
  CHECK(d.culprits == std::vector<int>{2});
  CHECK(d.victims == std::vector<int>{0, 1, 3});
  CHECK(d.coll_seq == 4);
  CHECK(Mentions(d, "slots 0, 1, 3 called AllReduce (1024 x float32"));
  CHECK(Mentions(d, "slot 2 called AllReduce (2048 x float32"));
  CHECK(d.confidence > 0.5);
}

TEST_CASE("diagnosis: a mismatch with no majority names every side") {
  SlotEvidence a = Slot(2, 0, 3), b = Slot(3, 0, 3);
  a.trace.push_back(AllReduce(4, OpState::kStarted, 2048));
  b.trace.push_back(AllReduce(4, OpState::kStarted, 2048));
  const Diagnosis d = Diagnose({Slot(0, 0, 3, 4), Slot(1, 0, 3, 4), a, b});
  CHECK(d.kind == DiagnosisKind::kMismatch);
  CHECK(d.culprits == std::vector<int>{0, 1, 2, 3});
  CHECK(d.victims.empty());
  CHECK(d.confidence == 0.5);
  CHECK(Mentions(d, "every side named"));
}

TEST_CASE("diagnosis: slots stuck in a collective their peers completed") {
  // #6 completed on slots 0 and 2 and never on 1 and 3.
  const Diagnosis d = Diagnose(
      {Slot(0, 0, 6), Slot(1, 0, 5, 6), Slot(2, 0, 6), Slot(3, 0, 5, 6)});
  CHECK(d.kind == DiagnosisKind::kStuckInCollective);
  CHECK(d.culprits == std::vector<int>{1, 3});
  CHECK(d.victims == std::vector<int>{0, 2});
  CHECK(d.coll_seq == 6);
  CHECK(Mentions(d, "slots 1, 3 did not complete collective #6"));
  CHECK(Mentions(d, "which slots 0, 2 completed"));
}

TEST_CASE("diagnosis: two faults at once name both culprits") {
  const Diagnosis d = Diagnose({Slot(0, 0, 2, 3), Gone(1, Liveness::kDead),
                                Slot(2, 0, 2, 3), Gone(3, Liveness::kSilent)});
  CHECK(d.kind == DiagnosisKind::kDead);
  CHECK(d.culprits == std::vector<int>{1, 3});
  CHECK(d.victims == std::vector<int>{0, 2});
  CHECK(d.confidence < 1.0);
}

TEST_CASE("diagnosis: traces that agree are undecided and say why") {
  const Diagnosis same =
      Diagnose({Slot(0, 0, 5), Slot(1, 0, 5), Slot(2, 0, 5), Slot(3, 0, 5)});
  CHECK(same.kind == DiagnosisKind::kUndecided);
  CHECK(same.culprits.empty());
  CHECK(same.coll_seq == -1);
  CHECK(Mentions(same, "no collective differs"));
  // A member that heartbeats but gives no trace: nothing to compare.
  SlotEvidence mute = Slot(2, 0, 5);
  mute.answered = false;
  const Diagnosis unsure =
      Diagnose({Slot(0, 0, 5, 6), Slot(1, 0, 5, 6), mute, Slot(3, 0, 5, 6)});
  CHECK(unsure.kind == DiagnosisKind::kUndecided);
  CHECK(unsure.culprits.empty());
  CHECK(Mentions(unsure, "slot 2 heartbeat but gave no trace"));
}

TEST_CASE(
    "diagnosis: ring tails of different lengths are compared where they "
    "overlap") {
  // Slot 1's ring kept #4.. only; the others #0..; all completed #0..#7
  // and slot 3 never entered #8, where slot 1 timed out.
  SlotEvidence short_tail = Slot(1, 4, 7, 8, OpState::kTimedOut);
  SlotEvidence hung = Slot(3, 0, 7);
  hung.phase = holdfast::diagnosis::Phase::kComputing;
  const Diagnosis d =
      Diagnose({Slot(0, 0, 7, 8), short_tail, Slot(2, 0, 7, 8), hung});
  CHECK(d.kind == DiagnosisKind::kComputeHang);
  CHECK(d.culprits == std::vector<int>{3});
  CHECK(d.coll_seq == 8);
}

TEST_CASE(
    "diagnosis: an op that failed on its own is named from the abort "
    "notices and not acted on") {
  // Slot 1's op #16 failed (a transport error); slots 0, 2 and 3 adopted
  // its abort, as their notices say.
  std::vector<SlotEvidence> slots;
  for (int s = 0; s < 4; ++s) {
    slots.push_back(Slot(s, 0, 15, 16, OpState::kFailed));
    if (s != 1) slots.back().blames = 1;
  }
  const Diagnosis d = Diagnose(slots);
  CHECK(d.kind == DiagnosisKind::kOpFailed);
  CHECK(d.culprits == std::vector<int>{1});
  CHECK(d.victims == std::vector<int>{0, 2, 3});
  CHECK(Mentions(d, "slot 1 failed its op on its own"));
  CHECK_FALSE(holdfast::diagnosis::Actionable(d));
  // A slot that blames one that blames another: no single origin.
  slots[3].blames = 0;
  CHECK(Diagnose(slots).kind == DiagnosisKind::kUndecided);
}

TEST_CASE("diagnosis: an abort notice gives its trace tail and its blame") {
  SlotEvidence s;
  s.slot = 2;
  REQUIRE(holdfast::diagnosis::ReadNotice(
      R"({"rank":2,"code":13,"message":"m","peer":1,"trace":[)"
      R"({"seq":4,"generation":0,"coll_seq":4,"op":"AllReduce",)"
      R"("dtype":"float32","count":8,"bytes":32,"state":"failed",)"
      R"("reduce":"sum"}]})",
      &s));
  CHECK(s.answered);
  CHECK(s.blames == 1);
  REQUIRE(s.trace.size() == 1);
  CHECK(s.trace[0].coll_seq == 4);
  CHECK(s.trace[0].op == OpType::kAllReduce);
  CHECK(s.trace[0].state == OpState::kFailed);
  // Malformed: not JSON, no trace, an op of an unknown name.
  SlotEvidence bad;
  CHECK_FALSE(holdfast::diagnosis::ReadNotice("not json", &bad));
  CHECK_FALSE(holdfast::diagnosis::ReadNotice(R"({"peer":1})", &bad));
  CHECK_FALSE(holdfast::diagnosis::ReadNotice(
      R"({"trace":[{"op":"Teleport","dtype":"float32","state":"failed"}]})",
      &bad));
  CHECK_FALSE(bad.answered);
}

TEST_CASE(
    "diagnosis: a rack's loss in a large job names 16 slots and counts the "
    "rest") {
  // 1000 slots silent at once (a rack of a 100k-rank job): the evidence
  // stays a few kilobytes, and the culprits are all there.
  std::vector<SlotEvidence> slots;
  for (int i = 0; i < 1000; ++i) {
    SlotEvidence s = Gone(i, Liveness::kSilent);
    s.phase = holdfast::diagnosis::Phase::kComputing;
    s.step = 7;
    slots.push_back(s);
  }
  slots.push_back(Gone(1000, Liveness::kDead));
  const Diagnosis d = Diagnose(slots);
  CHECK(d.culprits.size() == 1001);
  CHECK(d.evidence.size() < 4096);
  CHECK(Mentions(d, "slot 1000: the process is gone"));
  CHECK(Mentions(d, "slots 0, 1, 2"));
  CHECK(Mentions(d, "15 and 984 more: no heartbeat"));
  CHECK(Mentions(d, "slot 15 last seen computing at step 7, and 984 more"));
}
