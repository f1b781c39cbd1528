// Naming the culprit of an incident from what every member knows: the
// tail of its trace ring, its heartbeat, whether it is alive. A pure
// function of its input (no clock, no I/O, no wire types), so it runs the
// same online in the controller and offline on saved dumps (docs/design.md,
// diagnosis).
//
// The analysis finds the lowest collective sequence number at which the
// slots differ and names:
//   - slots that never entered it: dead (the process is gone), frozen (no
//     heartbeat), or hung in compute (alive, answering, not in it);
//   - slots that entered it with another signature: a mismatch, every
//     side named;
//   - slots stuck inside it while their peers completed it: a link or
//     peer problem;
//   - when no collective differs: the slot whose own op failed, when
//     every other slot's abort names it as the cause;
// and every other slot as a victim. Where the evidence does not decide,
// the verdict is "undecided" with the reason. No slot is presumed
// innocent for its number.
#ifndef HOLDFAST_SRC_DIAGNOSIS_DIAGNOSIS_H_
#define HOLDFAST_SRC_DIAGNOSIS_DIAGNOSIS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "holdfast/trace.h"
#include "holdfast/types.h"

namespace holdfast::diagnosis {

// What a member said it was doing in its last heartbeat. The values are
// the wire's (holdfast.control.Phase), which the controller converts.
enum class Phase {
  kUnspecified = 0,
  kIdle = 1,
  kComputing = 2,
  kCollective = 3,  // inside collective number collective_seq
  kCheckpointing = 4,
  kRecovering = 5,
};

// "idle", "computing", "collective", "checkpointing", "recovering"; "-"
// for unspecified.
const char* PhaseName(Phase phase);

// What the controller knows of one slot at an incident.
struct SlotEvidence {
  int slot = -1;
  enum class Liveness {
    kAlive,   // heartbeating
    kSilent,  // alive as a process as far as anyone knows, no heartbeat
    kDead,    // its process is gone (its stream broke, or it was reaped)
  };
  Liveness liveness = Liveness::kAlive;
  // Whether it gave its trace tail (a silent or dead member cannot).
  bool answered = false;
  // Its last heartbeat's phase and step, and the collective it said it was
  // in (Phase::kCollective) or last entered; -1 if none.
  Phase phase = Phase::kUnspecified;
  int64_t step = -1;
  int64_t collective_seq = -1;
  // How long its step had not advanced (its last progress), as of the
  // verdict or its fence; -1 if unknown.
  int64_t still_ms = -1;
  // The tail of its trace ring for the generation of the incident: its
  // collectives (Send/Recv records are ignored), in any order.
  std::vector<TraceRecord> trace;
  // The slot its abort names as the cause (it adopted that slot's abort),
  // or -1: it failed on its own, or did not say.
  int blames = -1;
};

enum class DiagnosisKind {
  kUndecided,
  kDead,               // a culprit's process is gone
  kFrozen,             // a culprit stopped heartbeating (stopped, or wedged)
  kComputeHang,        // a culprit is alive but never entered the collective
  kMismatch,           // the slots entered the collective with different calls
  kStuckInCollective,  // some slots completed it, the culprits did not
  kOpFailed,           // a culprit's own op failed; the others adopted it
};

const char* DiagnosisKindName(DiagnosisKind kind);

struct Diagnosis {
  DiagnosisKind kind = DiagnosisKind::kUndecided;
  std::vector<int> culprits;  // ascending
  std::vector<int> victims;   // ascending: every other slot
  // The collective where the slots differ (-1 when none does).
  int64_t coll_seq = -1;
  OpType op = OpType::kAllReduce;
  uint64_t count = 0;
  DataType dtype = DataType::kFloat32;
  // The evidence in words, or why it is undecided.
  std::string evidence;
  // 0 to 1: 1 for a process known gone, less where the verdict rests on
  // the absence of a heartbeat or on the traces alone.
  double confidence = 0;
};

// The verdict for one incident. `slots` lists every slot of the
// generation once, in any order.
Diagnosis Diagnose(const std::vector<SlotEvidence>& slots);

// Fills `s`'s trace from an abort notice (src/store/keys.h, AbortNotice)
// and marks it answered. False, leaving `s` as it was, for a notice that
// does not parse.
bool ReadNotice(const std::string& notice, SlotEvidence* s);

// Whether the verdict is sure enough to fence its culprits: a process gone
// or silent, a hang in compute, or a mismatch with a majority call. A
// slot stuck in a collective its peers completed is not acted on (the
// fault may be the link, or the peer), nor is an undecided verdict.
bool Actionable(const Diagnosis& d);

}  // namespace holdfast::diagnosis

#endif  // HOLDFAST_SRC_DIAGNOSIS_DIAGNOSIS_H_
