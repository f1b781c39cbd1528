// Membership: who lost whom on the data network (ReportFailureRequest::
// unreachable_slots), triangulated by src/diagnosis/reachability.h.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "src/common/logging.h"
#include "src/control/controller/membership.h"
#include "src/diagnosis/reachability.h"

namespace holdfast::control {

diagnosis::ReachInput Membership::ReachInputLocked(size_t* reporters) const {
  diagnosis::ReachInput in;
  const std::vector<uint64_t>& holders = slots_.holders();
  in.host_of_slot.assign(holders.size(), "");
  for (size_t s = 0; s < holders.size(); ++s) {
    if (holders[s] != 0) in.host_of_slot[s] = members_.at(holders[s]).host;
  }
  std::set<uint64_t> from_ids;
  for (const auto& [from, to] : network_.lost()) {
    auto f = members_.find(from);
    auto t = members_.find(to);
    if (f == members_.end() || t == members_.end() ||
        f->second.state != STATE_ALIVE || t->second.state != STATE_ALIVE ||
        f->second.slot < 0 || t->second.slot < 0) {
      continue;
    }
    in.failed.emplace_back(f->second.slot, t->second.slot);
    from_ids.insert(from);
  }
  *reporters = from_ids.size();
  return in;
}

bool Membership::NoteUnreachableLocked(const Member& reporter,
                                       const ReportFailureRequest& req,
                                       bool force, absl::Time now) {
  // A slot number names the same member as in the report's generation only
  // while the slots have not changed since.
  if (req.generation() >= slots_changed_at_ &&
      req.generation() <= generation_) {
    for (int u : req.unreachable_slots()) {
      const uint64_t target = slots_.holder(u);
      if (target != 0 && target != reporter.id) {
        network_.Lost(reporter.id, target, now);
      }
    }
  }
  size_t reporters = 0;
  const diagnosis::ReachInput in = ReachInputLocked(&reporters);
  // One member's word is not enough to fence anyone, unless the loop
  // bound asks for the best evidence there is.
  if (in.failed.empty() || (!force && reporters < 2)) return false;
  const diagnosis::ReachVerdict v = diagnosis::Triangulate(in);
  if (v.culprits.empty()) {
    if (force) {
      HOLDFAST_LOG_WARN("data network: no culprit from the evidence: {}",
                        v.evidence);
    }
    return false;
  }
  // A tie, and a bad NIC (which rests on the host's other members not
  // being named), may be the first reports of a host cut off: both wait
  // for more words, up to link_settle since the first report.
  const bool unsettled = v.tie || v.rule == diagnosis::ReachRule::kBadNic;
  if (unsettled && !force &&
      now - network_.first_lost() < detection_.link_settle) {
    HOLDFAST_LOG_INFO(
        "data network: {} (waiting up to {} since the first report for "
        "{} before it is acted on)",
        v.evidence, absl::FormatDuration(detection_.link_settle),
        v.tie ? "another host's word" : "reports of that host's others");
    return false;
  }
  if (v.rule != diagnosis::ReachRule::kBadNic) {
    // Its standbys cannot reach the data network either.
    network_.CutOff(in.host_of_slot[static_cast<size_t>(v.culprits[0])]);
  }
  std::vector<uint64_t> ids;
  for (int s : v.culprits) ids.push_back(slots_.holder(s));
  network_.Spend();
  const std::string evidence =
      absl::StrCat(diagnosis::ReachRuleName(v.rule), ": ", v.evidence);
  for (uint64_t id : ids) {
    auto m = members_.find(id);
    if (m == members_.end() || m->second.state != STATE_ALIVE) continue;
    DeclareLocked(m->second, INCIDENT_UNREACHABLE, evidence, now, reporter.id,
                  now);
  }
  return true;
}

}  // namespace holdfast::control
