#include "src/diagnosis/reachability.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace holdfast::diagnosis {
namespace {

std::vector<int> SlotsOn(const ReachInput& in, const std::string& host) {
  std::vector<int> out;
  for (size_t s = 0; s < in.host_of_slot.size(); ++s) {
    if (in.host_of_slot[s] == host) out.push_back(static_cast<int>(s));
  }
  return out;
}

}  // namespace

ReachVerdict Triangulate(const ReachInput& in) {
  const int n = static_cast<int>(in.host_of_slot.size());
  // accused[H]: the other hosts whose members failed to reach a member of
  // H; missed[H]: the other hosts H's members failed to reach;
  // involved[H]: H's members in any failed connect across hosts.
  std::map<std::string, std::set<std::string>> accused, missed;
  std::map<std::string, std::set<int>> involved;
  for (const auto& [from, to] : in.failed) {
    if (from < 0 || from >= n || to < 0 || to >= n) continue;
    const std::string& a = in.host_of_slot[static_cast<size_t>(from)];
    const std::string& b = in.host_of_slot[static_cast<size_t>(to)];
    if (a == b) continue;  // one host: not the network between hosts
    accused[b].insert(a);
    missed[a].insert(b);
    involved[a].insert(from);
    involved[b].insert(to);
  }
  ReachVerdict v;
  v.rule = "undecided";
  if (accused.empty()) {
    v.evidence = "no member reported a peer on another host it could not reach";
    return v;
  }
  // A host is cut off when members on two or more other hosts lost it,
  // or when its members lost two or more other hosts and every failed
  // connect involves it (nobody else lost anybody).
  const auto all_involve = [&](const std::string& h) {
    for (const auto& [from, to] : in.failed) {
      if (from < 0 || from >= n || to < 0 || to >= n) continue;
      const std::string& a = in.host_of_slot[static_cast<size_t>(from)];
      const std::string& b = in.host_of_slot[static_cast<size_t>(to)];
      if (a != b && a != h && b != h) return false;
    }
    return true;
  };
  std::set<std::string> cut;
  for (const auto& [h, by] : accused) {
    if (by.size() >= 2) cut.insert(h);
  }
  for (const auto& [h, lost] : missed) {
    if (lost.size() >= 2 && all_involve(h)) cut.insert(h);
  }
  if (cut.size() == 1) {
    const std::string& h = *cut.begin();
    const std::vector<int> on = SlotsOn(in, h);
    const std::set<int>& inv = involved[h];
    const std::string seen = absl::StrCat(
        accused[h].empty()
            ? ""
            : absl::StrCat("members on ", absl::StrJoin(accused[h], ", "),
                           " failed to reach it"),
        !accused[h].empty() && !missed[h].empty() ? "; " : "",
        missed[h].empty() ? ""
                          : absl::StrCat("its members failed to reach ",
                                         absl::StrJoin(missed[h], ", ")));
    if (inv.size() == 1 && on.size() > 1) {
      v.culprits = {*inv.begin()};
      v.rule = "bad NIC";
      v.evidence = absl::StrCat(
          "slot ", *inv.begin(), " on ", h, ": ", seen,
          ", and no other member of that host took part in a failed connect");
      return v;
    }
    v.culprits = on;
    v.rule = "host cut off";
    v.evidence = absl::StrCat("host ", h, ": ", seen);
    return v;
  }
  const auto mutual = [&](const std::string& a, const std::string& b) {
    return accused[a] == std::set<std::string>{b} &&
           accused[b] == std::set<std::string>{a};
  };
  if (cut.empty() && accused.size() == 2 &&
      mutual(accused.begin()->first, std::next(accused.begin())->first)) {
    const std::string a = accused.begin()->first;
    const std::string b = std::next(accused.begin())->first;
    const std::vector<int> sa = SlotsOn(in, a), sb = SlotsOn(in, b);
    const bool evict_a = sa.size() < sb.size();
    v.culprits = evict_a ? sa : sb;
    v.rule = "link";
    v.evidence = absl::StrCat(
        "hosts ", a, " and ", b,
        " failed to reach each other and nobody else: the link between "
        "them; host ",
        evict_a ? a : b, "'s ", v.culprits.size(),
        " member(s) are evicted, the fewest");
    return v;
  }
  std::vector<std::string> parts;
  for (const auto& [h, by] : accused) {
    parts.push_back(absl::StrCat(h, " lost by ", absl::StrJoin(by, ", ")));
  }
  v.evidence = absl::StrCat("no host, member or single link explains it (",
                            absl::StrJoin(parts, "; "), ")");
  return v;
}

}  // namespace holdfast::diagnosis
