#include "src/control/controller/replica_ledger.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace holdfast::control {

std::optional<ReplicaLedger::Mismatch> ReplicaLedger::Note(
    int slot, int64_t step, uint64_t hash, int keep_snapshots, int world) {
  std::optional<StepCollector<uint64_t>::Step> all =
      steps_.Note(slot, step, hash, keep_snapshots, world, agreed_);
  if (!all.has_value()) return std::nullopt;
  const StepCollector<uint64_t>::Step& done = *all;
  std::map<uint64_t, std::vector<int>> by_hash;
  for (const auto& [sl, h] : done.values) by_hash[h].push_back(sl);
  if (by_hash.size() == 1) {
    agreed_ = step;
    return std::nullopt;
  }
  Mismatch m;
  m.step = step;
  m.agreed = agreed_;
  m.keep_snapshots = done.keep;
  const auto majority = std::max_element(
      by_hash.begin(), by_hash.end(), [](const auto& a, const auto& b) {
        return a.second.size() < b.second.size();
      });
  const bool named = majority->second.size() * 2 > done.values.size();
  std::vector<std::string> groups;
  for (const auto& [h, slots] : by_hash) {
    groups.push_back(absl::StrFormat("slot(s) %s hold %016x",
                                     absl::StrJoin(slots, ", "), h));
    if (named && h != majority->first) {
      m.minority.insert(m.minority.end(), slots.begin(), slots.end());
    }
  }
  std::sort(m.minority.begin(), m.minority.end());
  m.evidence = absl::StrCat(
      "the replicated state differs between slots after step ", step, " (",
      absl::StrJoin(groups, "; "), ")",
      named ? absl::StrCat(": slot(s) ", absl::StrJoin(m.minority, ", "),
                           " differ from the majority")
            : std::string(": no majority names a slot"),
      agreed_ >= 0 ? absl::StrCat("; all agreed after step ", agreed_)
                   : std::string());
  return m;
}

void ReplicaLedger::Restart(int64_t committed) {
  steps_.Clear();
  agreed_ = std::min(agreed_, committed);
}

}  // namespace holdfast::control
