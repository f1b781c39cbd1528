// Whole jobs on the NCCL backend: holdfast-run with the example trainer
// built as holdfast-dp-trainer-nccl and HOLDFAST_BACKEND=nccl, so the
// training communicator of every generation is an NCCL one on the GPU.
// Real faults (SIGKILL, SIGSTOP) on real processes; the survivors must
// rebuild the NCCL communicator and end with the fault-free run's hash.
//
// Every process uses device 0, so one GPU is enough. NCCL refuses two
// ranks of one communicator on the same device of the same host, so each
// process names its own host (NCCL_HOSTID, set per process by a wrapper
// script) and the ranks talk over NCCL's socket transport on loopback.
//
// Without a CUDA device the program exits 77, which CTest reports as
// skipped.
#define CATCH_CONFIG_RUNNER
#include <signal.h>
#include <sys/stat.h>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "holdfast/nccl.h"
#include "test/support/members_json.h"
#include "test/support/process_group.h"

namespace {

// The trainer, started through a script that gives each process its own
// NCCL host id.
std::string Trainer() {
  static const std::string path = [] {
    const std::string p = holdfast::proc::MakeTempDir() + "/dp-trainer-nccl.sh";
    std::ofstream out(p);
    out << "#!/bin/sh\nNCCL_HOSTID=holdfast-$$ exec "
        << HOLDFAST_DP_TRAINER_NCCL_BIN << " \"$@\"\n";
    out.close();
    chmod(p.c_str(), 0755);
    return p;
  }();
  return path;
}

}  // namespace

#define HOLDFAST_DP_TRAINER_BIN Trainer()
#include "test/support/job_run.h"

namespace {

using holdfast::test::CheckFinished;
using holdfast::test::JobRun;
using holdfast::test::Launch;

const std::vector<std::string> kTrainer = {"--steps", "30"};

std::string Reference(const std::vector<std::string>& trainer) {
  JobRun r = Launch({"-n", "3"}, trainer);
  REQUIRE(r.rc == 0);
  CheckFinished(r, 3, 30);
  CHECK(r.summary["incidents"].empty());
  return r.hashes[0];
}

// A run of holdfast-run `args` (3 slots, 1 standby, one fault: on two a
// sum's operands commute, and an order that changed would go unseen) ends
// with every slot at step 30, the fault-free run's hash and one incident
// of `kind`.
void ExpectFaultFreeHash(const std::vector<std::string>& args,
                         const std::vector<std::string>& trainer,
                         const std::string& kind) {
  const std::string ref = Reference(trainer);
  JobRun r = Launch(args, trainer);
  CHECK(r.rc == 0);
  CheckFinished(r, 3, 30);
  CHECK(r.hashes[0] == ref);
  CHECK_KINDS(r, {kind});
}

// As ExpectFaultFreeHash, with the fault sent from outside: `sig` to
// slot `slot`'s process, found by its pid in holdfast-run's members.json
// once it reached step `step` (a stopped process is killed afterwards, if
// holdfast-run left it).
void ExpectFaultFreeHashAfterSignal(const std::vector<std::string>& args,
                                    const std::vector<std::string>& trainer,
                                    int slot, int64_t step, int sig,
                                    const std::string& kind) {
  const std::string ref = Reference(trainer);
  const std::string dir = holdfast::proc::MakeTempDir();
  pid_t pid = -1;
  std::thread signaller([&] {
    pid = holdfast::test::AwaitWorker(dir, slot, step);
    if (pid > 0) ::kill(pid, sig);
  });
  JobRun r = Launch(args, trainer, "", dir);
  signaller.join();
  REQUIRE(pid > 0);
  if (sig == SIGSTOP) ::kill(pid, SIGKILL);
  CHECK(r.rc == 0);
  CheckFinished(r, 3, 30);
  CHECK(r.hashes[0] == ref);
  CHECK_KINDS(r, {kind});
}

}  // namespace

TEST_CASE(
    "nccl job: a rank killed from outside by its pid is replaced and the "
    "NCCL run ends with its fault-free hash",
    "[gpu]") {
  ExpectFaultFreeHashAfterSignal({"-n", "3", "--standby", "1"},
                                 {"--steps", "30", "--step-ms", "30"}, 2, 8,
                                 SIGKILL, "crashed");
}

