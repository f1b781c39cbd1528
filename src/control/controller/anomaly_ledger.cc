#include "src/control/controller/anomaly_ledger.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "src/common/config.h"

namespace holdfast::control {
namespace {

constexpr size_t kMaxCommitHistory = 64;
constexpr size_t kMaxSkipRanges = 4096;
constexpr size_t kMaxWhatBytes = 256;

std::string RangeText(const DataRange& r) {
  return absl::StrCat("[", r.begin(), ", ", r.end(), ")");
}

bool Empty(const DataRange& r) { return r.end() <= r.begin(); }

bool SameRange(const DataRange& a, const std::pair<int64_t, int64_t>& b) {
  return a.begin() == b.first && a.end() == b.second;
}

// "a value that is not finite in loss (nan) at step 7 on slot(s) 1, in
// their own values, data [70, 80)".
std::string What(const Anomaly& first, int64_t step,
                 const std::map<int, Anomaly>& reports,
                 const std::vector<int>& sources, const DataRange& data) {
  if (first.kind() == "replica" || first.kind() == "gradient") {
    return first.what();  // the controller's own words
  }
  return absl::StrCat(
      first.kind() == "nan" ? "a value that is not finite" : "a loss spike",
      " in ", first.what(), " (", first.value(), ") at step ", step, " on ",
      sources.empty()
          ? absl::StrCat("slot(s) ",
                         absl::StrJoin(reports, ", ",
                                       [](std::string* out, const auto& r) {
                                         absl::StrAppend(out, r.first);
                                       }))
          : absl::StrCat("slot(s) ", absl::StrJoin(sources, ", "),
                         ", in their own values"),
      Empty(data) ? std::string() : absl::StrCat(", data ", RangeText(data)));
}

}  // namespace

absl::Status AnomalyLedger::Check(const Anomaly& a) {
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

void AnomalyLedger::Report(int slot, const Anomaly& a, int64_t generation,
                           absl::Time now) {
  if (!open_.has_value() || open_->generation != generation) {
    open_ = Case{generation, now, {}};
  }
  open_->reports[slot] = a;
}

std::optional<AnomalyLedger::Case> AnomalyLedger::TakeReady(
    int64_t generation, int workers, absl::Duration settle, absl::Time now) {
  if (!open_.has_value()) return std::nullopt;
  if (open_->generation != generation) {
    open_.reset();
    return std::nullopt;
  }
  if (static_cast<int>(open_->reports.size()) < workers &&
      now - open_->since < settle) {
    return std::nullopt;
  }
  std::optional<Case> c = std::move(open_);
  open_.reset();
  return c;
}

int64_t AnomalyLedger::CleanTarget(int64_t step, int keep) const {
  for (size_t i = 0; i < commits_.size() && i < static_cast<size_t>(keep);
       ++i) {
    if (commits_[i] < step && poisoned_.count(commits_[i]) == 0) {
      return commits_[i];
    }
  }
  return -1;
}

std::vector<int> AnomalyLedger::Suspects(const std::vector<int>& sources,
                                         const DataRange& data,
                                         const std::vector<uint64_t>& slots) {
  std::vector<int> suspects;
  // Every worker a source: the values came from the state they share (a
  // bad update, a restored step that was unclean), not from one rank.
  const bool every_worker =
      static_cast<size_t>(std::count_if(slots.begin(), slots.end(),
                                        [](uint64_t id) { return id != 0; })) <=
      sources.size();
  for (int slot : sources) {
    const uint64_t id = slots[static_cast<size_t>(slot)];
    if (id == 0 || every_worker) continue;
    auto& seen = nan_sources_[id];
    const bool elsewhere =
        std::any_of(seen.begin(), seen.end(),
                    [&](const auto& r) { return !SameRange(data, r); });
    if (elsewhere) {
      suspects.push_back(slot);
    } else {
      seen.emplace_back(data.begin(), data.end());
    }
  }
  return suspects;
}

std::vector<int> AnomalyLedger::ReplicaSuspects(
    const std::vector<int>& sources, const std::vector<uint64_t>& slots) {
  std::vector<int> suspects;
  for (int slot : sources) {
    const uint64_t id = slots[static_cast<size_t>(slot)];
    if (id == 0) continue;
    if (!replica_sources_.insert(id).second) suspects.push_back(slot);
  }
  return suspects;
}

void AnomalyLedger::TrimCommits(int64_t target, int keep) {
  size_t dropped = 0;
  while (!commits_.empty() && commits_.front() > target) {
    commits_.pop_front();
    ++dropped;
  }
  const size_t kept = static_cast<size_t>(keep) > dropped
                          ? static_cast<size_t>(keep) - dropped
                          : 1;
  if (commits_.size() > kept) commits_.resize(kept);
}

AnomalyLedger::Decision AnomalyLedger::Decide(
    const Case& c, const std::vector<uint64_t>& slots, int64_t generation) {
  Decision d;
  int keep = INT32_MAX;
  std::vector<int> sources;
  const Anomaly& first = Gather(c, &d, &sources, &keep);
  const std::string& kind = first.kind();
  // A replica or gradient check's step came after steps whose checks
  // passed: the commit it rolls back to is not suspect.
  if (kind != "replica" && kind != "gradient" &&
      rollback_generation_ == generation && d.step == rollback_target_ + 1) {
    poisoned_.insert(rollback_target_);
  }
  d.target = CleanTarget(d.step, keep);
  const std::string what = What(first, d.step, c.reports, sources, d.data);
  if (d.target < 0) {
    d.evidence = absl::StrCat(what, NoCleanStepText(keep));
    return d;
  }
  bool data_cause = false;  // a gradient outlier again at the same data
  const std::vector<int> suspects =
      kind == "replica" ? ReplicaSuspects(sources, slots)
      : kind == "gradient"
          ? GradientSuspects(sources, d.step, d.data, slots, &data_cause)
          : Suspects(sources, d.data, slots);
  if (data_cause && Empty(d.data)) {
    d.target = -1;
    d.evidence = absl::StrCat(
        what,
        "; the same slot's norm was far off again when the step was redone, "
        "so its data is the likely cause, and no data position is "
        "registered to skip it (Runtime::RegisterDataPosition)");
    return d;
  }
  d.skip = suspects.empty() && !Empty(d.data) &&
           (kind == "nan" || kind == "spike" || data_cause) &&
           skip_data_.size() < kMaxSkipRanges;
  if (d.skip) {
    skip_data_.emplace_back(d.data.begin(), d.data.end());
    std::sort(skip_data_.begin(), skip_data_.end());
  }
  TrimCommits(d.target, keep);
  rollback_pending_ = true;
  rollback_target_ = d.target;
  ++rollbacks_;
  d.evidence = absl::StrCat(
      what, data_cause ? "; the same again when the step was redone" : "",
      "; rolled back to step ", d.target,
      d.skip ? absl::StrCat(", data ", RangeText(d.data), " skipped")
             : std::string(suspects.empty() ? ", no data skipped"
                                            : ", data not skipped"));
  d.named_slot = !sources.empty()    ? sources.front()
                 : kind == "replica" ? -1
                                     : c.reports.begin()->first;
  for (int slot : suspects) {
    const uint64_t id = slots[static_cast<size_t>(slot)];
    d.suspects.emplace_back(id, SuspectText(kind, slot, d.data, id));
  }
  return d;
}

const Anomaly& AnomalyLedger::Gather(const Case& c, Decision* d,
                                     std::vector<int>* sources, int* keep) {
  // The earliest step reported is where it began; its data and its sources
  // are those of the reports of that step.
  d->step = INT64_MAX;
  for (const auto& [slot, a] : c.reports) d->step = std::min(d->step, a.step());
  const Anomaly* first = nullptr;
  for (const auto& [slot, a] : c.reports) {
    *keep = std::min(*keep, a.keep_snapshots());
    if (a.step() != d->step) continue;
    if (first == nullptr || (a.local() && !first->local())) first = &a;
    if (Empty(d->data) && !Empty(a.data())) d->data = a.data();
    if (a.local()) sources->push_back(slot);
  }
  return *first;
}

std::string AnomalyLedger::NoCleanStepText(int keep) const {
  return absl::StrCat(
      "; no clean committed step is kept to roll back to (the members keep ",
      keep, " committed snapshots, HOLDFAST_KEEP_SNAPSHOTS; unclean: ",
      poisoned_.empty() ? std::string("none") : absl::StrJoin(poisoned_, ", "),
      ")");
}

std::string AnomalyLedger::SuspectText(const std::string& kind, int slot,
                                       const DataRange& data,
                                       uint64_t member) const {
  if (kind == "replica") {
    return absl::StrCat("slot ", slot,
                        "'s replicated state differed from the majority's a "
                        "second time: suspected of silent data corruption");
  }
  if (kind == "gradient") {
    return absl::StrCat("slot ", slot,
                        "'s local gradient norm was far above the other "
                        "slots' at another step before: suspected of silent "
                        "data corruption");
  }
  return absl::StrCat(
      "slot ", slot, " was the source of non-finite values at data ",
      RangeText(data), " after it was at other data before (",
      SourcesText(member), "): suspected of silent data corruption");
}

std::vector<int> AnomalyLedger::GradientSuspects(
    const std::vector<int>& sources, int64_t step, const DataRange& data,
    const std::vector<uint64_t>& slots, bool* data_cause) {
  // Where a step read: its data, or with none registered the step.
  const std::pair<int64_t, int64_t> where =
      Empty(data) ? std::make_pair(step, int64_t{-1})
                  : std::make_pair(data.begin(), data.end());
  std::vector<int> suspects;
  for (int slot : sources) {
    const uint64_t id = slots[static_cast<size_t>(slot)];
    if (id == 0) continue;
    auto& seen = gradient_sources_[id];
    if (seen.empty()) {
      seen.push_back(where);
    } else if (std::all_of(seen.begin(), seen.end(),
                           [&](const auto& w) { return w == where; })) {
      *data_cause = true;  // a flip is gone when the step is redone
      seen.clear();        // and the data, not the member, is to blame
    } else {
      suspects.push_back(slot);
    }
  }
  return suspects;
}

void AnomalyLedger::NoteCommit(int64_t step) {
  rollback_pending_ = false;
  commits_.push_front(step);
  if (commits_.size() > kMaxCommitHistory) commits_.pop_back();
}

void AnomalyLedger::FillSkipData(
    google::protobuf::RepeatedPtrField<DataRange>* out) const {
  for (const auto& [begin, end] : skip_data_) {
    DataRange* r = out->Add();
    r->set_begin(begin);
    r->set_end(end);
  }
}

std::string AnomalyLedger::SourcesText(uint64_t member) const {
  auto it = nan_sources_.find(member);
  if (it == nan_sources_.end()) return "";
  return absl::StrJoin(it->second, ", ", [](std::string* out, const auto& r) {
    absl::StrAppend(out, "[", r.first, ", ", r.second, ")");
  });
}

}  // namespace holdfast::control
