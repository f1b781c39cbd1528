#include "src/control/controller/slot_table.h"

#include <cstddef>
#include <utility>

namespace holdfast::control {

SlotTable::SlotTable(int world_size)
    : holders_(static_cast<size_t>(world_size), 0) {
  for (int s = 0; s < world_size; ++s) vacant_.insert(vacant_.end(), s);
}

void SlotTable::Take(int slot, uint64_t id) {
  holders_[static_cast<size_t>(slot)] = id;
  vacant_.erase(slot);
}

void SlotTable::Vacate(int slot) {
  holders_[static_cast<size_t>(slot)] = 0;
  vacant_.insert(slot);
}

bool SlotTable::Resize(int world_size) {
  for (size_t s = static_cast<size_t>(world_size); s < holders_.size(); ++s) {
    if (holders_[s] != 0) return false;
  }
  holders_.resize(static_cast<size_t>(world_size), 0);
  vacant_.clear();
  for (int s = 0; s < world_size; ++s) {
    if (holders_[static_cast<size_t>(s)] == 0) vacant_.insert(s);
  }
  return true;
}

int SlotTable::Compact() {
  std::vector<uint64_t> survivors;
  for (uint64_t id : holders_) {
    if (id != 0) survivors.push_back(id);
  }
  const int removed = static_cast<int>(holders_.size() - survivors.size());
  holders_ = std::move(survivors);
  vacant_.clear();
  return removed;
}

uint64_t SlotTable::AddStandby(uint64_t id) {
  const uint64_t order = next_order_++;
  standbys_[order] = id;
  return order;
}

}  // namespace holdfast::control
