#include "tools/chaos.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"

namespace holdfast::chaos {

using nlohmann::json;

std::vector<Member> LiveMembers(const json& members_json) {
  std::vector<Member> live;
  if (!members_json.is_object() || !members_json.contains("members")) {
    return live;
  }
  for (const json& m : members_json["members"]) {
    if (m.value("state", "") != "STATE_ALIVE") continue;
    const std::string role = m.value("role", "");
    if (role != "ROLE_WORKER" && role != "ROLE_STANDBY") continue;
    Member x;
    x.id = m.value("member", "");
    x.pid = m.value("pid", int64_t{0});
    x.worker = role == "ROLE_WORKER";
    x.slot = x.worker ? m.value("slot", -1) : -1;
    x.host = m.value("host", "");
    if (x.pid > 0) live.push_back(x);
  }
  return live;
}

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kKill:
      return "kill";
    case Kind::kStop:
      return "stop";
    case Kind::kStandby:
      return "standby-kill";
    case Kind::kHost:
      return "host-kill";
  }
  return "?";
}

namespace {

std::string DomainOf(const Member& m, bool hosts) {
  return hosts ? m.host : absl::StrCat("slot ", m.slot);
}

template <typename T>
const T& Pick(std::mt19937_64& rng, const std::vector<T>& v) {
  return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
}

}  // namespace

std::vector<Fault> PlanCluster(std::mt19937_64& rng,
                               const std::vector<Member>& live,
                               const PlanOptions& options) {
  std::vector<Member> workers, standbys;
  for (const Member& m : live) (m.worker ? workers : standbys).push_back(m);
  // Every lost worker takes a standby; so does a killed standby.
  int budget = static_cast<int>(standbys.size());
  std::uniform_real_distribution<double> unit(0, 1);
  int size = 1;
  if (unit(rng) < options.cluster_chance) {
    size = std::uniform_int_distribution<int>(2, 3)(rng);
  }
  // Every piece has a copy in `replicas` + 1 domains, as far as there are
  // that many: losing more than `replicas` domains, or every domain that
  // holds workers, can lose a piece for good.
  std::set<std::string> all_domains;
  for (const Member& w : workers)
    all_domains.insert(DomainOf(w, options.hosts));
  const int max_domains =
      std::min(options.replicas, static_cast<int>(all_domains.size()) - 1);
  std::set<std::string> domains_lost;
  std::set<int64_t> used;  // pids already in this cluster
  std::vector<Fault> cluster;
  for (int i = 0; i < size && budget > 0; ++i) {
    // The domains of live workers not yet hit, and which of them stay
    // within the bound.
    std::map<std::string, std::vector<Member>> by_domain;
    for (const Member& w : workers) {
      if (used.count(w.pid) == 0) {
        by_domain[DomainOf(w, options.hosts)].push_back(w);
      }
    }
    std::vector<std::string> open;
    for (const auto& [d, ms] : by_domain) {
      const bool known = domains_lost.count(d) > 0;
      if (known || static_cast<int>(domains_lost.size()) < max_domains) {
        open.push_back(d);
      }
    }
    std::vector<Member> spare;
    for (const Member& s : standbys) {
      if (used.count(s.pid) == 0) spare.push_back(s);
    }
    std::vector<Kind> kinds;
    if (!open.empty()) {
      kinds.insert(kinds.end(), {Kind::kKill, Kind::kKill, Kind::kStop});
      if (options.hosts) kinds.push_back(Kind::kHost);
    }
    if (!spare.empty()) kinds.push_back(Kind::kStandby);
    if (kinds.empty()) break;
    Fault f;
    f.kind = Pick(rng, kinds);
    if (f.kind == Kind::kStandby) {
      const Member& s = Pick(rng, spare);
      f.pids = {s.pid};
      f.members = {s.id};
      f.slots = {-1};
      f.domain = s.host;
    } else {
      f.domain = Pick(rng, open);
      std::vector<Member> targets = by_domain[f.domain];
      if (f.kind != Kind::kHost) targets = {Pick(rng, targets)};
      if (static_cast<int>(targets.size()) > budget) {
        targets.resize(static_cast<size_t>(budget));
      }
      for (const Member& t : targets) {
        f.pids.push_back(t.pid);
        f.members.push_back(t.id);
        f.slots.push_back(t.slot);
      }
      domains_lost.insert(f.domain);
    }
    budget -= static_cast<int>(f.pids.size());
    for (int64_t p : f.pids) used.insert(p);
    cluster.push_back(std::move(f));
  }
  // The cluster's faults land within cluster_ms of its first, in order.
  std::vector<int64_t> delays;
  for (size_t i = 1; i < cluster.size(); ++i) {
    delays.push_back(
        std::uniform_int_distribution<int64_t>(0, options.cluster_ms - 1)(rng));
  }
  std::sort(delays.begin(), delays.end());
  for (size_t i = 1; i < cluster.size(); ++i) {
    cluster[i].delay_ms = delays[i - 1];
  }
  return cluster;
}

Verdict Judge(bool timed_out, const json& summary, const std::string& reference,
              int n) {
  Verdict v;
  if (timed_out) {
    v.hang = true;
    v.why = "not done within the hang bound";
    return v;
  }
  if (!summary.is_object()) {
    v.job_lost = true;
    v.why = "no readable summary.json";
    return v;
  }
  const std::string outcome = summary.value("outcome", "");
  if (outcome != "finished") {
    v.job_lost = true;
    v.why = absl::StrCat("job ", outcome, ": ", summary.value("reason", ""));
    return v;
  }
  if (!summary.value("replicas_agree", true)) {
    v.divergent = true;
    v.why = "the slots' replicated state differs";
    return v;
  }
  if (summary.value("world_size_final", 0) < n) {
    v.shrunk = true;
    return v;
  }
  const std::string hash = summary.value("state_hash", "");
  if (hash != reference) {
    v.divergent = true;
    v.why = absl::StrCat("state ", hash.empty() ? "(none)" : hash,
                         " differs from the fault-free ", reference);
  }
  return v;
}

}  // namespace holdfast::chaos
