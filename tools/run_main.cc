// holdfast-run: runs one fault-tolerant job on this machine, or this
// node's part of a job on many (docs/multi-node.md):
//
//   holdfast-run --nnodes N|MIN:MAX --nproc-per-node P
//                [--standby-per-node K] [--node-rank R]
//                --rdzv-endpoint HOST:PORT --rdzv-id ID [options] -- CMD
//
//   holdfast-run -n N [--standby K] [--mode replace|shrink] [--min-world M]
//                [--max-world M]
//                [--inject SPEC]... [--log-dir DIR] [--hosts H] [--agent]
//                [--checkpoint-dir DIR | --no-disk-tier] [--fresh]
//                [--heartbeat-ms MS] [--silent-after-ms MS] [--exit-watch-ms
//                MS]
//                [--rendezvous-grace-ms MS] [--join-timeout-s S]
//                -- CMD ARGS...
//
// Starts the embedded controller, then K standbys and N workers (all the
// same CMD; the workers join once the standbys have registered), with
// HOLDFAST_CONTROLLER,
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
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
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
#include "tools/tls_flags.h"

namespace holdfast::run {
namespace {

int Usage(const std::string& msg) {
  std::fprintf(stderr, "holdfast-run: %s\n", msg.c_str());
  return 2;
}

}  // namespace

std::optional<int> Launcher::ParseFlags(int argc, char** argv, Flags* f) {
  CLI::App app{"holdfast-run: run a fault-tolerant job on this machine"};
  app.add_option("-n,--nproc", f->n, "worker slots (one machine)");
  app.add_option("--nnodes", f->nodes.nnodes,
                 "many nodes: N, or MIN:MAX (the job trains on MIN nodes; "
                 "nodes above MIN, up to MAX, are spare capacity)");
  app.add_option("--nproc-per-node", f->nodes.nproc_per_node,
                 "many nodes: worker slots per node");
  app.add_option("--standby-per-node", f->nodes.standby_per_node,
                 "many nodes: warm standbys per node");
  app.add_option("--node-rank", f->nodes.node_rank,
                 "many nodes: this node's rank (default: SLURM_NODEID, or "
                 "assigned at rendezvous)");
  app.add_option("--rdzv-endpoint", f->nodes.rdzv_endpoint,
                 "many nodes: HOST:PORT of the job's controller "
                 "(HOLDFAST_RDZV_ENDPOINT); the node that can bind it serves "
                 "it");
  app.add_option("--rdzv-id", f->nodes.rdzv_id,
                 "many nodes: the job's name, the same on every node "
                 "(default: SLURM_JOB_ID)");
  app.add_option("--controller-timeout-s", f->controller_timeout_s,
                 "many nodes: give up once the controller has not answered "
                 "for this long")
      ->check(CLI::Range(int64_t{1}, int64_t{86400}));
  app.add_option("--standby", f->standby, "warm standbys")
      ->check(CLI::Range(0, 4096));
  app.add_option("--mode", f->mode, "replace or shrink")
      ->check(CLI::IsMember({"replace", "shrink"}));
  app.add_option("--min-world", f->min_world,
                 "stop the job below this many workers");
  app.add_option("--max-world", f->max_world,
                 "grow the world up to this many workers with standbys that "
                 "wait (a node added after a node was lost); 0: never "
                 "(default: the start's world in replace mode, 0 in shrink "
                 "mode)")
      ->check(CLI::Range(0, 1 << 20));
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
  // Without TLS files, one machine's job makes a private CA.
  tools::AddTlsFlags(app, &f->tls);
  app.add_flag("--no-tls", f->no_tls,
               "plain TCP on the control plane (no private CA)");
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
  app.add_option("--exit-watch-ms", f->exit_watch_ms,
                 "the controller reads /proc this often for the processes on "
                 "its machine: one that begins to exit is declared crashed "
                 "then, not when its stream ends after its memory's teardown "
                 "(0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{10000}));
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
  int n = f.n;
  if (WantsNodes(f.nodes, RealEnv)) {
    if (n != -1 || f.hosts != 0 || f.standby != 0) {
      return Usage(
          "-n, --standby and --hosts are for one machine; with --nnodes give "
          "--nproc-per-node and --standby-per-node");
    }
    absl::StatusOr<NodePlan> plan = PlanNodes(f.nodes, RealEnv);
    if (!plan.ok()) return Usage(std::string(plan.status().message()));
    plan_ = *plan;
    n = plan_->world_size();
  } else if (n == -1) {
    return Usage("-n N (one machine) or --nnodes (many) is required");
  }
  if (n < 1 || n > 4096) {
    return Usage(absl::StrCat("-n ", n, " is out of range [1, 4096]"));
  }
  if (f.min_world < 1 || f.min_world > n) {
    return Usage(absl::StrCat("--min-world ", f.min_world,
                              " is out of range [1, ", n, "]"));
  }
  // Above the start's world: up to every node's workers (--nnodes' MAX).
  const int most = plan_ ? plan_->max_nodes * plan_->nproc_per_node : 4096;
  max_world_ = f.max_world >= 0 ? f.max_world : f.mode == "shrink" ? 0 : n;
  if (max_world_ != 0 && (max_world_ < n || max_world_ > most)) {
    return Usage(absl::StrCat(
        "--max-world ", max_world_, " is out of range [", n, ", ", most,
        "] (0: the world never grows)",
        plan_ ? " (the start's workers to MAX nodes' workers)" : ""));
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
          plan_ ? ", but the job's slots are 0.."
                : absl::StrCat(", but -n ", n, " has slots 0.."),
          n - 1, ": it would never fire"));
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

std::vector<std::string> Launcher::ProcEnv(const Flags& f, const Proc& p,
                                           const std::string& token,
                                           const std::string& faults) const {
  const auto agent = agents_.find(p.host);
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
  // Set even when empty: --no-disk-tier wins over an inherited one, and
  // --no-tls over inherited TLS files.
  env.push_back(absl::StrCat("HOLDFAST_CHECKPOINT_DIR=", checkpoint_dir_));
  env.push_back(absl::StrCat("HOLDFAST_TLS_CA=", tls_files_.ca));
  env.push_back(absl::StrCat("HOLDFAST_TLS_CERT=", tls_files_.cert));
  env.push_back(absl::StrCat("HOLDFAST_TLS_KEY=", tls_files_.key));
  env.push_back(
      absl::StrCat("HOLDFAST_TLS_SERVER_NAME=", tls_files_.server_name));
  if (f.checkpoint_every > 0) {
    env.push_back(
        absl::StrCat("HOLDFAST_CHECKPOINT_EVERY=", f.checkpoint_every));
  }
  // A worker asks for its slot (standbys for the standby role), so fault
  // specs and host labels name the same processes in every run.
  env.push_back(absl::StrCat("HOLDFAST_PREFERRED_SLOT=",
                             p.slot >= 0 ? absl::StrCat(p.slot) : "standby"));
  if (!p.host.empty()) env.push_back(absl::StrCat("HOLDFAST_HOST=", p.host));
  if (!bind_addr_.empty()) {
    env.push_back(absl::StrCat("HOLDFAST_BIND_ADDR=", bind_addr_));
  }
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

std::vector<std::pair<int, std::string>> Launcher::LocalProcesses(
    const Flags& f) const {
  std::vector<std::pair<int, std::string>> procs;
  if (plan_) {
    for (int i = 0; i < layout_.standbys; ++i) {
      procs.emplace_back(-1, plan_->node_name);
    }
    for (int i = 0; i < layout_.workers; ++i) {
      procs.emplace_back(layout_.first_slot + i, plan_->node_name);
    }
    return procs;
  }
  for (int i = f.n; i < f.n + f.standby; ++i)
    procs.emplace_back(-1, HostOf(f, i));
  for (int i = 0; i < f.n; ++i) procs.emplace_back(i, HostOf(f, i));
  return procs;
}

bool Launcher::OnThisNode(const control::MemberInfo& m) const {
  return !plan_ || m.host() == plan_->node_name;
}

absl::Status Launcher::StartAgent(const Flags& f, const std::string& host,
                                  const std::string& token) {
  if (agents_.count(host) > 0) return absl::OkStatus();
  control::AgentOptions o;
  o.controller = client_.address;
  o.token = token;
  o.tls = client_.tls;
  o.host = host;  // "": this machine's name
  o.exit_watch_interval = absl::Milliseconds(f.exit_watch_ms);
  HOLDFAST_ASSIGN_OR_RETURN(agents_[host], control::HostAgent::Start(o));
  return absl::OkStatus();
}

absl::Status Launcher::StartAgents(const Flags& f, const std::string& token) {
  // Many nodes: each node's launcher runs the node's agent, so a node lost
  // whole is seen as one (docs/multi-node.md).
  if (plan_) return StartAgent(f, plan_->node_name, token);
  if (!f.agent) return absl::OkStatus();
  for (int i = 0; i < f.n + f.standby; ++i) {
    HOLDFAST_RETURN_IF_ERROR(StartAgent(f, HostOf(f, i), token));
  }
  return absl::OkStatus();
}

absl::Status Launcher::SpawnAll(const Flags& f, const std::string& token,
                                const std::string& faults) {
  // Every process at once, so the workers start (a Python process
  // importing torch takes seconds) while the standbys do. A fault early in
  // the job must find its standby in place, so the workers join only once
  // this node's standbys have registered: each worker inherits the read
  // end of a pipe (HOLDFAST_START_GATE_FD), and the runtime joins when it
  // reads the end of it, which closing the write end here gives (or this
  // launcher's death). Only the write end is close-on-exec.
  const std::vector<std::pair<int, std::string>> order = LocalProcesses(f);
  int standbys = 0;
  for (const auto& [slot, host] : order) standbys += slot < 0;
  const bool gated = standbys > 0 && standbys < static_cast<int>(order.size());
  int gate[2] = {-1, -1};
  if (gated &&
      (pipe2(gate, O_CLOEXEC) != 0 || fcntl(gate[0], F_SETFD, 0) != 0)) {
    const int err = errno;
    for (int fd : gate) {
      if (fd >= 0) close(fd);
    }
    return absl::InternalError(
        absl::StrCat("the workers' start gate: ", strerror(err)));
  }
  // Workers are numbered from 0, standbys after them.
  int next_worker = 0, next_standby = static_cast<int>(order.size()) - standbys;
  absl::Status s;
  for (const auto& [slot, host] : order) {
    auto p = std::make_unique<Proc>();
    p->index = slot >= 0 ? next_worker++ : next_standby++;
    p->slot = slot;
    p->host = host;
    if (!log_dir_.empty()) {
      p->log.open(absl::StrCat(log_dir_, "/proc", p->index, ".log"));
    }
    std::vector<std::string> env = ProcEnv(f, *p, token, faults);
    if (gated && slot >= 0) {
      env.push_back(absl::StrCat("HOLDFAST_START_GATE_FD=", gate[0]));
    }
    s = Spawn(*p, env);
    if (!s.ok()) break;
    procs_.push_back(std::move(p));
  }
  if (gated) {
    close(gate[0]);
    if (s.ok()) {
      s = AwaitStandbys(standbys, start_ + absl::Seconds(f.join_timeout_s));
    }
    close(gate[1]);  // the workers join (or, on an error, are killed)
  }
  return s;
}

std::pair<std::string, std::string> Launcher::Watch(const Flags& f,
                                                    StatusResponse* last) {
  std::string outcome, reason;
  absl::Time next_status = absl::InfinitePast();
  int max_seen = 0;
  absl::Time answered = absl::Now();
  // On one machine the job's slots; on many nodes this node's processes.
  const int expected = plan_ ? static_cast<int>(procs_.size()) : f.n;
  while (outcome.empty()) {
    Pump(absl::Milliseconds(50));
    Reap();
    if (g_signal != 0) {
      return {"failed",
              absl::StrCat("interrupted by signal ", g_signal.load())};
    }
    if (absl::Now() < next_status && (plan_ || !AllExited())) continue;
    next_status = absl::Now() + absl::Milliseconds(200);
    auto s = FetchJob();
    if (!s.ok()) {
      if (absl::Now() - answered > absl::Seconds(f.controller_timeout_s)) {
        return {"failed",
                absl::StrCat(
                    "the controller at ", client_.address,
                    " has not answered for ", f.controller_timeout_s,
                    " s (--controller-timeout-s): ", s.status().message())};
      }
      continue;
    }
    answered = absl::Now();
    *last = *s;
    RefreshLabels(*last);
    WriteMembers(*last);
    timeline_.Sample(*last, absl::Now());
    int seen = last->alive() + last->dead() + last->left();
    if (plan_) {
      seen = static_cast<int>(std::count_if(
          last->members().begin(), last->members().end(),
          [&](const control::MemberInfo& m) { return OnThisNode(m); }));
    }
    max_seen = std::max(max_seen, seen);
    if (last->job_state() == control::JOB_FINISHED) {
      outcome = "finished";
    } else if (last->job_state() == control::JOB_STOPPED) {
      outcome = "stopped";
      reason = last->job_reason();
    } else if (AllExited() && (!plan_ || max_seen == 0)) {
      // Many nodes: the job goes on while other nodes' processes run.
      outcome = "failed";
      reason = max_seen == 0
                   ? "every process exited without joining the job (does the "
                     "command create a holdfast Runtime?)"
                   : "every process exited but the job did not finish";
    } else if (max_seen < expected &&
               absl::Now() - start_ > absl::Seconds(f.join_timeout_s)) {
      outcome = "failed";
      reason = absl::StrCat("only ", max_seen, " of ", expected,
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

void Launcher::PrintStart(const Flags& f, const std::string& faults) const {
  std::fprintf(stderr, "holdfast-run: control plane: %s\n",
               !client_.tls        ? "plain TCP"
               : !tls_dir_.empty() ? "mutual TLS (a private CA made for "
                                     "this job)"
                                   : "mutual TLS (the certificates given)");
  if (plan_) {
    std::fprintf(
        stderr,
        "holdfast-run: node %s (rank %d of %d..%d)%s; controller at "
        "%s%s; %d workers, %d standbys here, %d slots, %s mode%s\n",
        plan_->node_name.c_str(), plan_->node_rank, plan_->min_nodes,
        plan_->max_nodes,
        plan_->from_slurm.empty()
            ? ""
            : absl::StrCat(" from ", plan_->from_slurm).c_str(),
        client_.address.c_str(), server_ ? " (served here)" : "",
        layout_.workers, layout_.standbys, n_, f.mode.c_str(),
        faults.empty() ? "" : absl::StrCat(", faults ", faults).c_str());
  } else {
    std::fprintf(
        stderr,
        "holdfast-run: controller at %s; %d workers, %d standbys, %s mode%s\n",
        client_.address.c_str(), f.n, f.standby, f.mode.c_str(),
        faults.empty() ? "" : absl::StrCat(", faults ", faults).c_str());
  }
}

int Launcher::Main(int argc, char** argv) {
  Flags f;
  if (std::optional<int> done = ParseFlags(argc, argv, &f)) return *done;
  std::string faults;
  if (std::optional<int> bad = CheckFlags(f, &faults)) return *bad;

  absl::BitGen rng;
  std::string token = absl::StrFormat(
      "%016x%016x", absl::Uniform<uint64_t>(rng), absl::Uniform<uint64_t>(rng));
  // Many nodes share one token: the job's own, or one from the id.
  if (plan_) {
    token = RealEnv("HOLDFAST_JOB_TOKEN");
    if (token.empty()) token = TokenFromRdzvId(plan_->rdzv_id);
  }
  client_.token = token;
  client_.rpc_slack = absl::Seconds(5);
  absl::Status joined = SetUpTls(f);
  if (joined.ok()) joined = StartController(f, token);
  if (joined.ok() && plan_) joined = JoinNodes(f);
  if (!joined.ok()) {
    std::fprintf(stderr, "holdfast-run: %s\n",
                 std::string(joined.message()).c_str());
    if (server_) server_->Shutdown();
    return 1;
  }
  PrintStart(f, faults);

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
    if (server_) server_->Shutdown();
    return 1;
  }
  StatusResponse last;
  const auto [outcome, reason] = Watch(f, &last);
  StopAll(outcome);
  if (auto s = FetchJob(); s.ok()) last = *s;
  WriteMembers(last);
  json summary = Summary(last, outcome, reason);
  const int code = Judge(last, &summary);
  // Many nodes: this node's traces are a part of the job's, and a verdict
  // on a part would be wrong (gather them all for `holdfast diagnose`).
  if (!plan_) AddDiagnoses(&summary);
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
  if (plan_) FinishNodes(last);
  agents_.clear();
  if (server_) server_->Shutdown();
  if (!tls_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(tls_dir_, ec);
  }
  return code;
}

}  // namespace holdfast::run

int main(int argc, char** argv) {
  holdfast::run::Launcher launcher;
  return launcher.Main(argc, argv);
}
