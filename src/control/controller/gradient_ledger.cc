#include "src/control/controller/gradient_ledger.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace holdfast::control {
namespace {

// The median of every norm in `all` but slot `except`'s (the upper one of
// an even count).
double MedianOfOthers(const std::map<int, LocalNorm>& all, int except) {
  std::vector<double> v;
  v.reserve(all.size());
  for (const auto& [slot, n] : all) {
    if (slot != except) v.push_back(n.norm());
  }
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
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
  Outlier o;
  std::vector<std::string> named;
  for (const auto& [sl, norm] : all->values) {
    const double others = MedianOfOthers(all->values, sl);
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
