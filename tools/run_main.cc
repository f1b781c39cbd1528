// holdfast-run: runs one fault-tolerant job on this machine.
//
//   holdfast-run -n N [--standby K] [--mode replace|shrink] [--min-world M]
//                [--inject SPEC]... [--log-dir DIR] [--hosts H] [--agent]
//                [--checkpoint-dir DIR | --no-disk-tier] [--fresh]
//                [--heartbeat-ms MS] [--silent-after-ms MS]
//                [--rendezvous-grace-ms MS] [--join-timeout-s S]
//                -- CMD ARGS...
//
// Starts the embedded controller, then K standbys and, once they have
// registered, N workers (all the same CMD), with HOLDFAST_CONTROLLER,
// HOLDFAST_JOB_TOKEN and, for
// --inject, HOLDFAST_FAULTS set. Each output line is prefixed with the
// process's current slot. When the job ends it prints a summary (steps,
// incidents with detection and recovery time and lost steps, ETTR, the
// final state's hash) to stderr and to DIR/summary.json; while it runs,
// DIR/members.json maps processes (pids) to members.
//
// The disk tier is on by default, in .holdfast/checkpoints/<hash of CMD>
// under the working directory: a job that loses every memory copy (or
// the launcher itself) resumes from its newest disk checkpoint when the
// same command runs again. The directory is removed when the job finishes.
//
// Exit codes: 0 the job finished; 1 it stopped or failed; 2 bad usage.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "holdfast/status.h"
#include "src/control/controller/server.h"
#include "src/fault/fault.h"
#include "tools/launcher.h"

