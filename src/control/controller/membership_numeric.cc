// Membership's side of numeric anomalies: it feeds the reports to the
// ledger (anomaly_ledger.h, where the rules live) and acts on its
// decisions: an incident, a rollback to a new generation, fencing.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "holdfast/status.h"
#include "src/common/config.h"
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
  if (anomaly.has_local_norm()) {
    // The norms may name a slot whose flipped bit the all-reduce spread.
    LocalNorm n;
    n.set_generation(generation_);
    n.set_step(anomaly.step());
    n.set_norm(anomaly.local_norm());
    n.set_keep_snapshots(anomaly.keep_snapshots());
    *n.mutable_data() = anomaly.data();
    if (NoteLocalNormLocked(reporter, n, now)) return true;
  }
  anomalies_.Report(reporter.slot, anomaly, generation_, now);
  ScanAnomaliesLocked(now);
  return true;
}

void Membership::ScanAnomaliesLocked(absl::Time now) {
  int workers = 0;
  workers += slots_.held();
  std::optional<AnomalyLedger::Case> c = anomalies_.TakeReady(
      generation_, workers, detection_.anomaly_settle, now);
  if (c.has_value()) DecideAnomalyLocked(*c, now);
}

void Membership::DecideAnomalyLocked(const AnomalyLedger::Case& c,
                                     absl::Time now) {
  if (job_state_ != JOB_RUNNING || finished_workers_ > 0) return;
  const AnomalyLedger::Decision d =
      anomalies_.Decide(c, slots_.holders(), generation_);
  if (d.target < 0) {
    EndJobLocked(JOB_STOPPED, d.evidence);
    return;
  }
  checkpoints_.Restore(d.target);
  const uint64_t named = d.named_slot >= 0 ? slots_.holder(d.named_slot) : 0;
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
    OpenGenerationLocked(-1, "", "", std::move(abort), now);
  }
  for (const auto& [id, why] : d.suspects) {
    auto m = members_.find(id);
    if (m == members_.end() || m->second.state != STATE_ALIVE) continue;
    DeclareLocked(m->second, INCIDENT_CORRUPTION, why, c.since, id, now);
  }
  anomalies_.NoteRollbackGeneration(generation_);
}

void Membership::NoteReplicaChecksLocked(const Member& m, const StepReport& r,
                                         absl::Time now) {
  if (m.role != ROLE_WORKER || m.slot < 0 || job_state_ != JOB_RUNNING ||
      finished_workers_ > 0) {
    return;
  }
  for (const ReplicaCheck& check : r.replica_checks()) {
    if (check.generation() != generation_ || check.step() < 1) continue;
    std::optional<ReplicaLedger::Mismatch> mm = replicas_.Note(
        m.slot, check.step(), check.hash(),
        std::clamp(check.keep_snapshots(), config::kMinKeepSnapshots,
                   config::kMaxKeepSnapshots),
        slots_.world_size());
    if (!mm.has_value()) continue;
    // A case of its own: the slots outside the majority are its sources;
    // with no majority every slot reports, and none is named.
    AnomalyLedger::Case c{generation_, now, {}};
    Anomaly a;
    a.set_step(std::max<int64_t>(mm->agreed + 1, 1));
    a.set_kind("replica");
    a.set_what(mm->evidence);
    a.set_keep_snapshots(mm->keep_snapshots);
    a.set_local(true);
    for (int slot : mm->minority) c.reports[slot] = a;
    if (c.reports.empty()) {
      a.set_local(false);
      for (int slot = 0; slot < slots_.world_size(); ++slot)
        c.reports[slot] = a;
    }
    DecideAnomalyLocked(c, now);
    return;  // the rollback opened the next generation
  }
}

void Membership::NoteLocalNormsLocked(const Member& m, const StepReport& r,
                                      absl::Time now) {
  for (const LocalNorm& n : r.local_norms()) {
    if (NoteLocalNormLocked(m, n, now)) return;  // a new generation
  }
}

bool Membership::NoteLocalNormLocked(const Member& m, const LocalNorm& n,
                                     absl::Time now) {
  const double factor = detection_.gradient_outlier_factor;
  if (factor <= 0 || m.role != ROLE_WORKER || m.slot < 0 ||
      job_state_ != JOB_RUNNING || finished_workers_ > 0 ||
      n.generation() != generation_ || n.step() <= checkpoints_.committed() ||
      !std::isfinite(n.norm()) || n.norm() < 0) {
    return false;
  }
  LocalNorm clamped = n;
  clamped.set_keep_snapshots(std::clamp(n.keep_snapshots(),
                                        config::kMinKeepSnapshots,
                                        config::kMaxKeepSnapshots));
  std::optional<GradientLedger::Outlier> o =
      norms_.Note(m.slot, clamped, slots_.world_size(), factor);
  if (!o.has_value()) return false;
  // A case of its own: the outliers are its sources.
  AnomalyLedger::Case c{generation_, now, {}};
  for (int slot : o->slots) {
    Anomaly a;
    a.set_step(o->step);
    a.set_kind("gradient");
    a.set_what(o->evidence);
    a.set_keep_snapshots(o->keep_snapshots);
    a.set_local(true);
    *a.mutable_data() = o->data[slot];
    c.reports[slot] = a;
  }
  DecideAnomalyLocked(c, now);
  return true;
}

}  // namespace holdfast::control
