// The controller's incidents, for Status: numbered from 1 in the order
// they were recorded, the newest `max` kept (the oldest drop), each with
// the verdict on its generation once there is one.
//
// Not thread-safe: Membership's mutex guards it.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_INCIDENT_LOG_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_INCIDENT_LOG_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>

#include "src/control/wire/controller.pb.h"

namespace holdfast::control {

class IncidentLog {
 public:
  explicit IncidentLog(size_t max) : max_(max) {}

  // Numbers `incident` and keeps it; the reference stays valid until it
  // drops out.
  Incident& Add(Incident incident) {
    incident.set_id(++total_);
    kept_.push_back(std::move(incident));
    while (kept_.size() > std::max<size_t>(max_, 1)) kept_.pop_front();
    return kept_.back();
  }
  // Incidents recorded, those dropped included.
  uint64_t total() const { return total_; }
  // Generation `generation`'s incidents without a verdict get `v`.
  void SetVerdict(int64_t generation, const Verdict& v) {
    for (Incident& i : kept_) {
      if (i.generation() == generation && !i.has_diagnosis()) {
        *i.mutable_diagnosis() = v;
      }
    }
  }
  // The newest `n` (fewer if fewer are kept), oldest first.
  template <typename Out>
  void Newest(int n, Out* out) const {
    const size_t k =
        std::min(kept_.size(), static_cast<size_t>(std::max(0, n)));
    for (auto it = kept_.end() - static_cast<std::ptrdiff_t>(k);
         it != kept_.end(); ++it) {
      *out->Add() = *it;
    }
  }

 private:
  const size_t max_;
  std::deque<Incident> kept_;
  uint64_t total_ = 0;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_INCIDENT_LOG_H_
