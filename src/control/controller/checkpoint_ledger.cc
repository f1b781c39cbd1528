#include "src/control/controller/checkpoint_ledger.h"

#include <cstddef>

namespace holdfast::control {

bool CheckpointLedger::Ack(int slot, int64_t step, int world) {
  if (step <= committed_ || slot < 0 || slot >= world) return false;
  auto [it, inserted] = acks_.try_emplace(step);
  if (inserted) {
    it->second.slots.assign(static_cast<size_t>(world), false);
    // Bound the ledger: the oldest uncommitted steps go first.
    while (static_cast<int64_t>(acks_.size()) > max_pending_steps_) {
      acks_.erase(acks_.begin());
    }
    it = acks_.find(step);
    if (it == acks_.end()) return false;
  }
  StepAcks& a = it->second;
  const auto i = static_cast<size_t>(slot);
  if (i >= a.slots.size() || a.slots[i]) return false;
  a.slots[i] = true;
  // Only this step can have become complete: the world is the same for
  // every step held (a new generation drops them), and each earlier ack
  // was checked when it came. It is after the committed step (above).
  if (++a.count < world) return false;
  committed_ = step;
  acks_.erase(acks_.begin(), acks_.upper_bound(step));
  return true;
}

void CheckpointLedger::Restore(int64_t step) {
  committed_ = step;
  acks_.clear();
}

}  // namespace holdfast::control
