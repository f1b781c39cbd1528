// holdfast-chaos: its fault plans stay within what the job's replication
// and standbys cover, its verdicts name hangs, losses and divergences, and
// a short soak of the example trainer on 3 ranks (faults by pid: kills,
// stops, standby and host kills, clusters) ends with no hang, no
// divergence and no lost job.
#include <signal.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "test/support/job_run.h"
#include "test/support/process_group.h"
#include "tools/chaos.h"

namespace {

namespace chaos = holdfast::chaos;
using nlohmann::json;

// `workers` workers on `hosts` hosts (contiguous blocks) and `standbys`
// standbys, as LiveMembers reads them.
std::vector<chaos::Member> Job(int workers, int hosts, int standbys) {
  std::vector<chaos::Member> live;
  for (int i = 0; i < workers; ++i) {
    live.push_back({absl::StrCat("w", i), 1000 + i, true, i,
                    absl::StrCat("host", i * hosts / workers)});
  }
  for (int i = 0; i < standbys; ++i) {
    live.push_back(
        {absl::StrCat("s", i), 2000 + i, false, -1, absl::StrCat("spare", i)});
  }
  return live;
}

}  // namespace

TEST_CASE("chaos: members.json's live workers and standbys are read") {
  const json m = json::parse(R"({"members": [
    {"member": "1", "pid": 10, "role": "ROLE_WORKER", "slot": 0,
     "state": "STATE_ALIVE", "host": "host0"},
    {"member": "2", "pid": 11, "role": "ROLE_WORKER", "slot": 1,
     "state": "STATE_DEAD", "host": "host0"},
    {"member": "3", "pid": 12, "role": "ROLE_STANDBY", "slot": -1,
     "state": "STATE_ALIVE", "host": "spare0"}]})");
  const std::vector<chaos::Member> live = chaos::LiveMembers(m);
  REQUIRE(live.size() == 2);
  CHECK(live[0].worker);
  CHECK(live[0].pid == 10);
  CHECK(live[0].host == "host0");
  CHECK(!live[1].worker);
  CHECK(live[1].slot == -1);
  CHECK(chaos::LiveMembers(json::parse("{}")).empty());
  CHECK(chaos::LiveMembers(json(json::value_t::discarded)).empty());
}

TEST_CASE(
    "chaos: a planned cluster never loses more failure domains than the "
    "replicas cover nor more processes than there are standbys") {
  std::map<chaos::Kind, int> kinds;
  std::map<size_t, int> sizes;
  for (int replicas : {1, 2, 3}) {
    // Failure domains: 8 slots; 4 hosts; 2 hosts, where two replicas
    // cannot cover two lost domains (every worker would be gone).
    for (int layout : {0, 4, 2}) {
      const bool hosts = layout > 0;
      const int domains_total = hosts ? layout : 8;
      for (int standbys : {0, 1, 2, 4}) {
        for (uint64_t seed = 0; seed < 300; ++seed) {
          std::mt19937_64 rng(seed);
          const std::vector<chaos::Member> live =
              Job(8, hosts ? layout : 1, standbys);
          chaos::PlanOptions po;
          po.replicas = replicas;
          po.hosts = hosts;
          const std::vector<chaos::Fault> plan =
              chaos::PlanCluster(rng, live, po);
          INFO("replicas " << replicas << " domains " << domains_total
                           << " standbys " << standbys << " seed " << seed);
          if (standbys == 0) {
            CHECK(plan.empty());
            continue;
          }
          REQUIRE(!plan.empty());
          REQUIRE(plan.size() <= 3);
          ++sizes[plan.size()];
          std::set<std::string> domains;
          std::set<int64_t> pids;
          int processes = 0;
          int64_t last_delay = 0;
          CHECK(plan[0].delay_ms == 0);
          for (const chaos::Fault& f : plan) {
            ++kinds[f.kind];
            CHECK(f.delay_ms >= last_delay);
            CHECK(f.delay_ms < po.cluster_ms);
            last_delay = f.delay_ms;
            REQUIRE(!f.pids.empty());
            CHECK(f.pids.size() == f.slots.size());
            CHECK(f.pids.size() == f.members.size());
            for (size_t i = 0; i < f.pids.size(); ++i) {
              CHECK(pids.insert(f.pids[i]).second);  // each process once
              const bool standby = f.pids[i] >= 2000;
              CHECK(standby == (f.kind == chaos::Kind::kStandby));
              CHECK((f.slots[i] < 0) == standby);
            }
            processes += static_cast<int>(f.pids.size());
            if (f.kind != chaos::Kind::kStandby) {
              domains.insert(f.domain);
              if (!hosts) CHECK(f.pids.size() == 1);
              if (!hosts) CHECK(f.kind != chaos::Kind::kHost);
            }
          }
          CHECK(static_cast<int>(domains.size()) <= replicas);
          CHECK(static_cast<int>(domains.size()) < domains_total);
          CHECK(processes <= standbys);
        }
      }
    }
  }
  // Every kind and every cluster size came up.
  CHECK(kinds[chaos::Kind::kKill] > 0);
  CHECK(kinds[chaos::Kind::kStop] > 0);
  CHECK(kinds[chaos::Kind::kStandby] > 0);
  CHECK(kinds[chaos::Kind::kHost] > 0);
  CHECK(sizes[1] > 0);
  CHECK(sizes[2] > 0);
  CHECK(sizes[3] > 0);
}

