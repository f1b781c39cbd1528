#include "src/diagnosis/reachability.h"

#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

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

// Who lost whom, host by host. accused[H]: the other hosts whose members
// failed to reach a member of H; missed[H]: the other hosts H's members
// failed to reach; involved[H]: H's members in any failed connect across
// hosts. Edges within one host, and slots out of range, are left out.
struct Edges {
  std::vector<std::pair<std::string, std::string>> across;  // (from, to)
  std::map<std::string, std::set<std::string>> accused, missed;
  std::map<std::string, std::set<int>> involved;
};

Edges Collect(const ReachInput& in) {
  const int n = static_cast<int>(in.host_of_slot.size());
  Edges e;
  for (const auto& [from, to] : in.failed) {
    if (from < 0 || from >= n || to < 0 || to >= n) continue;
    const std::string& a = in.host_of_slot[static_cast<size_t>(from)];
    const std::string& b = in.host_of_slot[static_cast<size_t>(to)];
    if (a == b) continue;  // one host: not the network between hosts
    e.across.emplace_back(a, b);
    e.accused[b].insert(a);
    e.missed[a].insert(b);
    e.involved[a].insert(from);
    e.involved[b].insert(to);
  }
  return e;
}

// The hosts cut off: lost by members on two or more other hosts, or whose
// members lost two or more other hosts while every failed connect
// involves them (nobody else lost anybody).
std::set<std::string> CutOff(const Edges& e) {
  const auto all_involve = [&](const std::string& h) {
    for (const auto& [a, b] : e.across) {
      if (a != h && b != h) return false;
    }
    return true;
  };
  std::set<std::string> cut;
  for (const auto& [h, by] : e.accused) {
    if (by.size() >= 2) cut.insert(h);
  }
  for (const auto& [h, lost] : e.missed) {
    if (lost.size() >= 2 && all_involve(h)) cut.insert(h);
  }
  return cut;
}

// Host `h` is cut off: its members, or its one member that took part in
// any failed connect (a bad NIC).
ReachVerdict HostCutOff(const ReachInput& in, Edges& e, const std::string& h) {
  ReachVerdict v;
  const std::vector<int> on = SlotsOn(in, h);
  const std::set<int>& inv = e.involved[h];
  const std::set<std::string>& by = e.accused[h];
  const std::set<std::string>& lost = e.missed[h];
  const std::string seen = absl::StrCat(
      by.empty() ? ""
                 : absl::StrCat("members on ", absl::StrJoin(by, ", "),
                                " failed to reach it"),
      !by.empty() && !lost.empty() ? "; " : "",
      lost.empty() ? ""
                   : absl::StrCat("its members failed to reach ",
                                  absl::StrJoin(lost, ", ")));
  if (inv.size() == 1 && on.size() > 1) {
    v.culprits = {*inv.begin()};
    v.rule = ReachRule::kBadNic;
    v.evidence = absl::StrCat(
        "slot ", *inv.begin(), " on ", h, ": ", seen,
        ", and no other member of that host took part in a failed connect");
    return v;
  }
  v.culprits = on;
  v.rule = ReachRule::kHostCutOff;
  v.evidence = absl::StrCat("host ", h, ": ", seen);
  return v;
}

// Two hosts that lost each other and nobody else: the link between them;
// the side with fewer members is evicted (ties: the later in name order).
std::optional<ReachVerdict> Link(const ReachInput& in, Edges& e) {
  if (e.accused.size() != 2) return std::nullopt;
  const std::string a = e.accused.begin()->first;
  const std::string b = std::next(e.accused.begin())->first;
  if (e.accused[a] != std::set<std::string>{b} ||
      e.accused[b] != std::set<std::string>{a}) {
    return std::nullopt;
  }
  const std::vector<int> sa = SlotsOn(in, a), sb = SlotsOn(in, b);
  const bool evict_a = sa.size() < sb.size();
  ReachVerdict v;
  v.culprits = evict_a ? sa : sb;
  v.rule = ReachRule::kLink;
  v.tie = sa.size() == sb.size();
  v.evidence = absl::StrCat(
      "hosts ", a, " and ", b,
      " failed to reach each other and nobody else: the link between "
      "them; host ",
      evict_a ? a : b, "'s ", v.culprits.size(),
      " member(s) are evicted, the fewest");
  return v;
}

}  // namespace

const char* ReachRuleName(ReachRule rule) {
  switch (rule) {
    case ReachRule::kUndecided:
      return "undecided";
    case ReachRule::kHostCutOff:
      return "host cut off";
    case ReachRule::kBadNic:
      return "bad NIC";
    case ReachRule::kLink:
      return "link";
  }
  return "undecided";
}

ReachVerdict Triangulate(const ReachInput& in) {
  Edges e = Collect(in);
  ReachVerdict v;
  if (e.accused.empty()) {
    v.evidence = "no member reported a peer on another host it could not reach";
    return v;
  }
  const std::set<std::string> cut = CutOff(e);
  if (cut.size() == 1) return HostCutOff(in, e, *cut.begin());
  if (cut.empty()) {
    if (std::optional<ReachVerdict> link = Link(in, e)) return *link;
  }
  std::vector<std::string> parts;
  for (const auto& [h, by] : e.accused) {
    parts.push_back(absl::StrCat(h, " lost by ", absl::StrJoin(by, ", ")));
  }
  v.evidence = absl::StrCat("no host, member or single link explains it (",
                            absl::StrJoin(parts, "; "), ")");
  return v;
}

}  // namespace holdfast::diagnosis
