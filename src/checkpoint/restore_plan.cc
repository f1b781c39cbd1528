#include "src/checkpoint/restore_plan.h"

#include <algorithm>
#include <functional>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace holdfast::checkpoint {

Target ChooseTarget(const std::vector<MemberState>& members) {
  Target t;
  int64_t high = 0;
  for (const MemberState& m : members) {
    t.step = std::max(t.step, m.committed);
    high = std::max(high, m.high);
  }
  t.lost = std::max<int64_t>(0, high - t.step);
  return t;
}

CutChoice ChooseCut(const std::vector<std::vector<OfferedCopy>>& offers) {
  // (layout generation, world) -> holders, newest first.
  std::map<std::pair<int64_t, int>, Holders, std::greater<>> cuts;
  for (size_t m = 0; m < offers.size(); ++m) {
    for (const OfferedCopy& c : offers[m]) {
      if (c.world <= 0 || !c.good || c.slot < 0 || c.slot >= c.world) {
        continue;
      }
      Holders& h = cuts[{c.layout_generation, c.world}];
      const size_t w = static_cast<size_t>(c.world);
      h.by_slot.resize(w);
      h.address_by_slot.resize(w);
      h.checksum.resize(w);
      h.ledger.resize(w);
      const size_t s = static_cast<size_t>(c.slot);
      h.by_slot[s].push_back(static_cast<int>(m));
      h.address_by_slot[s].push_back(c.address);
      h.checksum[s] = c.checksum;
      h.ledger[s] = c.ledger;
    }
  }
  CutChoice choice;
  for (auto& [key, h] : cuts) {
    std::vector<int> lost;
    for (int p = 0; p < key.second; ++p) {
      if (h.by_slot[static_cast<size_t>(p)].empty()) lost.push_back(p);
    }
    if (lost.empty()) {
      choice.cut = Cut{key.first, key.second, std::move(h)};
      choice.missing.clear();
      return choice;
    }
    if (choice.missing.empty()) {
      choice.missing =
          absl::StrCat("the piece", lost.size() > 1 ? "s" : "", " of slot",
                       lost.size() > 1 ? "s " : " ", absl::StrJoin(lost, ", "),
                       " (world ", key.second, ", generation ", key.first, ")");
    }
  }
  return choice;
}

}  // namespace holdfast::checkpoint
