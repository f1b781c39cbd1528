// What the controller knows of the data network (docs/recovery.md's
// network faults): who could not reach whom since the last commit
// (ReportFailureRequest::unreachable_slots, by member id), how many times
// the group was rebuilt since then without naming anyone, and the hosts
// found cut off from it. src/diagnosis/reachability.h judges the edges;
// Membership acts on the verdict.
//
// The rules:
//   - the edges and the rebuilds are spent by a commit (the network
//     carried a step) and by a verdict acted on;
//   - a host cut off stays cut off for the job's life: its standbys take
//     no slot.
//
// Not thread-safe: Membership's mutex guards it.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_NETWORK_EVIDENCE_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_NETWORK_EVIDENCE_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>

#include "absl/time/time.h"

namespace holdfast::control {

class NetworkEvidence {
 public:
  // Member `reporter` could not reach member `target`, reported at `now`.
  void Lost(uint64_t reporter, uint64_t target, absl::Time now) {
    if (lost_.empty()) first_lost_ = now;
    lost_.insert({reporter, target});
  }
  // When the first of lost() was reported.
  absl::Time first_lost() const { return first_lost_; }
  // (reporter, target) pairs since the evidence was last spent.
  const std::set<std::pair<uint64_t, uint64_t>>& lost() const { return lost_; }

  // The group was rebuilt and nobody was named.
  void NoteRebuild() { ++rebuilds_; }
  int rebuilds() const { return rebuilds_; }

  // A step committed, or a verdict was acted on.
  void Spend() {
    lost_.clear();
    rebuilds_ = 0;
  }

  void CutOff(const std::string& host) { cut_hosts_.insert(host); }
  bool IsCutOff(const std::string& host) const {
    return cut_hosts_.count(host) != 0;
  }

 private:
  std::set<std::pair<uint64_t, uint64_t>> lost_;
  absl::Time first_lost_;
  int rebuilds_ = 0;
  std::set<std::string> cut_hosts_;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_NETWORK_EVIDENCE_H_
