// The controller's replica checks (silent data corruption at rest,
// docs/gray-failures.md): every slot holds the same replicated registered
// state, and members report a hash of it after some steps
// (StepReport::replica_checks). Once every slot's hash of a step is in,
// they agree, or the slots outside the majority are named: the job rolls
// back to a step where they agreed, before the bit flipped.
//
// Not thread-safe: Membership's mutex guards it.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_REPLICA_LEDGER_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_REPLICA_LEDGER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/control/controller/step_collector.h"

namespace holdfast::control {

class ReplicaLedger {
 public:
  struct Mismatch {
    int64_t step = 0;     // the step whose hashes differ
    int64_t agreed = -1;  // the newest step before it where all agreed
    // The slots whose hash is not the majority's; empty when no hash is
    // held by more than half of the slots (nobody can be named).
    std::vector<int> minority;
    int keep_snapshots = 0;  // the least any slot keeps
    std::string evidence;    // in words
  };

  // Slot `slot`'s hash of its state after `step`, in a world of `world`.
  // A step whose hashes are all in is decided: the agreed step moves on,
  // or the mismatch is returned (once per step).
  std::optional<Mismatch> Note(int slot, int64_t step, uint64_t hash,
                               int keep_snapshots, int world);
  // A new generation restored step `committed`: the steps after it are
  // redone, and the hashes held for them are dropped.
  void Restart(int64_t committed);

 private:
  StepCollector<uint64_t> steps_;
  int64_t agreed_ = -1;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_REPLICA_LEDGER_H_
