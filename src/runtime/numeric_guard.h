// What the runtime checks after each step (docs/gray-failures.md): a NaN
// or Inf in the step's metrics or in values the trainer handed over
// (Runtime::CheckFinite, ReportNonFinite), and a loss spike, the metric
// "loss" above NumericChecks::spike_factor times the median of its recent
// values. Its answer is the anomaly the member reports to the controller,
// which rolls the job back.
//
// Threading: ReportNonFinite may be called from any thread; the rest
// belongs to the training thread.
#ifndef HOLDFAST_SRC_RUNTIME_NUMERIC_GUARD_H_
#define HOLDFAST_SRC_RUNTIME_NUMERIC_GUARD_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "holdfast/runtime.h"
#include "src/control/wire/controller.pb.h"

namespace holdfast {

class NumericGuard {
 public:
  // A step starts; `data_begin` is its first data position. What the
  // last step reported of its own values is forgotten.
  void BeginStep(int64_t data_begin);
  // The trainer found `what` not finite in its own values this step (the
  // first report of a step is kept).
  void ReportNonFinite(absl::string_view what);
  // The trainer checked finite values of its own this step (its local
  // gradients): their sum of squares adds to the step's.
  void AddSquares(double sum_of_squares);
  // The step's local norm (the square root of its sums), if the trainer
  // reported any; clears them.
  std::optional<double> TakeLocalNorm();
  // The data the step read: [its first position, `data_end`); empty when
  // no data position is registered (`data_end` < 0).
  control::DataRange StepData(int64_t data_end) const;
  // The anomaly of step `step` (its data: from its first position to
  // `data_end`, -1 for none registered), if its numbers fail `checks`;
  // else records its loss for the spike check.
  std::optional<control::Anomaly> Check(
      const NumericChecks& checks, int64_t step, int keep_snapshots,
      int64_t data_end, const std::map<std::string, double>& metrics);

 private:
  // A loss spike against the recent losses, else records `loss`.
  std::optional<std::string> Spike(const NumericChecks& checks, double loss);

  int64_t data_begin_ = 0;
  absl::Mutex mu_;
  std::optional<std::string> nonfinite_ ABSL_GUARDED_BY(mu_);
  std::optional<double> squares_ ABSL_GUARDED_BY(mu_);
  std::deque<double> losses_;
};

}  // namespace holdfast

#endif  // HOLDFAST_SRC_RUNTIME_NUMERIC_GUARD_H_
