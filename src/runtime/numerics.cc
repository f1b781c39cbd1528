// The runtime's side of numeric anomalies: the values a trainer hands over
// (the checks themselves are NumericGuard's), the report that makes the
// controller roll the job back, and the data position that moves past the
// data the job skips (docs/gray-failures.md).
#include <algorithm>
#include <cmath>
#include <cstring>
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
  if (const int bit = GradientFlipBitNow(); bit >= 0) {
    const int64_t at = runtime_internal::FlipLargestClearBit(data, count, bit);
    HOLDFAST_LOG_WARN(
        "runtime: slot {}: bit {} of {}[{}] flipped at step {} (injected)",
        slot(), bit, std::string(what), at, step_now_.load());
  }
  double squares = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(data[i])) {
      ReportNonFinite(what);
      return false;
    }
    squares += static_cast<double>(data[i]) * data[i];
  }
  ReportLocalSquares(squares);
  return true;
}

void RuntimeImpl::ReportNonFinite(absl::string_view what) {
  numerics_.ReportNonFinite(what);
}

void RuntimeImpl::ReportLocalSquares(double sum_of_squares) {
  numerics_.AddSquares(sum_of_squares);
}

bool RuntimeImpl::InjectNanNow() {
  return faults_->FiresAt(fault::Kind::kNan, slot(), step_now_.load());
}

int RuntimeImpl::GradientFlipBitNow() {
  return faults_->FlipBitAt(slot(), step_now_.load());
}

namespace runtime_internal {

// Runtime::Create makes every Runtime.
bool NanFaultFiresNow(Runtime& rt) {
  return static_cast<RuntimeImpl&>(rt).InjectNanNow();
}

int GradientFlipBitNow(Runtime& rt) {
  return static_cast<RuntimeImpl&>(rt).GradientFlipBitNow();
}

int64_t FlipLargestClearBit(float* data, size_t count, int bit) {
  const uint32_t mask = uint32_t{1} << bit;
  int64_t at = -1;
  float largest = -1;
  for (size_t i = 0; i < count; ++i) {
    uint32_t u;
    std::memcpy(&u, &data[i], sizeof(u));
    float flipped;
    u ^= mask;
    std::memcpy(&flipped, &u, sizeof(u));
    if ((u & mask) != 0 && std::isfinite(flipped) &&
        std::fabs(data[i]) > largest) {
      largest = std::fabs(data[i]);
      at = static_cast<int64_t>(i);
    }
  }
  if (at < 0) return -1;
  uint32_t u;
  std::memcpy(&u, &data[at], sizeof(u));
  u ^= mask;
  std::memcpy(&data[at], &u, sizeof(u));
  return at;
}

}  // namespace runtime_internal

absl::Status RuntimeImpl::ReportAnomaly(const control::Anomaly& anomaly) {
  // The live state is past the anomaly; only a committed step is good.
  progress_.live_step = -1;
  const int64_t gen = gens_.CommGeneration();
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
    gens_.AwaitGeneration(gen, absl::Now() + kRollbackWait);
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
  const DataRanges job = gens_.JobSkip();
  all.insert(all.end(), job.begin(), job.end());
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

}  // namespace holdfast
