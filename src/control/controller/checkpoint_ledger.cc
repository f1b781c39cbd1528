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
  if (static_cast<size_t>(slot) >= a.slots.size() || a.slots[slot]) {
    return false;
  }
  a.slots[static_cast<size_t>(slot)] = true;
  ++a.count;
  int64_t newest = -1;
  for (const auto& [s, acks] : acks_) {
    if (acks.count == world) newest = s;
  }
  if (newest <= committed_) return false;
  committed_ = newest;
  acks_.erase(acks_.begin(), acks_.upper_bound(newest));
  return true;
}

void CheckpointLedger::Restore(int64_t step) {
  committed_ = step;
  acks_.clear();
}

}  // namespace holdfast::control
