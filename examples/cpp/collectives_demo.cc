// Collectives that never hang, shown with real faults.
//
// Starts N ranks as processes on loopback. Each runs AllReduce in a loop.
// Phase 1 SIGKILLs one rank; phase 2 SIGSTOPs one. Every survivor reports
// the status it observed and how long after the fault, then exits cleanly.
// The recovery issue turns this into the fault-tolerant training demo.
//
//   holdfast-collectives-demo [--ranks 4] [--victim 2] [--timeout-ms 2000]
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "holdfast/communicator.h"
#include "test/support/process_group.h"

using namespace holdfast;
using holdfast::proc::MonoNanos;
using holdfast::proc::ProcessGroup;
using holdfast::proc::Report;

namespace {

int Rank(const std::string& dir, int rank, int n, absl::Duration timeout) {
  auto store = NewFileStore(dir);
  if (!store.ok()) return 2;
  CommunicatorOptions o;
  o.rank = rank;
  o.size = n;
  o.timeout = timeout;
  o.trace_dir = dir;
  auto comm = Communicator::Create(*store, o);
  if (!comm.ok()) {
    Report("event=error msg=" + comm.status().ToString());
    return 3;
  }
  std::vector<float> grads(256 * 1024, static_cast<float>(rank + 1));  // 1 MiB
  for (long step = 0;; ++step) {
    absl::Status s = (*comm)
                         ->AllReduce(grads.data(), grads.size(),
                                     DataType::kFloat32, ReduceOp::kAverage)
                         ->Wait();
    if (!s.ok()) {
      Report("event=failed step=" + std::to_string(step) +
             " t=" + std::to_string(MonoNanos()) +
             " code=" + absl::StatusCodeToString(s.code()) +
             " msg=" + std::string(s.message()));
      comm->reset();
      return 0;
    }
    if (step == 20) Report("event=ready");
  }
}

void Phase(const char* title, int n, int victim, int sig,
           absl::Duration timeout) {
  std::printf(
      "\n== %s: %d ranks, AllReduce of 1 MiB in a loop, op timeout %s\n", title,
      n, absl::FormatDuration(timeout).c_str());
  const std::string dir = proc::MakeTempDir();
  ProcessGroup group(n, [&](int r) { return Rank(dir, r, n, timeout); });
  for (int r = 0; r < n; ++r) {
    if (!group.WaitEvent(r, "ready", absl::Seconds(60))) {
      std::printf("rank %d did not start\n", r);
      return;
    }
  }
  const int64_t fault_ns = MonoNanos();
  group.Signal(victim, sig);
  std::printf("sent %s to rank %d (pid %d)\n",
              sig == SIGKILL ? "SIGKILL" : "SIGSTOP", victim,
              group.pid(victim));
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    auto ev = group.WaitEvent(r, "failed", timeout + absl::Seconds(30));
    if (!ev) {
      std::printf("rank %d: no failure reported (BUG)\n", r);
      continue;
    }
    const double ms = (std::stoll((*ev)["t"]) - fault_ns) / 1e6;
    std::printf("rank %d: %-17s after %7.1f ms  %s\n", r, (*ev)["code"].c_str(),
                ms, (*ev)["msg"].c_str());
  }
  if (sig == SIGSTOP) group.Signal(victim, SIGKILL);
  auto exits = group.WaitAll(absl::Seconds(20));
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    std::printf("rank %d exited with code %d%s\n", r, exits[r].code,
                exits[r].timed_out ? " (hung: BUG)" : "");
  }
  // Show the end of one survivor's trace ring, dumped on abort.
  const int witness = victim == 0 ? 1 : 0;
  const std::string prefix = "trace-g0-r" + std::to_string(witness) + "-p" +
                             std::to_string(group.pid(witness)) + ".json";
  std::ifstream in(dir + "/" + prefix);
  if (!in) return;
  auto doc = nlohmann::json::parse(in, nullptr, false);
  if (!doc.is_object()) return;
  const auto& ops = doc["ops"];
  std::printf("last ops in rank %d's trace (%s):\n", witness,
              (dir + "/" + prefix).c_str());
  for (size_t i = ops.size() >= 3 ? ops.size() - 3 : 0; i < ops.size(); ++i) {
    const auto& op = ops[i];
    std::printf("  seq=%-5llu %-10s %-9s bytes=%-8llu state=%s\n",
                op["seq"].get<unsigned long long>(),
                op["op"].get<std::string>().c_str(),
                op["dtype"].get<std::string>().c_str(),
                op["bytes"].get<unsigned long long>(),
                op["state"].get<std::string>().c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"holdfast collectives demo: a peer killed, then a peer frozen"};
  int n = 4;
  int victim = 2;
  int timeout_ms = 2000;
  app.add_option("--ranks", n, "ranks to start")->check(CLI::Range(2, 16));
  app.add_option("--victim", victim, "rank to kill, then to freeze")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--timeout-ms", timeout_ms, "op deadline in milliseconds")
      ->check(CLI::Range(100, 600000));
  CLI11_PARSE(app, argc, argv);
  if (victim >= n) {
    std::fprintf(stderr, "--victim %d must be below --ranks %d\n", victim, n);
    return 2;
  }
  const absl::Duration timeout = absl::Milliseconds(timeout_ms);
  Phase("Phase 1: a peer is killed (SIGKILL)", n, victim, SIGKILL, timeout);
  Phase("Phase 2: a peer is frozen (SIGSTOP)", n, victim, SIGSTOP, timeout);
  return 0;
}
