// The runtime's numeric checks: NaN, Inf and loss spikes in a step, the
// report that makes the controller roll the job back, and the data
// position that moves past the data the job skips (docs/gray-failures.md).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "holdfast/status.h"
#include "src/common/logging.h"
#include "src/runtime/fault_points.h"
#include "src/runtime/runtime_impl.h"

namespace holdfast {
namespace {

// How long a member that found an anomaly waits for the controller's
// rollback (it decides within DetectionOptions::anomaly_settle) before it
// recovers the ordinary way.
constexpr absl::Duration kRollbackWait = absl::Seconds(10);

double Median(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(mid), v.end());
  return v[mid];
}

}  // namespace

absl::Status RuntimeImpl::RegisterDataPosition(const std::string& name,
                                               int64_t* position) {
  if (position == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterDataPosition('", name, "'): position is null"));
  }
  if (data_position_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("RegisterDataPosition('", name,
                     "'): a data position is registered already"));
  }
  if (*position < 0) {
    return absl::InvalidArgumentError(absl::StrCat("RegisterDataPosition('",
                                                   name, "'): position ",
                                                   *position, " is negative"));
  }
  HOLDFAST_RETURN_IF_ERROR(RegisterState(name, position, sizeof(*position)));
  data_position_ = position;
  return absl::OkStatus();
}

bool RuntimeImpl::CheckFinite(absl::string_view what, float* data,
                              size_t count) {
  if (count > 0 && InjectNanNow()) {
    data[0] = std::numeric_limits<float>::quiet_NaN();
    HOLDFAST_LOG_WARN("runtime: slot {}: {} made NaN at step {} (injected)",
                      slot(), std::string(what), step_now_.load());
  }
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(data[i])) {
      ReportNonFinite(what);
      return false;
    }
  }
  return true;
}

void RuntimeImpl::ReportNonFinite(absl::string_view what) {
  absl::MutexLock lock(&local_mu_);
  if (!local_nonfinite_.has_value()) local_nonfinite_ = std::string(what);
}

bool RuntimeImpl::InjectNanNow() {
  return faults_->FiresAt(fault::Kind::kNan, slot(), step_now_.load());
}

namespace runtime_internal {

bool NanFaultFiresNow(Runtime& rt) {
  // Runtime::Create makes every Runtime.
  return static_cast<RuntimeImpl&>(rt).InjectNanNow();
}

}  // namespace runtime_internal

std::optional<control::Anomaly> RuntimeImpl::CheckNumbers(
    const NumericChecks& checks, int64_t step,
    const std::map<std::string, double>& metrics) {
  control::Anomaly a;
  a.set_step(step);
  a.set_keep_snapshots(options_.keep_snapshots);
  if (data_position_ != nullptr) {
    a.mutable_data()->set_begin(step_data_begin_);
    a.mutable_data()->set_end(std::max(step_data_begin_, *data_position_));
  }
  {
    absl::MutexLock lock(&local_mu_);
    if (local_nonfinite_.has_value()) {
      a.set_kind("nan");
      a.set_what(*local_nonfinite_);
      a.set_value(std::numeric_limits<double>::quiet_NaN());
      a.set_local(true);
      local_nonfinite_.reset();
      return a;
    }
  }
  if (checks.check_finite) {
    for (const std::string& name : checks.metrics) {
      auto it = metrics.find(name);
      if (it == metrics.end() || std::isfinite(it->second)) continue;
      a.set_kind("nan");
      a.set_what(name);
      a.set_value(it->second);
      return a;
    }
  }
  auto loss = metrics.find("loss");
  if (checks.spike_factor <= 0 || loss == metrics.end() ||
      !std::isfinite(loss->second)) {
    return std::nullopt;
  }
  if (static_cast<int>(losses_.size()) >= checks.spike_warmup) {
    const double median =
        Median(std::vector<double>(losses_.begin(), losses_.end()));
    if (median > 0 && loss->second > checks.spike_factor * median) {
      a.set_kind("spike");
      a.set_what(absl::StrCat("loss (", checks.spike_factor,
                              " x the running median ", median, ")"));
      a.set_value(loss->second);
      return a;
    }
  }
  losses_.push_back(loss->second);
  while (static_cast<int>(losses_.size()) > std::max(1, checks.spike_window)) {
    losses_.pop_front();
  }
  return std::nullopt;
}

absl::Status RuntimeImpl::ReportAnomaly(const control::Anomaly& anomaly) {
  // The live state is past the anomaly; only a committed step is good.
  progress_.live_step = -1;
  const int64_t gen = CommGeneration();
  const std::string what = absl::StrCat(
      "numeric anomaly at step ", anomaly.step(), ": ", anomaly.kind(), " in ",
      anomaly.what(), anomaly.local() ? " (this slot's own values)" : "",
      anomaly.data().end() > anomaly.data().begin()
          ? absl::StrCat(", data [", anomaly.data().begin(), ", ",
                         anomaly.data().end(), ")")
          : std::string());
  HOLDFAST_LOG_WARN("runtime: slot {}: {}; the controller rolls the job back",
                    slot(), what);
  absl::StatusOr<bool> taken = member_->ReportAnomaly(anomaly, gen);
  if (taken.ok() && *taken) {
    AwaitGeneration(gen, absl::Now() + kRollbackWait);
  } else {
    HOLDFAST_LOG_WARN(
        "runtime: slot {}: the controller did not take up the anomaly ({}); "
        "recovering to the committed step",
        slot(),
        taken.ok() ? std::string("the job is not running")
                   : std::string(taken.status().message()));
  }
  return absl::AbortedError(what);
}

void RuntimeImpl::SkipData() {
  if (data_position_ == nullptr) return;
  // In order of their beginnings, one pass moves it past ranges that
  // touch or overlap.
  for (const auto& [begin, end] : SkippedData()) {
    if (*data_position_ >= begin && *data_position_ < end) {
      *data_position_ = end;
    }
  }
}

DataRanges RuntimeImpl::SkippedData() const {
  DataRanges all = run_skip_;
  {
    absl::MutexLock lock(&mu_);
    all.insert(all.end(), job_skip_.begin(), job_skip_.end());
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

}  // namespace holdfast
