// The controller's checkpoint ledger: which slots of the current
// generation hold their piece of each step, and the committed step.
//
// The rules:
//   - a step commits once every slot of the generation acked it; the
//     committed step is the newest such step, and it never moves back but
//     by a rollback (Restore);
//   - an ack of a step at or before the committed one changes nothing;
//   - a new generation forgets the acks: its members ack again, in the
//     world they have now;
//   - at most `max_pending_steps` uncommitted steps are held: the oldest go
//     first.
//
// Not thread-safe: Membership's mutex guards it.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_CHECKPOINT_LEDGER_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_CHECKPOINT_LEDGER_H_

#include <cstdint>
#include <map>
#include <vector>

namespace holdfast::control {

class CheckpointLedger {
 public:
  explicit CheckpointLedger(int64_t max_pending_steps)
      : max_pending_steps_(max_pending_steps) {}

  // -1: none yet.
  int64_t committed() const { return committed_; }
  // Slot `slot` (of `world`, 0 <= slot < world) holds its piece of `step`.
  // True when that committed a step newer than the committed one.
  bool Ack(int slot, int64_t step, int world);
  // A new generation: the acks are dropped.
  void NewGeneration() { acks_.clear(); }
  // A rollback restored `step` (a numeric anomaly): it is the committed
  // step now, and the acks are dropped.
  void Restore(int64_t step);

 private:
  struct StepAcks {
    std::vector<bool> slots;
    int count = 0;
  };
  const int64_t max_pending_steps_;
  std::map<int64_t, StepAcks> acks_;  // by step, uncommitted only
  int64_t committed_ = -1;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_CHECKPOINT_LEDGER_H_
