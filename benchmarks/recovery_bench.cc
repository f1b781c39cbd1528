// Recovery benchmark: how long a job needs to get back to training after a
// rank is SIGKILLed, in process (holdfast) against what users do today
// (stop every process, start them all again, load a checkpoint file).
//
// For each world size N and state size M it runs, through holdfast-run and
// the example trainer (examples/cpp/dp_trainer.cc, --state-mb M):
//   1. holdfast: N workers + 1 standby; slot 1 is killed in step K
//      (--kill-step, 5 unless given; the job runs K + 3 steps),
//      once step --committed C (1 unless given) or a later one is committed,
//      and --kill-ms D later (0 unless given); the others wait in the
//      step meanwhile. With the default 20 ms steps the backups lag (a
//      round of a large state takes longer than a step, so snapshots are
//      skipped): the restored step is older than the survivors' and every
//      member receives what it lacks of it. With --committed 4 and
//      --step-ms long enough for a backup round, the survivors still hold
//      the restored step live and only the standby receives. (Without the
//      wait, a kill at step 5 restored the initial state of step 0, which
//      a fresh standby holds already.) From the launcher's
//      summary.json and its log (every rank's output, hf.err): the
//      detection time (from the kill, which the fault injector logs with
//      its Unix time, to the controller's detection), the stages of the
//      recovery as the members saw them (abort, new generation agreed,
//      communicator rebuilt, state restored: each member receives the
//      pieces of the committed step it needs and does not hold, first step
//      done) and the steps lost.
//   2. restart baseline, in the same run, also timed from the kill: the same
//      job (N workers, no standby, --min-world N) loses slot 1 the same
//      way and stops; the time from the kill to the controller's detection
//      ("detect" of the restart) is when a restart can begin (stopping the
//      survivors is taken as instant: a launcher would SIGKILL them rather
//      than wait for them to leave). Then a fresh job of N processes is
//      started with --load FILE (the final state of run 1, saved to a file)
//      and timed from its launch to its first step done ("relaunch"); the
//      baseline is the sum. This counts no scheduler, a checkpoint read
//      from the page cache and holdfast's own detection (a launcher
//      polling its children would see the death later), so it is a lower
//      bound on a real restart.
// Prints holdfast's recovery time (from the kill to the first step done),
// the baseline's detection part and total, and baseline / holdfast; and
// whether the standby was warm when the kill came (its "waiting for a
// slot" line; a standby still warming up, as NCCL's can for 2 s after the
// start on a GPU, makes the rebuild wait for it: give a later
// --kill-step).
//
//   recovery_bench [--ranks 2,4,8] [--state-mb 1,16,256,1024] [--json]
//                  [--step-ms 20] [--committed 1] [--kill-ms 0]
//                  [--kill-step 5]
//                  [--run BIN] [--trainer BIN] [--trainer-args "..."]
//
// The trainer fences its writes (BeginStateUpdate()), so by default its
// snapshots are copied during the next step, and one commits only once the
// step after it fenced: at a kill in a step's all-reduce the survivors'
// live state is a step past the committed one. --trainer-args
// "--snapshot-copy between-steps" copies them between the steps instead
// (the default before 2026-11-23).
#include <sys/sysinfo.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "test/support/process_group.h"

using nlohmann::json;

namespace {

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str(), nullptr, false);
}

// The Unix time (ms) at which the fault injector fired, from its log line
// "injecting fault '<spec>' ... (pid P, unix ms T)"; 0 if there is none.
int64_t FaultFiredMs(const std::string& log_path) {
  std::ifstream in(log_path);
  const std::string mark = "unix ms ";
  for (std::string line; std::getline(in, line);) {
    if (line.find("injecting fault 'kill") == std::string::npos) continue;
    const size_t at = line.rfind(mark);
    if (at == std::string::npos) continue;
    return std::strtoll(line.c_str() + at + mark.size(), nullptr, 10);
  }
  return 0;
}

