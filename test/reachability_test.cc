// Triangulating who lost whom on the data network (src/control/
// reachability.h): a pure function, tested on the shapes of real faults.
#include "src/diagnosis/reachability.h"

#include <catch2/catch.hpp>

using holdfast::diagnosis::ReachInput;
using holdfast::diagnosis::ReachRule;
using holdfast::diagnosis::Triangulate;

namespace {

// Three hosts of two slots each: h0 {0, 1}, h1 {2, 3}, h2 {4, 5}.
ReachInput ThreeHosts(std::vector<std::pair<int, int>> failed) {
  return {{"h0", "h0", "h1", "h1", "h2", "h2"}, std::move(failed)};
}

}  // namespace

TEST_CASE("reachability: a host every other host lost is cut off") {
  auto v = Triangulate(ThreeHosts({{0, 2}, {4, 3}, {2, 0}, {3, 5}, {1, 3}}));
  CHECK(v.rule == ReachRule::kHostCutOff);
  CHECK(v.culprits == std::vector<int>{2, 3});
  CHECK(v.evidence.find("host h1: members on h0, h2 failed to reach it") !=
        std::string::npos);
}

TEST_CASE(
    "reachability: a host lost by every other where one member alone took "
    "part is that member's NIC") {
  auto v = Triangulate(ThreeHosts({{0, 2}, {5, 2}, {2, 1}}));
  CHECK(v.rule == ReachRule::kBadNic);
  CHECK(v.culprits == std::vector<int>{2});
}

TEST_CASE("reachability: a member that lost every other host alone") {
  auto v = Triangulate(ThreeHosts({{1, 2}, {1, 4}}));
  CHECK(v.rule == ReachRule::kBadNic);
  CHECK(v.culprits == std::vector<int>{1});
}

TEST_CASE(
    "reachability: a host whose members lost every other host (the only "
    "ones to report) is cut off") {
  // A host whose data link is down fails its own connects at once (no
  // route), while its peers' connects to it hang: only it reports.
  auto v =
      Triangulate(ThreeHosts({{2, 0}, {2, 1}, {2, 4}, {2, 5}, {3, 0}, {3, 5}}));
  CHECK(v.rule == ReachRule::kHostCutOff);
  CHECK(v.culprits == std::vector<int>{2, 3});
}

TEST_CASE("reachability: one pair of hosts is the link between them") {
  // h0 and h2 lost each other; h1 reached both. Equal sides: the later
  // host name is evicted.
  auto v = Triangulate(ThreeHosts({{0, 4}, {4, 0}, {1, 5}}));
  CHECK(v.rule == ReachRule::kLink);
  CHECK(v.culprits == std::vector<int>{4, 5});
  // A smaller side is evicted whatever its name.
  ReachInput uneven{{"a", "a", "b", "z", "z", "z"}, {{0, 3}, {3, 1}}};
  auto u = Triangulate(uneven);
  CHECK(u.rule == ReachRule::kLink);
  CHECK(u.culprits == std::vector<int>{0, 1});
}

TEST_CASE("reachability: what nothing explains is undecided") {
  CHECK(Triangulate(ThreeHosts({})).rule == ReachRule::kUndecided);
  // Failures inside one host are not the network between hosts.
  CHECK(Triangulate(ThreeHosts({{0, 1}})).rule == ReachRule::kUndecided);
  // Two unrelated pairs of four hosts.
  ReachInput two_pairs{{"a", "b", "c", "d"}, {{0, 1}, {1, 0}, {2, 3}, {3, 2}}};
  auto v = Triangulate(two_pairs);
  CHECK(v.rule == ReachRule::kUndecided);
  CHECK(v.culprits.empty());
  // Bad input is ignored, not trusted.
  CHECK(Triangulate(ThreeHosts({{-1, 2}, {0, 9}, {3, 3}})).rule ==
        ReachRule::kUndecided);
}
