#include "src/control/controller/gradient_ledger.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace holdfast::control {
namespace {

// The median of the norms in `sorted` (ascending) but one of value
// `mine` (the upper one of an even count; 0 with no others). One sort
// serves every slot of a step: O(log n) each, not a copy of the n others.
double MedianOfOthers(const std::vector<double>& sorted, double mine) {
  if (sorted.size() < 2) return 0;
  // Without the element at `at`, index `mid` of the rest is sorted[mid]
  // before it and sorted[mid + 1] from it on (equal values are alike).
  const size_t at = static_cast<size_t>(
      std::lower_bound(sorted.begin(), sorted.end(), mine) - sorted.begin());
  const size_t mid = (sorted.size() - 1) / 2;
  return mid < at ? sorted[mid] : sorted[mid + 1];
}

}  // namespace

std::optional<GradientLedger::Outlier> GradientLedger::Note(int slot,
                                                            const LocalNorm& n,
                                                            int world,
                                                            double factor) {
  std::optional<StepCollector<LocalNorm>::Step> all =
      steps_.Note(slot, n.step(), n, n.keep_snapshots(), world, decided_);
  if (!all.has_value()) return std::nullopt;
  decided_ = all->step;
  std::vector<double> sorted;
  sorted.reserve(all->values.size());
  for (const auto& [sl, norm] : all->values) sorted.push_back(norm.norm());
  std::sort(sorted.begin(), sorted.end());
  Outlier o;
  std::vector<std::string> named;
  for (const auto& [sl, norm] : all->values) {
    const double others = MedianOfOthers(sorted, norm.norm());
    if (others > 0 && norm.norm() > factor * others) {
      o.slots.push_back(sl);
      o.data[sl] = norm.data();
      named.push_back(absl::StrFormat(
          "slot %d's (%.4g) is %.3g times the median of the other slots' "
          "(%.4g)",
          sl, norm.norm(), norm.norm() / others, others));
    }
  }
  if (o.slots.empty()) return std::nullopt;
  o.step = all->step;
  o.keep_snapshots = all->keep;
  o.evidence = absl::StrCat("the local gradient norms of step ", o.step, ": ",
                            absl::StrJoin(named, "; "), " (factor ",
                            absl::StrFormat("%g", factor), ")");
  return o;
}

void GradientLedger::Restart(int64_t committed) {
  steps_.Clear();
  decided_ = std::min(decided_, committed);
}

}  // namespace holdfast::control
