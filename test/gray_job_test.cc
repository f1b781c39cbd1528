// Gray failures on real jobs: four ranks of the data-parallel trainer. A
// rank slowed by the slow: fault, or stopped part of the time from
// outside, is reported a straggler and nobody is fenced; uneven steps (an RL
// job's, the same draw on every rank) raise no alarm. Both end with the
// fault-free model. A NaN or a loss spike rolls the job back and skips the
// step's data: the model is then that of a fault-free run told to skip the same
// data; a rank that is the source of NaNs twice, at different data, is
// replaced.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "test/support/job_run.h"
#include "test/support/members_json.h"
#include "test/support/throttle.h"

namespace {

using holdfast::test::AwaitWorker;
using holdfast::test::CheckFinished;
using holdfast::test::CpuQuota;
using holdfast::test::DutyCycle;
using holdfast::test::JobRun;
using holdfast::test::Launch;
using holdfast::test::ReadFile;
using nlohmann::json;

// The trainer's final hash after `steps` steps with no fault.
std::string FaultFreeHash(int steps = 40) {
  return holdfast::test::FaultFreeHash(4, {"--steps", std::to_string(steps)},
                                       steps);
}

// The --skip-data argument that reproduces what the job skipped
// (summary.json's skipped_data).
std::string SkipArg(const json& summary) {
  std::string out;
  for (const json& r : summary["skipped_data"]) {
    if (!out.empty()) out += ",";
    out += std::to_string(r[0].get<int64_t>()) + ":" +
           std::to_string(r[1].get<int64_t>());
  }
  return out;
}

// The trainer's final hash after 40 steps with no fault, skipping `skip`.
std::string ReferenceHash(const std::string& skip) {
  return holdfast::test::FaultFreeHash(
      4, {"--steps", "40", "--skip-data", skip}, 40);
}

// The job ran to `steps` with `world` ranks and had one incident: a
// numeric rollback that named `slot` and fenced nobody.
void CheckOneRollback(const JobRun& r, int world, int64_t steps, int slot) {
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(r.rc == 0);
  CheckFinished(r, world, steps);
  REQUIRE(r.summary["incidents"].size() == 1);
  const json& i = r.summary["incidents"][0];
  CHECK(i["kind"] == "numeric");
  CHECK(i["slot"] == slot);
  CHECK_FALSE(i["evicted"].get<bool>());
  CHECK(r.summary["rollbacks"] == 1);
}

// Slot `slot` was rolled back twice and then fenced as corrupt (and its
// standby finished in its place), nothing was skipped, and the 4-rank job
// ended with the fault-free model.
void CheckCorruptedTwice(const JobRun& r, int slot) {
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(r.rc == 0);
  CheckFinished(r, 4, 40);
  CHECK_KINDS(r, {"numeric", "numeric", "corruption"});
  for (const json& i : r.summary["incidents"]) CHECK(i["slot"] == slot);
  CHECK(r.summary["skipped_data"].empty());
  CHECK(r.hashes.at(0) == FaultFreeHash());
  CHECK(holdfast::test::CountExits(r, "exited with code 3") == 1);  // fenced
}

// Flips the lowest bit of the middle byte of slot `slot`'s parameters from
// outside its process (/proc/PID/mem, as a bad DIMM or a stray DMA would),
// once the worker has done `step` steps in the job of `dir` (the trainer
// runs with --progress-dir DIR, where it says where its parameters are).
// Whether it was written.
bool FlipFromOutside(const std::string& dir, int slot, int64_t step) {
  const pid_t pid = AwaitWorker(dir, slot, step);
  if (pid <= 0) return false;
  std::ifstream where(absl::StrCat(dir, "/progress/state-", pid));
  std::string name;
  uint64_t addr = 0;
  size_t bytes = 0;
  if (!(where >> name >> addr >> bytes) || bytes == 0) return false;
  const int fd = ::open(absl::StrCat("/proc/", pid, "/mem").c_str(), O_RDWR);
  if (fd < 0) return false;
  const off_t at = static_cast<off_t>(addr + bytes / 2);
  uint8_t b = 0;
  bool ok = ::pread(fd, &b, 1, at) == 1;
  b ^= 1;
  ok = ok && ::pwrite(fd, &b, 1, at) == 1;
  ::close(fd);
  return ok;
}

}  // namespace