TEST_CASE("chaos: a host kill takes every worker of the host") {
  bool seen = false;
  for (uint64_t seed = 0; seed < 200 && !seen; ++seed) {
    std::mt19937_64 rng(seed);
    chaos::PlanOptions po;
    po.hosts = true;
    po.cluster_chance = 0;
    const std::vector<chaos::Fault> plan =
        chaos::PlanCluster(rng, Job(6, 2, 3), po);
    REQUIRE(plan.size() == 1);
    if (plan[0].kind != chaos::Kind::kHost) continue;
    seen = true;
    CHECK(plan[0].pids.size() == 3);
    const std::set<int> slots(plan[0].slots.begin(), plan[0].slots.end());
    CHECK((slots == std::set<int>{0, 1, 2} || slots == std::set<int>{3, 4, 5}));
  }
  CHECK(seen);
}

TEST_CASE("chaos: a run's verdict names a hang or a lost job or a divergence") {
  const json ok = {{"outcome", "finished"},
                   {"world_size_final", 3},
                   {"state_hash", "abc"},
                   {"replicas_agree", true}};
  chaos::Verdict v = chaos::Judge(false, ok, "abc", 3);
  CHECK(!v.hang);
  CHECK(!v.job_lost);
  CHECK(!v.divergent);
  CHECK(!v.shrunk);
  CHECK(v.why.empty());

  v = chaos::Judge(true, ok, "abc", 3);
  CHECK(v.hang);

  json stopped = ok;
  stopped["outcome"] = "stopped";
  stopped["reason"] = "0 live workers";
  v = chaos::Judge(false, stopped, "abc", 3);
  CHECK(v.job_lost);
  CHECK(v.why.find("0 live workers") != std::string::npos);
  v = chaos::Judge(false, json(json::value_t::discarded), "abc", 3);
  CHECK(v.job_lost);

  json other = ok;
  other["state_hash"] = "abd";
  v = chaos::Judge(false, other, "abc", 3);
  CHECK(v.divergent);
  CHECK(v.why.find("abd") != std::string::npos);
  // A smaller world legitimately ends elsewhere: not compared.
  other["world_size_final"] = 2;
  v = chaos::Judge(false, other, "abc", 3);
  CHECK(!v.divergent);
  CHECK(v.shrunk);
  // Slots that disagree among themselves diverged, whatever the world.
  json split = ok;
  split["replicas_agree"] = false;
  v = chaos::Judge(false, split, "abc", 3);
  CHECK(v.divergent);
}

namespace {

struct Soaked {
  int rc = -1;
  json report;
  std::string err;
};

Soaked RunChaos(const std::string& args, const std::string& trainer_args) {
  const std::string dir = holdfast::proc::MakeTempDir();
  const std::string cmd =
      absl::StrCat("timeout -s KILL 280 ", HOLDFAST_CHAOS_BIN, " --run ",
                   HOLDFAST_RUN_BIN, " --log-dir ", dir, "/runs --json ", args,
                   " -- ", HOLDFAST_DP_TRAINER_BIN, " ", trainer_args, " > ",
                   dir, "/report.json 2> ", dir, "/err.txt");
  const int status = std::system(cmd.c_str());
  Soaked s;
  s.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  s.report = json::parse(holdfast::test::ReadFile(dir + "/report.json"),
                         nullptr, false);
  s.err = holdfast::test::ReadFile(dir + "/err.txt");
  return s;
}

}  // namespace

TEST_CASE(
    "chaos: a short soak on 3 ranks with faults by pid loses no job and "
    "no model") {
  // 3 workers on 3 fake hosts, 3 standbys, two replicas: clusters take out
  // up to two hosts. About a minute: this is CI's soak.
  Soaked s = RunChaos(
      "-n 3 --standby 3 --replicas 2 --hosts 3 --duration-s 60 --seed 7 "
      "--gap-ms 500",
      "--steps 250 --step-ms 20");
  INFO("stderr: " << s.err);
  INFO("report: " << s.report.dump(1));
  REQUIRE(!s.report.is_discarded());
  CHECK(s.rc == 0);
  CHECK(s.report.value("ok", false));
  CHECK(s.report.value("runs", 0) >= 1);
  CHECK(s.report.value("faults", 0) >= 3);
  CHECK(s.report.value("hangs", -1) == 0);
  CHECK(s.report.value("divergences", -1) == 0);
  CHECK(s.report.value("job_losses", -1) == 0);
  // The fault-free state was reached in full-world runs, not only skipped.
  int compared = 0;
  for (const json& r : s.report["run_details"]) {
    compared += !r.value("shrunk", true) && !r["faults"].empty();
    CHECK(r.value("state_hash", "") ==
          s.report.value("reference_state_hash", "x"));
  }
  CHECK(compared >= 1);
}

TEST_CASE("chaos: a run past the hang bound is a hang and fails the soak") {
  // One second is far less than a run takes: the faulty run is killed
  // whole at the bound, reported as a hang, and the exit is non-zero.
  Soaked s = RunChaos(
      "-n 3 --standby 1 --replicas 1 --duration-s 1 --hang-s 1 --seed 3",
      "--steps 413 --step-ms 10");
  INFO("stderr: " << s.err);
  REQUIRE(!s.report.is_discarded());
  CHECK(s.rc == 1);
  CHECK(s.report.value("hangs", 0) == 1);
  CHECK(!s.report.value("ok", true));
  // Nothing of the killed run is left behind.
  // (The bracket keeps pgrep from matching its own shell's command line.)
  CHECK(std::system("pgrep -f 'holdfast-dp-trainer --steps 41[3]' > "
                    "/dev/null") != 0);
}