namespace holdfast::run {
namespace {

int Usage(const std::string& msg) {
  std::fprintf(stderr, "holdfast-run: %s\n", msg.c_str());
  return 2;
}

}  // namespace

std::optional<int> Launcher::ParseFlags(int argc, char** argv, Flags* f) {
  CLI::App app{"holdfast-run: run a fault-tolerant job on this machine"};
  app.add_option("-n,--nproc", f->n, "worker slots")->required();
  app.add_option("--standby", f->standby, "warm standbys")
      ->check(CLI::Range(0, 4096));
  app.add_option("--mode", f->mode, "replace or shrink")
      ->check(CLI::IsMember({"replace", "shrink"}));
  app.add_option("--min-world", f->min_world,
                 "stop the job below this many workers");
  app.add_option("--stragglers", f->stragglers,
                 "report a straggler, or replace it with a standby once it "
                 "has been slow for 16 steps (docs/gray-failures.md)")
      ->check(CLI::IsMember({"report", "replace"}));
  app.add_option("--inject", f->inject,
                 "fault spec, e.g. kill:slot=2:step=30 (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--log-dir", f->log_dir,
                 "write per-process logs and summary.json here");
  app.add_option("--hosts", f->hosts,
                 "fake host labels: workers' slots in H equal contiguous "
                 "blocks host0..host{H-1}, standbys spare0..")
      ->check(CLI::Range(0, 4096));
  app.add_flag("--agent", f->agent,
               "members reach the controller through a host agent per host "
               "label, as on a cluster (a stopped member is then found in "
               "under a second; docs/controller.md)");
  app.add_option("--replicas", f->replicas,
                 "copies of each checkpoint piece on buddies "
                 "(HOLDFAST_REPLICAS; default 1)")
      ->check(CLI::Range(1, 64));
  app.add_option("--verify-backups", f->verify_backups,
                 "when buddies check received copies: arrival or restore "
                 "(HOLDFAST_VERIFY_BACKUPS; default arrival)")
      ->check(CLI::IsMember({"arrival", "restore"}));
  app.add_option("--checkpoint-dir", f->checkpoint_dir,
                 "disk tier directory (HOLDFAST_CHECKPOINT_DIR; default "
                 ".holdfast/checkpoints/<hash of the command>, removed when "
                 "the job finishes)");
  app.add_flag("--no-disk-tier", f->no_disk_tier,
               "write no disk checkpoints (a job that loses every memory "
               "copy cannot be resumed)");
  app.add_flag("--fresh", f->fresh,
               "start from step 0: remove the disk tier's checkpoints first");
  app.add_option("--checkpoint-every", f->checkpoint_every,
                 "disk tier cadence in steps (HOLDFAST_CHECKPOINT_EVERY)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--heartbeat-ms", f->heartbeat_ms, "member heartbeat interval")
      ->check(CLI::Range(int64_t{10}, int64_t{60000}));
  app.add_option("--silent-after-ms", f->silent_ms,
                 "declare a member silent after this long")
      ->check(CLI::Range(int64_t{50}, int64_t{3600000}));
  app.add_option("--gradient-outlier-factor", f->gradient_outlier_factor,
                 "name a slot whose local gradient norm of a step is above "
                 "this many times the median of the others' (a bit flipped "
                 "in its gradients; docs/gray-failures.md); 0: off")
      ->check(holdfast::control::CheckGradientOutlierFactor);
  app.add_option("--rendezvous-grace-ms", f->rendezvous_grace_ms,
                 "leave out a member that does not come to a recovery's "
                 "rendezvous and does not answer, this long after the others "
                 "came")
      ->check(CLI::Range(int64_t{10}, int64_t{3600000}));
  app.add_option("--join-timeout-s", f->join_timeout_s,
                 "fail if not every process has joined the job by then")
      ->check(CLI::Range(int64_t{1}, int64_t{86400}));
  app.add_option("cmd", cmd_, "the trainer command (after --)")->required();
  app.allow_extras(false);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return std::nullopt;
}

std::optional<int> Launcher::CheckFlags(const Flags& f, std::string* faults) {
  const int n = f.n;
  if (n < 1 || n > 4096) {
    return Usage(absl::StrCat("-n ", n, " is out of range [1, 4096]"));
  }
  if (f.min_world < 1 || f.min_world > n) {
    return Usage(absl::StrCat("--min-world ", f.min_world,
                              " is out of range [1, ", n, "]"));
  }
  *faults = absl::StrJoin(f.inject, ",");
  absl::StatusOr<std::vector<fault::FaultSpec>> parsed = fault::Parse(*faults);
  if (!parsed.ok()) {
    return Usage(absl::StrCat("--inject: ", parsed.status().message()));
  }
  // Slots are 0..n-1 in every generation (a standby takes a lost slot's
  // number, a shrink renumbers below it): a fault on slot n or above would
  // never fire.
  for (const fault::FaultSpec& spec : *parsed) {
    if (spec.slot >= n) {
      return Usage(absl::StrCat(
          "--inject: fault spec '", spec.text, "' names slot ", spec.slot,
          ", but -n ", n, " has slots 0..", n - 1, ": it would never fire"));
    }
  }
  if (f.hosts > n) {
    return Usage(absl::StrCat("--hosts ", f.hosts, " is more than -n ", n,
                              ": a host would have no worker"));
  }
  if (!Resolves(cmd_[0])) {
    return Usage(
        absl::StrCat("command '", cmd_[0], "' not found or not executable"));
  }
  n_ = n;
  absl::StatusOr<std::string> disk =
      ChooseCheckpointDir(f.checkpoint_dir, f.no_disk_tier, f.fresh);
  if (!disk.ok()) return Usage(std::string(disk.status().message()));
  checkpoint_dir_ = *disk;
  log_dir_ = f.log_dir;
  if (!log_dir_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(log_dir_, ec);
    if (ec) {
      return Usage(absl::StrCat("--log-dir '", log_dir_, "': ", ec.message()));
    }
  }
  return std::nullopt;
}

std::vector<std::string> Launcher::ProcEnv(const Flags& f, int i,
                                           const std::string& token,
                                           const std::string& faults) const {
  const int n = f.n;
  const auto agent = agents_.find(HostOf(f, i));
  std::vector<std::string> env = {
      absl::StrCat("HOLDFAST_CONTROLLER=", agent != agents_.end()
                                               ? agent->second->address()
                                               : client_.address),
      absl::StrCat("HOLDFAST_JOB_TOKEN=", token),
      absl::StrCat("HOLDFAST_FAULTS=", faults),
  };
  if (f.replicas > 0) {
    env.push_back(absl::StrCat("HOLDFAST_REPLICAS=", f.replicas));
  }
  if (!f.verify_backups.empty()) {
    env.push_back(absl::StrCat("HOLDFAST_VERIFY_BACKUPS=", f.verify_backups));
  }
  // Set even when empty: --no-disk-tier wins over an inherited one.
  env.push_back(absl::StrCat("HOLDFAST_CHECKPOINT_DIR=", checkpoint_dir_));
  if (f.checkpoint_every > 0) {
    env.push_back(
        absl::StrCat("HOLDFAST_CHECKPOINT_EVERY=", f.checkpoint_every));
  }
  // Worker i asks for slot i (standbys for the standby role), so fault
  // specs and host labels name the same processes in every run.
  env.push_back(absl::StrCat("HOLDFAST_PREFERRED_SLOT=",
                             i < n ? absl::StrCat(i) : "standby"));
  if (f.hosts > 0) env.push_back(absl::StrCat("HOLDFAST_HOST=", HostOf(f, i)));
  if (!log_dir_.empty()) {
    env.push_back(absl::StrCat("HOLDFAST_TRACE_DIR=", log_dir_, "/trace"));
  }
  return env;
}

std::string Launcher::HostOf(const Flags& f, int i) {
  if (f.hosts <= 0) return "";
  return i < f.n ? absl::StrCat("host", static_cast<int64_t>(i) * f.hosts / f.n)
                 : absl::StrCat("spare", i - f.n);
}

absl::Status Launcher::StartAgents(const Flags& f, const std::string& token) {
  if (!f.agent) return absl::OkStatus();
  for (int i = 0; i < f.n + f.standby; ++i) {
    const std::string host = HostOf(f, i);
    if (agents_.count(host) > 0) continue;
    control::AgentOptions o;
    o.controller = client_.address;
    o.token = token;
    o.host = host;  // "": this machine's name
    HOLDFAST_ASSIGN_OR_RETURN(agents_[host], control::HostAgent::Start(o));
  }
  return absl::OkStatus();
}

absl::Status Launcher::SpawnAll(const Flags& f, const std::string& token,
                                const std::string& faults) {
  // Standbys first, and the workers once they have registered: a fault
  // early in the job then finds its standby in place, however long the
  // trainer takes to start (a Python process importing torch).
  std::vector<int> order;
  for (int i = f.n; i < f.n + f.standby; ++i) order.push_back(i);
  for (int i = 0; i < f.n; ++i) order.push_back(i);
  for (int i : order) {
    if (i == 0 && f.standby > 0) {
      HOLDFAST_RETURN_IF_ERROR(
          AwaitStandbys(f.standby, start_ + absl::Seconds(f.join_timeout_s)));
    }
    auto p = std::make_unique<Proc>();
    p->index = i;
    if (!log_dir_.empty()) {
      p->log.open(absl::StrCat(log_dir_, "/proc", i, ".log"));
    }
    HOLDFAST_RETURN_IF_ERROR(Spawn(*p, ProcEnv(f, i, token, faults)));
    procs_.push_back(std::move(p));
  }
  return absl::OkStatus();
}

std::pair<std::string, std::string> Launcher::Watch(const Flags& f,
                                                    StatusResponse* last) {
  std::string outcome, reason;
  absl::Time next_status = absl::InfinitePast();
  int max_seen = 0;
  while (outcome.empty()) {
    Pump(absl::Milliseconds(50));
    Reap();
    if (g_signal != 0) {
      return {"failed",
              absl::StrCat("interrupted by signal ", g_signal.load())};
    }
    if (absl::Now() < next_status && !AllExited()) continue;
    next_status = absl::Now() + absl::Milliseconds(200);
    auto s = FetchJob();
    if (!s.ok()) continue;
    *last = *s;
    RefreshLabels(*last);
    WriteMembers(*last);
    timeline_.Sample(*last, absl::Now());
    max_seen = std::max(max_seen, last->alive() + last->dead() + last->left());
    if (last->job_state() == control::JOB_FINISHED) {
      outcome = "finished";
    } else if (last->job_state() == control::JOB_STOPPED) {
      outcome = "stopped";
      reason = last->job_reason();
    } else if (AllExited()) {
      outcome = "failed";
      reason = max_seen == 0
                   ? "every process exited without joining the job (does the "
                     "command create a holdfast Runtime?)"
                   : "every process exited but the job did not finish";
    } else if (max_seen < f.n &&
               absl::Now() - start_ > absl::Seconds(f.join_timeout_s)) {
      outcome = "failed";
      reason = absl::StrCat("only ", max_seen, " of ", f.n,
                            " processes joined within ", f.join_timeout_s,
                            " s (does the command create a holdfast Runtime?)");
    }
  }
  return {outcome, reason};
}

void Launcher::StopAll(const std::string& outcome) {
  // Standbys and fenced members exit once told. A frozen (stopped)
  // process is woken so it can see it was fenced. Members of a job that
  // ended were told so by the controller; others (an interrupted launch)
  // get SIGTERM at once.
  KillAll(SIGCONT);
  auto wait_exits = [&](absl::Duration d) {
    const absl::Time until = absl::Now() + d;
    while (!AllExited() && absl::Now() < until) {
      Pump(absl::Milliseconds(50));
      Reap();
    }
  };
  if (outcome != "failed") wait_exits(absl::Seconds(20));
  KillAll(SIGTERM);
  wait_exits(absl::Seconds(3));
  KillAll(SIGKILL);
  while (!AllExited()) {
    Pump(absl::Milliseconds(20));
    Reap();
  }
  for (int k = 0; k < 20; ++k) Pump(absl::Milliseconds(1));  // drain
}

int Launcher::Main(int argc, char** argv) {
  Flags f;
  if (std::optional<int> done = ParseFlags(argc, argv, &f)) return *done;
  std::string faults;
  if (std::optional<int> bad = CheckFlags(f, &faults)) return *bad;

  absl::BitGen rng;
  const std::string token = absl::StrFormat(
      "%016x%016x", absl::Uniform<uint64_t>(rng), absl::Uniform<uint64_t>(rng));
  control::ControllerOptions co;
  co.token = token;
  co.world_size = f.n;
  co.recovery.shrink = f.mode == "shrink";
  co.recovery.min_world = f.min_world;
  co.recovery.replace_stragglers = f.stragglers == "replace";
  co.detection.heartbeat_interval = absl::Milliseconds(f.heartbeat_ms);
  co.detection.silent_after = absl::Milliseconds(f.silent_ms);
  co.detection.gradient_outlier_factor = f.gradient_outlier_factor;
  co.detection.rendezvous_grace = absl::Milliseconds(f.rendezvous_grace_ms);
  auto server = control::ControllerServer::Start(co);
  if (!server.ok()) {
    std::fprintf(stderr, "holdfast-run: %s\n",
                 server.status().ToString().c_str());
    return 1;
  }
  client_.address = (*server)->address();
  client_.token = token;
  client_.rpc_slack = absl::Seconds(5);
  std::fprintf(
      stderr,
      "holdfast-run: controller at %s; %d workers, %d standbys, %s mode%s\n",
      client_.address.c_str(), f.n, f.standby, f.mode.c_str(),
      faults.empty() ? "" : absl::StrCat(", faults ", faults).c_str());

  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGPIPE, SIG_IGN);
  start_ = absl::Now();
  absl::Status started = StartAgents(f, token);
  if (started.ok()) started = SpawnAll(f, token, faults);
  if (absl::Status s = started; !s.ok()) {
    std::fprintf(stderr, "holdfast-run: %s\n",
                 std::string(s.message()).c_str());
    KillAll(SIGKILL);
    agents_.clear();
    (*server)->Shutdown();
    return 1;
  }
  StatusResponse last;
  const auto [outcome, reason] = Watch(f, &last);
  StopAll(outcome);
  if (auto s = FetchJob(); s.ok()) last = *s;
  WriteMembers(last);
  json summary = Summary(last, outcome, reason);
  const int code = Judge(last, &summary);
  AddDiagnoses(&summary);
  PrintSummary(summary);
  if (!log_dir_.empty()) {
    std::ofstream out(absl::StrCat(log_dir_, "/summary.json"));
    out << summary.dump(2) << "\n";
    std::ofstream page(absl::StrCat(log_dir_, "/timeline.html"));
    page << timeline_.Html(summary);
  }
  // A finished job needs no resume point, so the next run starts afresh;
  // nor is a default directory without a checkpoint worth keeping.
  if (default_checkpoint_dir_ &&
      (outcome == "finished" || !summary.contains("disk_checkpoint_step"))) {
    std::error_code ec;
    std::filesystem::remove_all(checkpoint_dir_, ec);
  }
  agents_.clear();
  (*server)->Shutdown();
  return code;
}

}  // namespace holdfast::run

int main(int argc, char** argv) {
  holdfast::run::Launcher launcher;
  return launcher.Main(argc, argv);
}