// Milliseconds from the standby's "waiting for a slot" line (its warm-up
// done) to the kill at `killed_unix_ms`, from the line's local timestamp;
// negative where it came after the kill, nullopt where there is none.
std::optional<int64_t> StandbyWarmBeforeKillMs(const std::string& log_path,
                                               int64_t killed_unix_ms) {
  std::ifstream in(log_path);
  for (std::string line; std::getline(in, line);) {
    if (line.find("runtime: standby, waiting for a slot") == std::string::npos)
      continue;
    // "[standby] 2026-11-28T06:45:08.125 holdfast[3281] info: ..."
    const size_t from = line.find("] ");
    const size_t to = line.find(" holdfast[");
    if (from == std::string::npos || to == std::string::npos || to <= from) {
      continue;
    }
    absl::Time t;
    std::string err;
    if (!absl::ParseTime("%Y-%m-%dT%H:%M:%E*S",
                         line.substr(from + 2, to - from - 2),
                         absl::LocalTimeZone(), &t, &err)) {
      continue;
    }
    return killed_unix_ms - absl::ToUnixMillis(t);
  }
  return std::nullopt;
}

int System(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

struct Result {
  int ranks = 0;
  int64_t state_mb = 0;
  bool ok = false;
  std::string error;
  int64_t detect_ms = 0, abort_ms = 0, agree_ms = 0, rebuild_ms = 0,
          restore_ms = 0, first_step_ms = 0;
  // Of the first step: the wait, after the restore, for a training
  // communicator built during it (NCCL, HOLDFAST_SIDE_EXCHANGES).
  int64_t comm_wait_ms = 0;
  int64_t recovery_ms = 0;  // from the kill to the first step done
  // The controller's own figure: from the rank's last heartbeat, which
  // may be before the kill.
  int64_t since_heartbeat_ms = 0;
  int64_t baseline_ms = 0;        // from the kill: detect + relaunch
  int64_t restart_detect_ms = 0;  // from the kill to the detection
  int64_t lost_steps = 0;
  int64_t restored_step = 0;
  std::optional<int64_t> standby_warm_ms;  // StandbyWarmBeforeKillMs
};

// How each run is driven: the trainer's step, the kill's condition.
struct Plan {
  int64_t step_ms = 20;
  int64_t committed = 1;
  int64_t kill_ms = 0;
  int64_t kill_step = 5;
};

Result Measure(const std::string& run, const std::string& trainer, int n,
               const std::string& extra_args, int64_t mb, const Plan& plan) {
  Result r;
  r.ranks = n;
  r.state_mb = mb;
  const std::string dir = holdfast::proc::MakeTempDir();
  const std::string ckpt = dir + "/checkpoint.bin";
  // Enough steps that the kill lands after a few committed snapshots.
  const int64_t steps = plan.kill_step + 3;
  const std::string trainer_args =
      absl::StrCat(extra_args.empty() ? "" : " ", extra_args, " --state-mb ",
                   mb, " --step-ms ", plan.step_ms, " --steps ");
  const std::string inject =
      absl::StrCat(" --inject kill:slot=1:step=", plan.kill_step,
                   ":committed=", plan.committed,
                   plan.kill_ms > 0 ? absl::StrCat(":ms=", plan.kill_ms) : "");
  // Info: the standby's "waiting for a slot" line.
  const std::string hf =
      absl::StrCat("HOLDFAST_LOG_LEVEL=info ", run, " -n ", n,
                   " --no-disk-tier --standby 1 --log-dir ", dir, "/hf", inject,
                   " -- ", trainer, trainer_args, steps, " --save ", ckpt,
                   " > ", dir, "/hf.out 2> ", dir, "/hf.err");
  if (System(hf) != 0) {
    r.error = absl::StrCat("holdfast run failed; see ", dir, "/hf.err");
    return r;
  }
  json s = ReadJson(dir + "/hf/summary.json");
  if (s.is_discarded() || s["incidents"].empty() || s["recoveries"].empty()) {
    r.error = absl::StrCat("no recovery recorded; see ", dir);
    return r;
  }
  const json& inc = s["incidents"][0];
  const json& rec = s["recoveries"][0];
  auto at = [&](const char* k) { return rec.value(k, int64_t{0}); };
  r.since_heartbeat_ms = inc.value("detect_ms", int64_t{0});
  r.lost_steps = rec.value("lost_steps", int64_t{0});
  r.restored_step = rec.value("restored_step", int64_t{0});
  const int64_t detected = inc.value("detected_unix_ms", int64_t{0});
  const int64_t killed = FaultFiredMs(dir + "/hf.err");
  if (killed <= 0) {
    r.error = absl::StrCat("no kill time in the job's log (hf.err); see ", dir);
    return r;
  }
  if (detected < killed) {
    r.error = absl::StrCat("detected at ", detected, " before the kill at ",
                           killed, " (unix ms); see ", dir);
    return r;
  }
  r.detect_ms = detected - killed;
  r.standby_warm_ms = StandbyWarmBeforeKillMs(dir + "/hf.err", killed);
  // The member's view starts when it saw the failure (at or a little after
  // the detection); stages are measured from there.
  r.abort_ms = at("aborted_ms") - at("seen_ms");
  r.agree_ms = at("agreed_ms") - at("aborted_ms");
  r.rebuild_ms = at("rebuilt_ms") - at("agreed_ms");
  r.restore_ms = at("restored_ms") - at("rebuilt_ms");
  r.first_step_ms = at("first_step_ms") - at("restored_ms");
  r.comm_wait_ms = std::max<int64_t>(0, at("comm_up_ms") - at("restored_ms"));
  r.recovery_ms = at("first_step_ms") - killed;

  // The restart baseline: the same loss stops the job (it exits non-zero),
  // then a fresh job from the file, to its first step.
  (void)System(absl::StrCat("HOLDFAST_LOG_LEVEL=warn ", run, " -n ", n,
                            " --no-disk-tier --min-world ", n, " --log-dir ",
                            dir, "/stop", inject, " -- ", trainer, trainer_args,
                            steps, " > ", dir, "/stop.out 2> ", dir,
                            "/stop.err"));
  const int64_t t0 = absl::ToUnixMillis(absl::Now());
  const int64_t stop_killed = FaultFiredMs(dir + "/stop.err");
  json stopped = ReadJson(dir + "/stop/summary.json");
  const int64_t stop_detected =
      stopped.is_object() && stopped.value("outcome", "") == "stopped" &&
              !stopped["incidents"].empty()
          ? stopped["incidents"][0].value("detected_unix_ms", int64_t{0})
          : 0;
  if (stop_killed <= 0 || stop_detected < stop_killed) {
    r.error =
        absl::StrCat("restart baseline: the loss did not stop the job; see ",
                     dir, "/stop.err");
    return r;
  }
  const std::string base = absl::StrCat(
      "HOLDFAST_LOG_LEVEL=warn ", run, " -n ", n, " --no-disk-tier --log-dir ",
      dir, "/base -- ", trainer, trainer_args, 1, " --load ", ckpt, " > ", dir,
      "/base.out 2> ", dir, "/base.err");
  if (System(base) != 0) {
    r.error = absl::StrCat("restart baseline failed; see ", dir, "/base.err");
    return r;
  }
  json b = ReadJson(dir + "/base/summary.json");
  const int64_t first =
      b.is_object() && b.contains("final")
          ? b["final"].value("first_step_done_unix_ms", int64_t{0})
          : 0;
  if (first <= 0) {
    r.error =
        absl::StrCat("restart baseline left no first-step time; see ", dir);
    return r;
  }
  r.restart_detect_ms = stop_detected - stop_killed;
  r.baseline_ms = r.restart_detect_ms + (first - t0);
  r.ok = true;
  System(absl::StrCat("rm -rf ", dir));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"holdfast recovery benchmark: in-process recovery vs restart"};
  std::vector<int> ranks = {2, 4, 8};
  std::vector<int64_t> sizes = {1, 16, 256, 1024};
  std::string run = HOLDFAST_RUN_BIN, trainer = HOLDFAST_DP_TRAINER_BIN;
  std::string trainer_args;
  bool as_json = false;
  Plan plan;
  app.add_option("--ranks", ranks, "world sizes")->delimiter(',');
  app.add_option("--state-mb", sizes, "state sizes in MiB")->delimiter(',');
  app.add_option("--run", run, "holdfast-run binary");
  app.add_option("--trainer", trainer, "trainer binary");
  app.add_option("--trainer-args", trainer_args,
                 "more arguments for the trainer (every run of it)");
  app.add_option("--step-ms", plan.step_ms,
                 "the trainer's compute time per step (--step-ms)")
      ->check(CLI::Range(int64_t{0}, int64_t{60000}));
  app.add_option("--committed", plan.committed,
                 "kill slot 1 once this step is committed (1 to 4)")
      ->check(CLI::Range(int64_t{1}, int64_t{4}));
  app.add_option("--kill-ms", plan.kill_ms, "and this many ms after that")
      ->check(CLI::Range(int64_t{0}, int64_t{60000}));
  app.add_option("--kill-step", plan.kill_step,
                 "kill slot 1 in this step (5 to 100000)")
      ->check(CLI::Range(int64_t{5}, int64_t{100000}));
  app.add_flag("--json", as_json, "print JSON");
  CLI11_PARSE(app, argc, argv);

  struct sysinfo si;
  sysinfo(&si);
  const double ram_mb =
      static_cast<double>(si.totalram) * si.mem_unit / (1 << 20);
  json out = json::array();
  if (!as_json) {
    std::printf("%5s %9s | %8s %7s %7s %8s %8s %8s %4s | %9s | %8s %9s %7s\n",
                "ranks", "state", "detect", "abort", "agree", "rebuild",
                "restore", "1st step", "lost", "recovery", "(detect)",
                "restart", "ratio");
  }
  for (int n : ranks) {
    for (int64_t mb : sizes) {
      // Each process (the standby too) holds the state, two snapshots of
      // its 1/N piece, its buddy's copies and, after a restore, the pieces
      // it received: about (1.5 + 5/N) times the state, a little more than
      // measured (4 x 1 GiB peaked at 11 GiB in use for the 5 processes).
      const double need_mb =
          static_cast<double>(mb) * (1.5 + 5.0 / n) * (n + 1);
      if (need_mb > 0.6 * ram_mb) {
        if (!as_json) {
          std::printf("%5d %6lld MiB | skipped: needs ~%.0f GiB of %.0f GiB\n",
                      n, static_cast<long long>(mb), need_mb / 1024,
                      ram_mb / 1024);
        }
        out.push_back({{"ranks", n}, {"state_mb", mb}, {"skipped", "memory"}});
        continue;
      }
      Result r = Measure(run, trainer, n, trainer_args, mb, plan);
      const double ratio =
          r.ok && r.recovery_ms > 0
              ? static_cast<double>(r.baseline_ms) / r.recovery_ms
              : 0;
      json j = {{"ranks", n},
                {"state_mb", mb},
                {"ok", r.ok},
                {"detect_ms", r.detect_ms},
                {"detect_since_heartbeat_ms", r.since_heartbeat_ms},
                {"abort_ms", r.abort_ms},
                {"agree_ms", r.agree_ms},
                {"rebuild_ms", r.rebuild_ms},
                {"restore_ms", r.restore_ms},
                {"first_step_ms", r.first_step_ms},
                {"comm_wait_ms", r.comm_wait_ms},
                {"lost_steps", r.lost_steps},
                {"step_ms", plan.step_ms},
                {"committed", plan.committed},
                {"kill_ms", plan.kill_ms},
                {"kill_step", plan.kill_step},
                {"standby_warm_before_kill_ms", r.standby_warm_ms.has_value()
                                                    ? json(*r.standby_warm_ms)
                                                    : json(nullptr)},
                {"trainer_args", trainer_args},
                {"restored_step", r.restored_step},
                {"recovery_ms", r.recovery_ms},
                {"restart_baseline_ms", r.baseline_ms},
                {"restart_detect_ms", r.restart_detect_ms},
                {"restart_relaunch_ms", r.baseline_ms - r.restart_detect_ms},
                {"baseline_over_holdfast", ratio}};
      if (!r.ok) j["error"] = r.error;
      out.push_back(j);
      if (as_json) continue;
      if (!r.ok) {
        std::printf("%5d %6lld MiB | error: %s\n", n,
                    static_cast<long long>(mb), r.error.c_str());
        continue;
      }
      std::printf(
          "%5d %6lld MiB | %5lld ms %4lld ms %4lld ms %5lld ms %5lld ms %5lld "
          "ms %4lld | "
          "%6lld ms | %5lld ms %6lld ms %6.1fx\n",
          n, static_cast<long long>(mb), static_cast<long long>(r.detect_ms),
          static_cast<long long>(r.abort_ms),
          static_cast<long long>(r.agree_ms),
          static_cast<long long>(r.rebuild_ms),
          static_cast<long long>(r.restore_ms),
          static_cast<long long>(r.first_step_ms),
          static_cast<long long>(r.lost_steps),
          static_cast<long long>(r.recovery_ms),
          static_cast<long long>(r.restart_detect_ms),
          static_cast<long long>(r.baseline_ms), ratio);
      if (r.standby_warm_ms.has_value() && *r.standby_warm_ms < 0) {
        std::printf(
            "      the standby was warm only %lld ms after the kill: its "
            "warm-up is in the rebuild (give a later --kill-step)\n",
            static_cast<long long>(-*r.standby_warm_ms));
      }
      std::fflush(stdout);
    }
  }
  if (as_json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
