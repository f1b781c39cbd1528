// Membership's side of numeric anomalies: it feeds the reports to the
// ledger (anomaly_ledger.h, where the rules live) and acts on its
// decisions: an incident, a rollback to a new generation, fencing.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "holdfast/status.h"
#include "src/control/controller/membership.h"

namespace holdfast::control {

absl::StatusOr<bool> Membership::ReportAnomalyLocked(Member& reporter,
                                                     const Anomaly& anomaly,
                                                     absl::Time now) {
  HOLDFAST_RETURN_IF_ERROR(AnomalyLedger::Check(anomaly));
  if (reporter.role != ROLE_WORKER) {
    return absl::FailedPreconditionError(
        absl::StrCat("member ", reporter.id, " is a standby; it has no step"));
  }
  if (job_state_ != JOB_RUNNING || finished_workers_ > 0) return false;
  anomalies_.Report(reporter.slot, anomaly, generation_, now);
  ScanAnomaliesLocked(now);
  return true;
}

void Membership::ScanAnomaliesLocked(absl::Time now) {
  int workers = 0;
  for (uint64_t id : slots_) workers += id != 0;
  std::optional<AnomalyLedger::Case> c = anomalies_.TakeReady(
      generation_, workers, detection_.anomaly_settle, now);
  if (c.has_value()) DecideAnomalyLocked(*c, now);
}

void Membership::DecideAnomalyLocked(const AnomalyLedger::Case& c,
                                     absl::Time now) {
  if (job_state_ != JOB_RUNNING || finished_workers_ > 0) return;
  const AnomalyLedger::Decision d = anomalies_.Decide(c, slots_, generation_);
  if (d.target < 0) {
    EndJobLocked(JOB_STOPPED, d.evidence);
    return;
  }
  committed_step_ = d.target;
  const uint64_t named = slots_[static_cast<size_t>(d.named_slot)];
  Incident inc;
  if (named != 0) {
    inc = MakeIncidentLocked(members_.at(named), INCIDENT_NUMERIC, d.evidence,
                             c.since, named, now);
  } else {
    inc.set_kind(INCIDENT_NUMERIC);
    inc.set_generation(generation_);
    inc.set_detected_unix_ms(absl::ToUnixMillis(now));
    inc.set_evidence(d.evidence);
  }
  inc.set_step(d.step);
  RecordIncidentLocked(std::move(inc));
  if (d.suspects.empty()) {
    AbortOrder abort;
    abort.set_reason(d.evidence);
    abort.set_failed_slot(-1);
    OpenGenerationLocked(-1, "", std::move(abort), now);
  }
  for (const auto& [id, why] : d.suspects) {
    auto m = members_.find(id);
    if (m == members_.end() || m->second.state != STATE_ALIVE) continue;
    DeclareLocked(m->second, INCIDENT_CORRUPTION, why, c.since, id, now);
  }
  anomalies_.NoteRollbackGeneration(generation_);
}

void Membership::NoteCommitLocked(int64_t step) {
  unreachable_.clear();
  unexplained_rebuilds_ = 0;
  anomalies_.NoteCommit(step);
}

}  // namespace holdfast::control
