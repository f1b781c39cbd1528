// Gray failures on real jobs: four ranks of the data-parallel trainer. A
// rank slowed by the slow: fault is reported a straggler and nobody is
// fenced; uneven steps (an RL job's, the same draw on every rank) raise
// no alarm. Both end with the fault-free model.
#include <signal.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/time/clock.h"
#include "test/job_run.h"
#include "test/support/members_json.h"

namespace {

using holdfast::test::AwaitWorker;
using holdfast::test::CheckFinished;
using holdfast::test::JobRun;
using holdfast::test::Launch;
using holdfast::test::ReadFile;
using nlohmann::json;

// The trainer's final hash after `steps` steps with no fault.
std::string FaultFreeHash(int steps = 40) {
  return holdfast::test::FaultFreeHash(4, {"--steps", std::to_string(steps)},
                                       steps);
}

}  // namespace

TEST_CASE(
    "gray: a rank throttled from outside is replaced under the replace "
    "policy and only it") {
  // The OS-like throttle: slot 2's process runs 20 ms of every 60 (SIGSTOP
  // and SIGCONT by pid), so its step's own work takes about 3x its
  // peers'. The standby that replaces it runs at full speed.
  const std::string dir = holdfast::proc::MakeTempDir();
  std::atomic<bool> done{false};
  pid_t throttled = -1;
  std::thread throttle([&] {
    throttled = AwaitWorker(dir, 2, 3);
    while (throttled > 0 && !done) {
      if (::kill(throttled, SIGSTOP) != 0) break;  // gone
      absl::SleepFor(absl::Milliseconds(40));
      ::kill(throttled, SIGCONT);
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (throttled > 0) ::kill(throttled, SIGCONT);
  });
  JobRun r = Launch({"-n", "4", "--standby", "1", "--stragglers", "replace",
                     "--silent-after-ms", "5000"},
                    {"--steps", "80", "--step-ms", "20"}, "", dir);
  done = true;
  throttle.join();
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(throttled > 0);
  REQUIRE(r.rc == 0);
  CheckFinished(r, 4, 80);
  CHECK(r.hashes.at(0) == FaultFreeHash(80));
  int evicted = 0;
  for (const json& i : r.summary["incidents"]) {
    CHECK(i["kind"] == "straggler");
    CHECK(i["slot"] == 2);
    evicted += i["evicted"].get<bool>();
  }
  CHECK(evicted == 1);
  CHECK(r.summary["generation"] == 1);
}

TEST_CASE(
    "gray: a rank three times slower than its peers is reported a "
    "straggler and nobody is fenced") {
  JobRun r = Launch(
      {"-n", "4", "--standby", "1", "--inject", "slow:slot=2:ms=40:step=5"},
      {"--steps", "40", "--step-ms", "20"});
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(r.rc == 0);
  CheckFinished(r, 4, 40);
  CHECK(r.hashes.at(0) == FaultFreeHash());
  const json& incidents = r.summary["incidents"];
  REQUIRE(incidents.size() == 1);
  CHECK(incidents[0]["kind"] == "straggler");
  CHECK(incidents[0]["slot"] == 2);
  CHECK(incidents[0]["evicted"] == false);
  CHECK(r.summary["generation"] == 0);
}

TEST_CASE(
    "gray: uneven steps that are long on every rank at once raise no alarm") {
  // 200 steps of 20 ms of compute times a lognormal draw (sigma 0.8), 5 %
  // of them 5-10x, the same draw on every rank, 5 % noise per rank.
  JobRun r = Launch({"-n", "4", "--standby", "1"},
                    {"--steps", "200", "--step-ms", "20", "--uneven", "0.8"});
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(r.rc == 0);
  CheckFinished(r, 4, 200);
  CHECK(r.summary["incidents"].empty());
}