TEST_CASE(
    "gray: a rank throttled from outside is replaced under the replace "
    "policy and only it") {
  // The OS-like throttle: slot 2's process runs 20 ms of every 60 (SIGSTOP
  // and SIGCONT by pid), so its step's own work takes about 3x its
  // peers'. The standby that replaces it runs at full speed.
  const std::string dir = holdfast::proc::MakeTempDir();
  DutyCycle throttle(dir, 2);
  JobRun r = Launch({"-n", "4", "--standby", "1", "--stragglers", "replace",
                     "--silent-after-ms", "5000"},
                    {"--steps", "80", "--step-ms", "20"}, "", dir);
  throttle.Stop();
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(throttle.pid() > 0);
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

// The job ended at generation 0 with every slot's fault-free hash after
// `steps`, and one incident: slot `slot` reported a straggler, not
// fenced.
void CheckReportedStraggler(const JobRun& r, int slot, int steps) {
  REQUIRE(r.rc == 0);
  CheckFinished(r, 4, steps);
  CHECK(r.hashes.at(0) == FaultFreeHash(steps));
  const json& incidents = r.summary["incidents"];
  REQUIRE(incidents.size() == 1);
  CHECK(incidents[0]["kind"] == "straggler");
  CHECK(incidents[0]["slot"] == slot);
  CHECK(incidents[0]["evicted"] == false);
  CHECK(r.summary["generation"] == 0);
}

TEST_CASE(
    "gray: a rank capped at 10 % of a core by the cgroup cpu controller is "
    "reported a straggler and nobody is fenced") {
  // The trainer burns its compute (--burn: CPU time, not a sleep), so the
  // quota slows it. 10 %, not the 25 % of issue 56's measurement: on a
  // 2-core machine running this job's four ranks and another test's, each
  // process gets about a third of a core, so a 25 % cap barely stands out
  // (missed in 2 of 3 runs beside another job).
  const std::string dir = holdfast::proc::MakeTempDir();
  CpuQuota quota(dir, 1, 10);
  if (!quota.ok()) {
    WARN("skipped: cannot set up a cgroup under "
         << CpuQuota::kRoot
         << " (root and the cgroup v1 cpu controller are needed)");
    std::exit(77);  // CTest: skipped
  }
  JobRun r = Launch({"-n", "4", "--silent-after-ms", "5000"},
                    {"--steps", "150", "--step-ms", "10", "--burn"}, "", dir);
  quota.Stop();
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(quota.pid() > 0);
  REQUIRE(quota.moved());
  CheckReportedStraggler(r, 1, 150);
}

TEST_CASE(
    "gray: a rank stopped 60 ms of every 100 from outside is reported a "
    "straggler and nobody is fenced") {
  // Slow on some steps and not the next: its step after a stop is long,
  // the one between two stops is not (the duty cycle of issue 56, which
  // raised no incident while the rule wanted 8 slow steps in a row).
  const std::string dir = holdfast::proc::MakeTempDir();
  DutyCycle throttle(dir, 1, 60, 100);
  JobRun r = Launch({"-n", "4", "--silent-after-ms", "5000"},
                    {"--steps", "160", "--step-ms", "20"}, "", dir);
  throttle.Stop();
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(throttle.pid() > 0);
  CheckReportedStraggler(r, 1, 160);
}

TEST_CASE(
    "gray: 20 % step-time noise on every rank raises no straggler and a "
    "rank 1.5x slower under it is reported") {
  // Each rank's compute is 20 ms times 1 +- 0.2 (its own draw per step).
  JobRun quiet = Launch(
      {"-n", "4"}, {"--steps", "150", "--step-ms", "20", "--noise", "0.2"});
  INFO("quiet summary: " << quiet.summary.dump(1));
  REQUIRE(quiet.rc == 0);
  CheckFinished(quiet, 4, 150);
  CHECK(quiet.summary["incidents"].empty());
  // The same, with 10 ms more on slot 2 from step 5.
  JobRun r = Launch({"-n", "4", "--inject", "slow:slot=2:ms=10:step=5"},
                    {"--steps", "150", "--step-ms", "20", "--noise", "0.2"});
  INFO("summary: " << r.summary.dump(1));
  CheckReportedStraggler(r, 2, 150);
}

TEST_CASE(
    "gray: a rank three times slower than its peers is reported a "
    "straggler and nobody is fenced") {
  JobRun r = Launch(
      {"-n", "4", "--standby", "1", "--inject", "slow:slot=2:ms=40:step=5"},
      {"--steps", "40", "--step-ms", "20"});
  INFO("summary: " << r.summary.dump(1));
  CheckReportedStraggler(r, 2, 40);
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

TEST_CASE(
    "gray: a NaN in one rank's gradients rolls the job back and skips its "
    "data and the model equals the reference run's") {
  JobRun r =
      Launch({"-n", "4", "--standby", "1", "--inject", "nan:slot=1:step=15"},
             {"--steps", "40", "--step-ms", "10"});
  // Slot 1 is the source, named by its own check.
  CheckOneRollback(r, 4, 40, 1);
  // Batch 15 is data position 14: [14, 15) is skipped.
  CHECK(SkipArg(r.summary) == "14:15");
  CHECK(r.hashes.at(0) == ReferenceHash("14:15"));
  // A rollback that did not skip would give the fault-free model instead.
  CHECK(r.hashes.at(0) != FaultFreeHash());
}

TEST_CASE(
    "gray: a loss spike seen by one rank rolls the job back and skips its "
    "data") {
  JobRun r =
      Launch({"-n", "4", "--inject", "spike:slot=2:step=20"},
             {"--steps", "40", "--step-ms", "10", "--spike-factor", "10"});
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(r.rc == 0);
  CheckFinished(r, 4, 40);
  REQUIRE(r.summary["incidents"].size() == 1);
  CHECK(r.summary["incidents"][0]["kind"] == "numeric");
  CHECK(r.summary["rollbacks"] == 1);
  CHECK(SkipArg(r.summary) == "19:20");
  CHECK(r.hashes.at(0) == ReferenceHash("19:20"));
}

TEST_CASE(
    "gray: a rank that is the source of NaNs at two different data is "
    "replaced and only the first data is skipped") {
  JobRun r = Launch({"-n", "4", "--standby", "1", "--inject",
                     "nan:slot=1:step=10,nan:slot=1:step=25"},
                    {"--steps", "40", "--step-ms", "10"});
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(r.rc == 0);
  CheckFinished(r, 4, 40);
  int numeric = 0, corruption = 0;
  for (const json& i : r.summary["incidents"]) {
    CHECK(i["slot"] == 1);
    if (i["kind"] == "numeric") {
      ++numeric;
      CHECK_FALSE(i["evicted"].get<bool>());
    } else {
      CHECK(i["kind"] == "corruption");
      CHECK(i["evicted"].get<bool>());
      ++corruption;
    }
  }
  CHECK(numeric == 2);
  CHECK(corruption == 1);
  CHECK(r.summary["rollbacks"] == 2);
  // The second NaN came from the rank, not from the data.
  CHECK(SkipArg(r.summary) == "9:10");
  CHECK(r.hashes.at(0) == ReferenceHash("9:10"));
  CHECK(holdfast::test::CountExits(r, "exited with code 3") == 1);  // fenced
}

TEST_CASE(
    "gray: a rank throttled from outside for the whole run lowers the ETTR "
    "by the time lost") {
  // A fault-free run first: its ETTR is near 1.
  JobRun clean = Launch({"-n", "3"}, {"--steps", "60", "--step-ms", "20"});
  INFO("clean summary: " << clean.summary.dump(1));
  REQUIRE(clean.rc == 0);
  CHECK(clean.summary.value("ettr", 0.0) > 0.8);
  // Slot 2's process runs 20 ms of every 60 (SIGSTOP and SIGCONT by pid)
  // from its start to the end, so every step waits for it; stragglers are
  // only reported. Counting the slowed steps whole (ettr_step_time), the
  // job looked productive; at the healthy pace it is not.
  const std::string dir = holdfast::proc::MakeTempDir();
  DutyCycle throttle(dir, 2);
  JobRun r = Launch({"-n", "3", "--silent-after-ms", "5000"},
                    {"--steps", "60", "--step-ms", "20"}, "", dir);
  throttle.Stop();
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(throttle.pid() > 0);
  REQUIRE(r.rc == 0);
  CheckFinished(r, 3, 60);
  CHECK(r.summary.value("ettr_step_time", 0.0) > 0.8);
  CHECK(r.summary.value("healthy_pace", 1.0) < 0.7);
  CHECK(r.summary.value("ettr", 1.0) < 0.7);
}

TEST_CASE(
    "gray: a bit flipped at rest in one rank's parameters is named by the "
    "replica check and rolled back and the model is the fault-free one") {
  JobRun r = Launch(
      {"-n", "4", "--standby", "1", "--inject", "bitflip:slot=1:step=15"},
      {"--steps", "40", "--step-ms", "10", "--replica-check-every", "1"});
  CheckOneRollback(r, 4, 40, 1);
  CHECK(r.summary["skipped_data"].empty());
  CHECK(r.hashes.at(0) == FaultFreeHash());
}

TEST_CASE(
    "gray: with the replica check off a bit flipped at rest goes unseen and "
    "the ranks end with different models") {
  JobRun r = Launch(
      {"-n", "4", "--inject", "bitflip:slot=1:step=15"},
      {"--steps", "40", "--step-ms", "10", "--replica-check-every", "0"});
  INFO("summary: " << r.summary.dump(1));
  // Only the launcher's check of the final state sees it (exit code 5).
  CHECK(r.rc == 5);
  CHECK(r.summary.dump().find("replicated state differs at the end") !=
        std::string::npos);
  CHECK(r.summary["incidents"].empty());
  REQUIRE(r.hashes.size() == 4);
  // (The lines come in the order the slots finished.)
  CHECK(std::set<std::string>(r.hashes.begin(), r.hashes.end()).size() == 2);
}

TEST_CASE(
    "gray: a rank whose replicated state is corrupted twice is replaced by "
    "the standby and the model is the fault-free one") {
  JobRun r = Launch(
      {"-n", "4", "--standby", "1", "--inject",
       "bitflip:slot=1:step=10,bitflip:slot=1:step=25"},
      {"--steps", "40", "--step-ms", "10", "--replica-check-every", "1"});
  CheckCorruptedTwice(r, 1);
}

TEST_CASE(
    "gray: a bit written into one rank's parameters from outside its "
    "process is named and rolled back and the model is the fault-free "
    "one") {
  if (::geteuid() != 0) {
    WARN("skipped: writing another process's memory needs root");
    std::exit(77);  // CTest: skipped
  }
  const std::string dir = holdfast::proc::MakeTempDir();
  ::mkdir((dir + "/progress").c_str(), 0755);
  std::atomic<bool> flipped{false};
  std::thread writer([&] { flipped = FlipFromOutside(dir, 2, 60); });
  JobRun r =
      Launch({"-n", "3"},
             {"--steps", "150", "--step-ms", "10", "--replica-check-every", "1",
              "--progress-dir", dir + "/progress"},
             "", dir);
  writer.join();
  REQUIRE(flipped);
  CheckOneRollback(r, 3, 150, 2);
  CHECK(r.summary["skipped_data"].empty());
  CHECK(r.hashes.at(0) == holdfast::test::FaultFreeHash(
                              3, {"--steps", "150", "--step-ms", "10"}, 150));
}

// ---- A bit flipped in one rank's gradients, before the all-reduce ----------

TEST_CASE(
    "gray: a bit flipped in one rank's gradients before the all-reduce is "
    "named from the slots' norms, rolled back skipping nothing, and the "
    "model is the fault-free one") {
  JobRun r = Launch(
      {"-n", "4", "--standby", "1", "--inject", "gradflip:slot=1:step=15"},
      {"--steps", "40", "--step-ms", "10"});
  CheckOneRollback(r, 4, 40, 1);
  CHECK_THAT(r.summary["incidents"][0]["evidence"].get<std::string>(),
             Catch::Contains("local gradient norms of step 15: slot 1's"));
  CHECK(r.summary["skipped_data"].empty());
  CHECK(r.hashes.at(0) == FaultFreeHash());
}

TEST_CASE(
    "gray: with the gradient check off a bit flipped in one rank's "
    "gradients is not traced to it and the model is not the fault-free "
    "one") {
  JobRun r = Launch({"-n", "4", "--gradient-outlier-factor", "0", "--inject",
                     "gradflip:slot=1:step=15"},
                    {"--steps", "40", "--step-ms", "10"});
  INFO("summary: " << r.summary.dump(1));
  // The all-reduce spread it: whatever the job saw afterwards (a NaN on
  // every slot, a step's data blamed), it did not see the flip.
  CHECK(r.summary.dump().find("gradient norms") == std::string::npos);
  REQUIRE_FALSE(r.hashes.empty());
  CHECK(r.hashes.at(0) != FaultFreeHash());
}

TEST_CASE(
    "gray: a rank whose gradients are corrupted twice is replaced by the "
    "standby and the model is the fault-free one") {
  JobRun r = Launch({"-n", "4", "--standby", "1", "--inject",
                     "gradflip:slot=1:step=10,gradflip:slot=1:step=25"},
                    {"--steps", "40", "--step-ms", "10"});
  CheckCorruptedTwice(r, 1);
}

TEST_CASE(
    "gray: gradients far off because of a rank's own data are told from a "
    "flip by the replay: the data is skipped, nobody is replaced, and the "
    "model is the reference run's") {
  // Batch 20's first sample, read by slot 0, has a label 1e5 off.
  JobRun r = Launch({"-n", "4", "--standby", "1"},
                    {"--steps", "40", "--step-ms", "10", "--bad-batch", "20"});
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(r.rc == 0);
  CheckFinished(r, 4, 40);
  CHECK_KINDS(r, {"numeric", "numeric"});
  for (const json& i : r.summary["incidents"]) {
    CHECK(i["slot"] == 0);
    CHECK_FALSE(i["evicted"].get<bool>());
  }
  CHECK_THAT(r.summary["incidents"][1]["evidence"].get<std::string>(),
             Catch::Contains("the same again when the step was redone"));
  CHECK(SkipArg(r.summary) == "19:20");
  CHECK(r.hashes.at(0) == ReferenceHash("19:20"));
}