TEST_CASE(
    "nccl job: a rank stopped from outside by its pid is declared silent, "
    "replaced, and the NCCL run ends with its fault-free hash",
    "[gpu]") {
  ExpectFaultFreeHashAfterSignal(
      {"-n", "3", "--standby", "1", "--silent-after-ms", "1500"},
      {"--steps", "30", "--step-ms", "30"}, 1, 8, SIGSTOP, "silent");
}

TEST_CASE(
    "nccl job: a killed rank is replaced and the NCCL run ends with "
    "its fault-free hash",
    "[gpu]") {
  ExpectFaultFreeHash(
      {"-n", "3", "--standby", "1", "--inject", "kill:slot=1:step=10"},
      kTrainer, "crashed");
}

TEST_CASE(
    "nccl job: after a kill every slot's new NCCL communicator connects its "
    "peers while the state is restored, not in the first step",
    "[gpu]") {
  const std::string ref = Reference(kTrainer);
  setenv("HOLDFAST_LOG_LEVEL", "info", 1);
  JobRun r =
      Launch({"-n", "3", "--standby", "1", "--inject", "kill:slot=1:step=10"},
             kTrainer);
  unsetenv("HOLDFAST_LOG_LEVEL");
  CHECK(r.rc == 0);
  CheckFinished(r, 3, 30);
  CHECK(r.hashes[0] == ref);
  CHECK_KINDS(r, {"crashed"});
  // NcclBackend::AwaitPreconnect's line, one per slot and generation.
  static const std::regex kConnected(
      R"(rank (\d+) of 3 \(generation (\d+)\): peers connected (\d+) ms )"
      R"(after init[^;]*; the first call waited (\d+) ms)");
  std::set<int> slots;
  for (std::sregex_iterator it(r.err.begin(), r.err.end(), kConnected), end;
       it != end; ++it) {
    if (std::stoll((*it)[2]) == 0) continue;
    const int64_t connected = std::stoll((*it)[3]);
    const int64_t waited = std::stoll((*it)[4]);
    std::printf(
        "nccl_job_test: rank %s, generation %s: connected %lld ms "
        "after init, the first call waited %lld ms\n",
        std::string((*it)[1]).c_str(), std::string((*it)[2]).c_str(),
        static_cast<long long>(connected), static_cast<long long>(waited));
    CHECK(waited <= connected);
    slots.insert(std::stoi((*it)[1]));
  }
  INFO("stderr: " << r.err.substr(r.err.size() > 8000 ? r.err.size() - 8000
                                                      : 0));
  CHECK(slots == std::set<int>{0, 1, 2});
}

TEST_CASE(
    "nccl job: a frozen rank 0 is declared silent, replaced, and the "
    "NCCL run ends with its fault-free hash",
    "[gpu]") {
  ExpectFaultFreeHash({"-n", "3", "--standby", "1", "--silent-after-ms", "1500",
                       "--inject", "hang:slot=0:step=10"},
                      kTrainer, "silent");
}

TEST_CASE(
    "nccl job: ZeRO-1 with a killed rank all-gathers over NCCL and ends "
    "with its fault-free hash",
    "[gpu]") {
  std::vector<std::string> trainer = kTrainer;
  trainer.push_back("--zero1");
  ExpectFaultFreeHash({"-n", "3", "--standby", "1", "--replicas", "1",
                       "--inject", "kill:slot=0:step=12"},
                      trainer, "crashed");
}

TEST_CASE(
    "nccl job: in shrink mode the survivors finish on a fresh NCCL "
    "communicator",
    "[gpu]") {
  JobRun r = Launch({"-n", "3", "--mode", "shrink", "--min-world", "1",
                     "--inject", "kill:slot=2:step=10"},
                    kTrainer);
  CHECK(r.rc == 0);
  CheckFinished(r, 2, 30);
  CHECK_KINDS(r, {"crashed"});
}

int main(int argc, char** argv) {
  if (holdfast::nccl::DeviceCount() < 1) {
    std::printf("nccl_job_test: no CUDA device: skipping\n");
    return 77;
  }
  // Every process on device 0, over NCCL's socket transport on loopback
  // (see the top of this file).
  setenv("HOLDFAST_BACKEND", "nccl", 1);
  setenv("HOLDFAST_DEVICE", "0", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("NCCL_IB_DISABLE", "1", 1);
  return Catch::Session().run(argc, argv);
}
