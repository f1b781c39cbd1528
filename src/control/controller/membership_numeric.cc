// Membership's side of numeric anomalies (a NaN or Inf in a step's loss or
// gradients, or a loss spike): which committed step the job rolls back to,
// which data it skips from then on, and which member is suspected of
// silent data corruption (docs/gray-failures.md).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "holdfast/status.h"
#include "src/common/config.h"
#include "src/control/controller/membership.h"

namespace holdfast::control {
namespace {

constexpr size_t kMaxCommitHistory = 64;
constexpr size_t kMaxSkipRanges = 4096;
constexpr size_t kMaxWhatBytes = 256;

std::string RangeText(const DataRange& r) {
  return absl::StrCat("[", r.begin(), ", ", r.end(), ")");
}

bool SameRange(const DataRange& a, const std::pair<int64_t, int64_t>& b) {
  return a.begin() == b.first && a.end() == b.second;
}

absl::Status CheckAnomaly(const Anomaly& a) {
  if (a.step() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("anomaly at step ", a.step(), "; steps count from 1"));
  }
  if (a.kind() != "nan" && a.kind() != "spike") {
    return absl::InvalidArgumentError(absl::StrCat(
        "anomaly kind '", a.kind(), "' is unknown (nan or spike)"));
  }
  if (a.what().size() > kMaxWhatBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("anomaly 'what' of ", a.what().size(),
                     " bytes; the limit is ", kMaxWhatBytes));
  }
  if (a.data().begin() < 0 || a.data().end() < a.data().begin()) {
    return absl::InvalidArgumentError(
        absl::StrCat("anomaly data range ", RangeText(a.data()),
                     " is not a range of non-negative positions"));
  }
  if (a.keep_snapshots() < config::kMinKeepSnapshots ||
      a.keep_snapshots() > config::kMaxKeepSnapshots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "anomaly keep_snapshots ", a.keep_snapshots(), " is outside ",
        config::kMinKeepSnapshots, " to ", config::kMaxKeepSnapshots));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> Membership::ReportAnomalyLocked(Member& reporter,
                                                     const Anomaly& anomaly,
                                                     absl::Time now) {
  HOLDFAST_RETURN_IF_ERROR(CheckAnomaly(anomaly));
  if (reporter.role != ROLE_WORKER) {
    return absl::FailedPreconditionError(
        absl::StrCat("member ", reporter.id, " is a standby; it has no step"));
  }
  if (job_state_ != JOB_RUNNING || finished_workers_ > 0) return false;
  if (!anomaly_.has_value() || anomaly_->generation != generation_) {
    anomaly_ = AnomalyCase{generation_, now, {}};
  }
  anomaly_->reports[reporter.slot] = anomaly;
  int workers = 0;
  for (uint64_t id : slots_) workers += id != 0;
  if (static_cast<int>(anomaly_->reports.size()) >= workers) {
    DecideAnomalyLocked(now);
  }
  return true;
}

void Membership::ScanAnomaliesLocked(absl::Time now) {
  if (!anomaly_.has_value()) return;
  if (anomaly_->generation != generation_) {
    // Another failure opened a generation first; a step that goes wrong
    // again is reported again.
    anomaly_.reset();
    return;
  }
  if (now - anomaly_->since >= detection_.anomaly_settle) {
    DecideAnomalyLocked(now);
  }
}

