#include "src/runtime/numeric_guard.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace holdfast {
namespace {

double Median(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(mid), v.end());
  return v[mid];
}

}  // namespace

void NumericGuard::BeginStep(int64_t data_begin) {
  data_begin_ = data_begin;
  absl::MutexLock lock(&mu_);
  nonfinite_.reset();
  squares_.reset();
}

void NumericGuard::AddSquares(double sum_of_squares) {
  absl::MutexLock lock(&mu_);
  squares_ = squares_.value_or(0) + sum_of_squares;
}

std::optional<double> NumericGuard::TakeLocalNorm() {
  absl::MutexLock lock(&mu_);
  std::optional<double> norm;
  if (squares_.has_value()) norm = std::sqrt(*squares_);
  squares_.reset();
  return norm;
}

control::DataRange NumericGuard::StepData(int64_t data_end) const {
  control::DataRange r;
  if (data_end >= 0) {
    r.set_begin(data_begin_);
    r.set_end(std::max(data_begin_, data_end));
  }
  return r;
}

void NumericGuard::ReportNonFinite(absl::string_view what) {
  absl::MutexLock lock(&mu_);
  if (!nonfinite_.has_value()) nonfinite_ = std::string(what);
}

std::optional<control::Anomaly> NumericGuard::Check(
    const NumericChecks& checks, int64_t step, int keep_snapshots,
    int64_t data_end, const std::map<std::string, double>& metrics) {
  control::Anomaly a;
  a.set_step(step);
  a.set_keep_snapshots(keep_snapshots);
  if (data_end >= 0) *a.mutable_data() = StepData(data_end);
  {
    absl::MutexLock lock(&mu_);
    if (nonfinite_.has_value()) {
      a.set_kind("nan");
      a.set_what(*nonfinite_);
      a.set_value(std::numeric_limits<double>::quiet_NaN());
      a.set_local(true);
      nonfinite_.reset();
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
  std::optional<std::string> spike = Spike(checks, loss->second);
  if (!spike.has_value()) return std::nullopt;
  a.set_kind("spike");
  a.set_what(*spike);
  a.set_value(loss->second);
  return a;
}

std::optional<std::string> NumericGuard::Spike(const NumericChecks& checks,
                                               double loss) {
  if (static_cast<int>(losses_.size()) >= checks.spike_warmup) {
    const double median =
        Median(std::vector<double>(losses_.begin(), losses_.end()));
    if (median > 0 && loss > checks.spike_factor * median) {
      return absl::StrCat("loss (", checks.spike_factor,
                          " x the running median ", median, ")");
    }
  }
  losses_.push_back(loss);
  while (static_cast<int>(losses_.size()) > std::max(1, checks.spike_window)) {
    losses_.pop_front();
  }
  return std::nullopt;
}

}  // namespace holdfast
