// The culprit analysis (src/control/diagnosis.h) on hand-made evidence of
// four slots: the trace tails and heartbeats that each fault leaves.
#include "src/control/diagnosis.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace {

using holdfast::DataType;
using holdfast::OpState;
using holdfast::OpType;
using holdfast::TraceRecord;
using holdfast::control::Diagnose;
using holdfast::control::Diagnosis;
using holdfast::control::DiagnosisKind;
using holdfast::control::SlotEvidence;
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
  s.phase = holdfast::control::PHASE_COLLECTIVE;
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
  const Diagnosis d = Diagnose({Gone(0, Liveness::kSilent), Slot(1, 0, 4, 5),
                                Slot(2, 0, 4, 5), Slot(3, 0, 4, 5)});
  CHECK(d.kind == DiagnosisKind::kFrozen);
  CHECK(d.culprits == std::vector<int>{0});
  CHECK(d.victims == std::vector<int>{1, 2, 3});
  CHECK(Mentions(d, "slot 0: no heartbeat (stopped or wedged)"));
}

TEST_CASE("diagnosis: a slot hung in compute never entered the collective") {
  // Slot 3's step thread is stuck in its own code: it heartbeats, answers,
  // computes, and its trace ends at #8 while the others wait in #9.
  SlotEvidence hung = Slot(3, 0, 8);
  hung.phase = holdfast::control::PHASE_COMPUTING;
  const Diagnosis d =
      Diagnose({Slot(0, 0, 8, 9), Slot(1, 0, 8, 9), Slot(2, 0, 8, 9), hung});
  CHECK(d.kind == DiagnosisKind::kComputeHang);
  CHECK(d.culprits == std::vector<int>{3});
  CHECK(d.victims == std::vector<int>{0, 1, 2});
  CHECK(d.coll_seq == 9);
  CHECK(d.op == OpType::kAllReduce);
  CHECK(d.count == 1024);
  CHECK(Mentions(d, "slot 3 is alive (phase PHASE_COMPUTING"));
  CHECK(Mentions(d, "last entered #8"));
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
  // and slot 3 never entered #8.
  SlotEvidence short_tail = Slot(1, 4, 7, 8);
  SlotEvidence hung = Slot(3, 0, 7);
  hung.phase = holdfast::control::PHASE_COMPUTING;
  const Diagnosis d =
      Diagnose({Slot(0, 0, 7, 8), short_tail, Slot(2, 0, 7, 8), hung});
  CHECK(d.kind == DiagnosisKind::kComputeHang);
  CHECK(d.culprits == std::vector<int>{3});
  CHECK(d.coll_seq == 8);
}
