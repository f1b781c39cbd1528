// The controller's slot table: which member holds each slot of the world,
// and the standbys waiting for one.
//
// The rules:
//   - a slot is held by one member id or vacant (0); a member holds at
//     most one slot (Membership's Member::slot says which);
//   - the standbys wait in the order they came: the one that waited
//     longest is offered a slot first;
//   - a shrink (Compact) renumbers the holders into a smaller world in
//     their old order, and leaves no slot vacant;
//   - a resize (a resume after a controller restart adopts the world its
//     members name) never drops a held slot.
//
// Not thread-safe: Membership's mutex guards it.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_SLOT_TABLE_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_SLOT_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

namespace holdfast::control {

class SlotTable {
 public:
  // `world_size` vacant slots, no standby.
  explicit SlotTable(int world_size);

  int world_size() const { return static_cast<int>(holders_.size()); }
  // Each slot's member in slot order (0: vacant).
  const std::vector<uint64_t>& holders() const { return holders_; }
  // The member in `slot`, 0 <= slot < world_size() (0: vacant).
  uint64_t holder(int slot) const {
    return holders_[static_cast<size_t>(slot)];
  }
  // False for a slot out of range.
  bool vacant(int slot) const { return vacant_.count(slot) > 0; }
  int vacant_count() const { return static_cast<int>(vacant_.size()); }
  // -1: every slot is held.
  int LowestVacant() const { return vacant_.empty() ? -1 : *vacant_.begin(); }
  // How many slots are held.
  int held() const { return world_size() - vacant_count(); }

  // `id` (not 0) takes `slot`, which must be vacant.
  void Take(int slot, uint64_t id);
  // `slot` is vacant from now on.
  void Vacate(int slot);
  // The world becomes `world_size` slots; false (and nothing changes) if
  // a held slot would fall outside it.
  bool Resize(int world_size);
  // The holders, renumbered in their old order, make up the world. Returns
  // how many slots went.
  int Compact();

  // Standbys: order -> id, the one that waited longest first.
  const std::map<uint64_t, uint64_t>& standbys() const { return standbys_; }
  // `id` waits as the newest standby; returns its place in the order.
  uint64_t AddStandby(uint64_t id);
  void RemoveStandby(uint64_t order) { standbys_.erase(order); }

 private:
  std::vector<uint64_t> holders_;
  std::set<int> vacant_;
  std::map<uint64_t, uint64_t> standbys_;
  uint64_t next_order_ = 0;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_SLOT_TABLE_H_