void Membership::DecideAnomalyLocked(absl::Time now) {
  const AnomalyCase c = std::move(*anomaly_);
  anomaly_.reset();
  if (job_state_ != JOB_RUNNING || finished_workers_ > 0) return;
  // The earliest step reported is where it began; its data and its sources
  // are those of the reports of that step.
  int64_t step = INT64_MAX;
  for (const auto& [slot, a] : c.reports) step = std::min(step, a.step());
  const Anomaly* first = nullptr;
  DataRange data;
  std::vector<int> sources;
  int keep = INT32_MAX;
  for (const auto& [slot, a] : c.reports) {
    keep = std::min(keep, a.keep_snapshots());
    if (a.step() != step) continue;
    if (first == nullptr || (a.local() && !first->local())) first = &a;
    if (data.end() <= data.begin() && a.data().end() > a.data().begin()) {
      data = a.data();
    }
    if (a.local()) sources.push_back(slot);
  }
  // The first step after a rollback went wrong as well: the step restored
  // may itself be poisoned (the update that made it was bad), so the next
  // rollback goes further back.
  if (rollback_generation_ == generation_ && step == rollback_target_ + 1) {
    poisoned_.insert(rollback_target_);
  }
  int64_t target = -1;
  for (size_t i = 0; i < commits_.size() && i < static_cast<size_t>(keep);
       ++i) {
    if (commits_[i] < step && poisoned_.count(commits_[i]) == 0) {
      target = commits_[i];
      break;
    }
  }
  const std::string what = absl::StrCat(
      first->kind() == "nan" ? "a value that is not finite" : "a loss spike",
      " in ", first->what(), " (", first->value(), ") at step ", step, " on ",
      sources.empty()
          ? absl::StrCat("slot(s) ",
                         absl::StrJoin(c.reports, ", ",
                                       [](std::string* out, const auto& r) {
                                         absl::StrAppend(out, r.first);
                                       }))
          : absl::StrCat("slot(s) ", absl::StrJoin(sources, ", "),
                         ", in their own values"),
      data.end() > data.begin() ? absl::StrCat(", data ", RangeText(data))
                                : std::string());
  if (target < 0) {
    EndJobLocked(
        JOB_STOPPED,
        absl::StrCat(what,
                     "; no clean committed step is kept to roll back "
                     "to (the members keep ",
                     keep,
                     " committed snapshots, HOLDFAST_KEEP_SNAPSHOTS; "
                     "unclean: ",
                     poisoned_.empty() ? std::string("none")
                                       : absl::StrJoin(poisoned_, ", "),
                     ")"));
    return;
  }
  // A slot that was the source before, at other data: its hardware, not
  // the data, is suspected. It is replaced, and this data is not skipped.
  std::vector<uint64_t> suspects;
  for (int slot : sources) {
    const uint64_t id = slots_[static_cast<size_t>(slot)];
    if (id == 0) continue;
    auto& seen = nan_sources_[id];
    const bool elsewhere =
        std::any_of(seen.begin(), seen.end(),
                    [&](const auto& r) { return !SameRange(data, r); });
    if (elsewhere) {
      suspects.push_back(id);
    } else {
      seen.emplace_back(data.begin(), data.end());
    }
  }
  const bool skip = suspects.empty() && data.end() > data.begin() &&
                    skip_data_.size() < kMaxSkipRanges;
  if (skip) {
    skip_data_.emplace_back(data.begin(), data.end());
    std::sort(skip_data_.begin(), skip_data_.end());
  }
  // The rollback: the members keep the newest `keep` commits, and after
  // restoring `target` only those of them at or below it.
  size_t dropped = 0;
  while (!commits_.empty() && commits_.front() > target) {
    commits_.pop_front();
    ++dropped;
  }
  const size_t kept = static_cast<size_t>(keep) > dropped
                          ? static_cast<size_t>(keep) - dropped
                          : 1;
  if (commits_.size() > kept) commits_.resize(kept);
  committed_step_ = target;
  rollback_pending_ = true;
  rollback_target_ = target;
  ++rollbacks_;
  const std::string evidence =
      absl::StrCat(what, "; rolled back to step ", target,
                   skip ? absl::StrCat(", data ", RangeText(data), " skipped")
                        : std::string(suspects.empty() ? ", no data skipped"
                                                       : ", data not skipped"));
  const uint64_t named = slots_[static_cast<size_t>(
      sources.empty() ? c.reports.begin()->first : sources.front())];
  Incident inc;
  if (named != 0) {
    inc = MakeIncidentLocked(members_.at(named), INCIDENT_NUMERIC, evidence,
                             c.since, named, now);
  } else {
    inc.set_kind(INCIDENT_NUMERIC);
    inc.set_generation(generation_);
    inc.set_detected_unix_ms(absl::ToUnixMillis(now));
    inc.set_evidence(evidence);
  }
  inc.set_step(step);
  RecordIncidentLocked(std::move(inc));
  if (suspects.empty()) {
    AbortOrder abort;
    abort.set_reason(evidence);
    abort.set_failed_slot(-1);
    OpenGenerationLocked(-1, "", std::move(abort), now);
  }
  for (uint64_t id : suspects) {
    auto m = members_.find(id);
    if (m == members_.end() || m->second.state != STATE_ALIVE) continue;
    DeclareLocked(
        m->second, INCIDENT_CORRUPTION,
        absl::StrCat("slot ", m->second.slot,
                     " was the source of non-finite values at data ",
                     RangeText(data), " after it was at other data before (",
                     absl::StrJoin(nan_sources_[id], ", ",
                                   [](std::string* out, const auto& r) {
                                     absl::StrAppend(out, "[", r.first, ", ",
                                                     r.second, ")");
                                   }),
                     "): suspected of silent data corruption"),
        c.since, id, now);
  }
  rollback_generation_ = generation_;
}

void Membership::NoteCommitLocked(int64_t step) {
  rollback_pending_ = false;
  unreachable_.clear();
  unexplained_rebuilds_ = 0;
  commits_.push_front(step);
  if (commits_.size() > kMaxCommitHistory) commits_.pop_back();
}

void Membership::FillSkipData(
    google::protobuf::RepeatedPtrField<DataRange>* out) const {
  for (const auto& [begin, end] : skip_data_) {
    DataRange* r = out->Add();
    r->set_begin(begin);
    r->set_end(end);
  }
}

}  // namespace holdfast::control
