// holdfast-run: runs one fault-tolerant job on this machine.
//
//   holdfast-run -n N [--standby K] [--mode replace|shrink] [--min-world M]
//                [--inject SPEC]... [--log-dir DIR] [--hosts H]
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
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "src/checkpoint/pieces.h"
#include "src/control/client.h"
#include "src/control/membership.h"
#include "src/control/server.h"
#include "src/fault/fault.h"
#include "src/runtime/report.h"
#include "src/store/keys.h"

extern char** environ;

namespace {

using holdfast::control::StatusResponse;
using nlohmann::json;

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal = sig; }

// The label of a process the controller does not know yet.
constexpr char kStarting[] = "starting";

struct Proc {
  int index = 0;
  pid_t pid = -1;
  int out_fd = -1;  // its stdout
  int err_fd = -1;  // its stderr
  std::string out_buf, err_buf;
  bool exited = false;
  int status = 0;  // wait status
  std::string label = kStarting;
  std::ofstream log;
};

// A command is runnable: a path with '/', or a name found on PATH.
bool Resolves(const std::string& cmd) {
  if (cmd.find('/') != std::string::npos) return access(cmd.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "", ':')) {
    std::string p = absl::StrCat(dir.empty() ? "." : dir, "/", cmd);
    struct stat st;
    if (stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        access(p.c_str(), X_OK) == 0) {
      return true;
    }
  }
  return false;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status))
    return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return "ended";
}

class Launcher {
 public:
  int Main(int argc, char** argv);

 private:
  absl::Status Spawn(Proc& p, const std::vector<std::string>& env_extra);
  // Pumps output until `k` standbys are registered. DeadlineExceeded at
  // `deadline`, Unavailable if a standby process exits first.
  absl::Status AwaitStandbys(int k, absl::Time deadline);
  void Pump(absl::Duration timeout);
  void Emit(Proc& p, std::string& buf, bool is_err, bool flush_all);
  void RefreshLabels(const StatusResponse& s);
  // Asks the controller for labels (at most every 20 ms): a process still
  // labeled "starting" may have registered, or even finished, since the
  // last poll.
  void RefreshLabelsNow();
  json Summary(const StatusResponse& s, const std::string& outcome,
               const std::string& reason);
  void PrintSummary(const json& j);
  // The controller's view, with members and every incident kept.
  absl::StatusOr<StatusResponse> FetchJob() const;
  void KillAll(int sig);
  bool AllExited() const;
  void Reap();
  // DIR/members.json (with --log-dir): the launcher's processes (pid,
  // exit) and the controller's members (pid, role, slot, state, host), for
  // tools that act on processes from outside (holdfast-chaos). Replaced
  // atomically at every status poll.
  void WriteMembers(const StatusResponse& s);
  // Chooses the disk tier's directory (see --checkpoint-dir) and locks it;
  // an empty string when it is off. Usage errors name the problem.
  absl::StatusOr<std::string> ChooseCheckpointDir(const std::string& flag,
                                                  bool off, bool fresh);

  std::vector<std::string> cmd_;
  std::vector<std::unique_ptr<Proc>> procs_;
  holdfast::control::ClientOptions client_;
  absl::Time start_;
  std::string log_dir_;
  std::string checkpoint_dir_;           // empty: no disk tier
  bool default_checkpoint_dir_ = false;  // chosen here, removed on success
  int n_ = 0;
  absl::Time next_label_fetch_ = absl::InfinitePast();
};

absl::Status Launcher::AwaitStandbys(int k, absl::Time deadline) {
  int ready = 0;
  for (;;) {
    Pump(absl::Milliseconds(20));
    Reap();
    if (g_signal != 0) return absl::CancelledError("interrupted");
    if (std::any_of(procs_.begin(), procs_.end(),
                    [](const auto& p) { return p->exited; })) {
      return absl::UnavailableError(
          "a standby exited before it registered with the controller (does "
          "the command create a holdfast Runtime? see its output above)");
    }
    auto s = FetchJob();
    if (s.ok()) {
      ready = 0;
      for (const auto& m : s->members()) {
        ready += m.role() == holdfast::control::ROLE_STANDBY &&
                 m.state() == holdfast::control::STATE_ALIVE;
      }
      if (ready >= k) return absl::OkStatus();
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("only ", ready, " of ", k,
                       " standbys registered within --join-timeout-s"));
    }
  }
}

absl::Status Launcher::Spawn(Proc& p, const std::vector<std::string>& extra) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  // Every variable this launcher sets wins over an inherited one.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    absl::string_view kv(*e);
    bool overridden = false;
    for (const std::string& x : extra) {
      overridden |=
          kv.substr(0, kv.find('=') + 1) == x.substr(0, x.find('=') + 1);
    }
    if (!overridden) env.emplace_back(kv);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  std::vector<char*> envp, args;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (std::string& a : cmd_) args.push_back(a.data());
  args.push_back(nullptr);
  const int rc =
      posix_spawnp(&p.pid, args[0], &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(out[0]);
    close(err[0]);
    return absl::InvalidArgumentError(
        absl::StrCat("cannot start '", cmd_[0], "': ", strerror(rc)));
  }
  p.out_fd = out[0];
  p.err_fd = err[0];
  return absl::OkStatus();
}

void Launcher::Emit(Proc& p, std::string& buf, bool is_err, bool flush_all) {
  if (p.label == kStarting &&
      (flush_all || buf.find('\n') != std::string::npos)) {
    RefreshLabelsNow();
  }
  size_t start = 0;
  for (;;) {
    size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) {
      if (!flush_all || start >= buf.size()) break;
      nl = buf.size();
    }
    const std::string line =
        absl::StrCat("[", p.label, "] ",
                     absl::string_view(buf).substr(start, nl - start), "\n");
    std::fputs(line.c_str(), is_err ? stderr : stdout);
    if (p.log.is_open()) p.log << line;
    start = nl + 1;
  }
  buf.erase(0, std::min(start, buf.size()));
  std::fflush(is_err ? stderr : stdout);
}

void Launcher::Pump(absl::Duration timeout) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Proc*, bool>> who;
  for (auto& p : procs_) {
    if (p->out_fd >= 0) {
      fds.push_back({p->out_fd, POLLIN, 0});
      who.push_back({p.get(), false});
    }
    if (p->err_fd >= 0) {
      fds.push_back({p->err_fd, POLLIN, 0});
      who.push_back({p.get(), true});
    }
  }
  if (fds.empty()) {
    absl::SleepFor(timeout);
    return;
  }
  if (poll(fds.data(), fds.size(),
           static_cast<int>(absl::ToInt64Milliseconds(timeout))) <= 0) {
    return;
  }
  char buf[65536];
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    Proc& p = *who[i].first;
    const bool is_err = who[i].second;
    const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
    std::string& b = is_err ? p.err_buf : p.out_buf;
    if (n > 0) {
      b.append(buf, static_cast<size_t>(n));
      Emit(p, b, is_err, false);
    } else {
      Emit(p, b, is_err, true);
      close(fds[i].fd);
      (is_err ? p.err_fd : p.out_fd) = -1;
    }
  }
}

void Launcher::RefreshLabels(const StatusResponse& s) {
  // A member that is no longer alive keeps the label its last lines were
  // printed under, unless it never had one (it finished between polls).
  std::map<int64_t, std::pair<std::string, bool>> by_pid;  // label, alive
  for (const auto& m : s.members()) {
    std::pair<std::string, bool> entry = {
        m.role() == holdfast::control::ROLE_STANDBY
            ? "standby"
            : absl::StrCat("slot ", m.slot()),
        m.state() == holdfast::control::STATE_ALIVE};
    // One process may be several members (fenced, then a fresh standby):
    // the alive one names it.
    auto [it, inserted] = by_pid.try_emplace(m.pid(), entry);
    if (!inserted && !it->second.second) it->second = std::move(entry);
  }
  for (auto& p : procs_) {
    auto it = by_pid.find(p->pid);
    if (it == by_pid.end()) continue;
    if (it->second.second || p->label == kStarting) {
      p->label = it->second.first;
    }
  }
}

void Launcher::RefreshLabelsNow() {
  const absl::Time now = absl::Now();
  if (now < next_label_fetch_) return;
  next_label_fetch_ = now + absl::Milliseconds(20);
  if (auto s = FetchJob(); s.ok()) RefreshLabels(*s);
}

absl::StatusOr<StatusResponse> Launcher::FetchJob() const {
  holdfast::control::StatusRequest req;
  req.set_include_members(true);
  req.set_max_incidents(1000);
  return holdfast::control::FetchStatus(client_, req);
}

void Launcher::Reap() {
  for (auto& p : procs_) {
    if (p->exited) continue;
    int st = 0;
    if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
      p->exited = true;
      p->status = st;
    }
  }
}

void Launcher::WriteMembers(const StatusResponse& s) {
  if (log_dir_.empty()) return;
  json members = json::array();
  for (const auto& m : s.members()) {
    members.push_back(
        {{"member", absl::StrCat(m.member_id())},
         {"pid", m.pid()},
         {"role", holdfast::control::Role_Name(m.role())},
         {"slot", m.slot()},
         {"state", holdfast::control::MemberState_Name(m.state())},
         {"host", m.host()},
         {"step", m.step()}});
  }
  json procs = json::array();
  for (const auto& p : procs_) {
    procs.push_back({{"index", p->index},
                     {"pid", p->pid},
                     {"role", p->index < n_ ? "worker" : "standby"},
                     {"exited", p->exited}});
  }
  const json j = {
      {"job_state", holdfast::control::JobState_Name(s.job_state())},
      {"generation", s.generation()},
      {"committed_step", s.committed_step()},
      {"processes", procs},
      {"members", members}};
  const std::string path = absl::StrCat(log_dir_, "/members.json");
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << j.dump() << "\n";
    if (!f) return;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
}

absl::StatusOr<std::string> Launcher::ChooseCheckpointDir(
    const std::string& flag, bool off, bool fresh) {
  namespace fs = std::filesystem;
  if (off) {
    if (!flag.empty()) {
      return absl::InvalidArgumentError(
          "--no-disk-tier and --checkpoint-dir contradict each other");
    }
    return std::string();
  }
  std::string dir = flag;
  if (dir.empty()) {
    const char* env = std::getenv("HOLDFAST_CHECKPOINT_DIR");
    if (env != nullptr) dir = env;
  }
  if (dir.empty()) {
    // One directory per trainer command: the same command finds it again.
    const std::string key = absl::StrJoin(cmd_, std::string(1, '\0'));
    dir = absl::StrFormat(".holdfast/checkpoints/%016x",
                          holdfast::pieces::Checksum(key.data(), key.size()));
    default_checkpoint_dir_ = true;
  }
  std::error_code ec;
  dir = fs::absolute(dir, ec).lexically_normal().string();
  // A job without its own directory writes pieces over another's: lock it.
  // The default directory of a command already running elsewhere gives way
  // to a private one instead.
  for (int attempt = 0;; ++attempt) {
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("disk tier directory '", dir, "': ", ec.message()));
    }
    const std::string lock = dir + "/.lock";
    const int fd = open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("disk tier lock '", lock, "': ", strerror(errno)));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) break;  // held until exit
    close(fd);
    if (!default_checkpoint_dir_ || attempt > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the disk tier directory '", dir,
          "' is in use by another running job; give this one its own "
          "--checkpoint-dir"));
    }
    const std::string own = absl::StrCat(dir, ".", getpid());
    std::fprintf(stderr,
                 "holdfast-run: another running job uses the disk tier in "
                 "%s; this one uses %s\n",
                 dir.c_str(), own.c_str());
    dir = own;
  }
  if (fresh) holdfast::pieces::Prune(dir, 0);
  if (default_checkpoint_dir_) {
    std::ofstream(dir + "/command.txt") << absl::StrJoin(cmd_, " ") << "\n";
  }
  return dir;
}

bool Launcher::AllExited() const {
  for (const auto& p : procs_) {
    if (!p->exited) return false;
  }
  return true;
}

void Launcher::KillAll(int sig) {
  for (auto& p : procs_) {
    if (!p->exited) kill(p->pid, sig);
  }
}

json Launcher::Summary(const StatusResponse& s, const std::string& outcome,
                       const std::string& reason) {
  json j;
  j["outcome"] = outcome;
  j["reason"] = reason;
  j["world_size_initial"] = n_;
  j["world_size_final"] = s.world_size();
  j["generation"] = s.generation();
  j["committed_step"] = s.committed_step();
  j["wall_ms"] = absl::ToInt64Milliseconds(absl::Now() - start_);
  auto store = holdfast::control::ControllerStore::Connect(client_);
  json recoveries = json::array();
  if (store.ok()) {
    for (int64_t g = 1; g <= s.generation(); ++g) {
      auto v = (*store)->TryGet(holdfast::keys::Recovery(g));
      if (v.ok() && v->has_value())
        recoveries.push_back(json::parse(**v, nullptr, false));
    }
    auto e = (*store)->TryGet(holdfast::keys::kError);
    if (e.ok() && e->has_value()) {
      json err = json::parse(**e, nullptr, false);
      if (err.is_object()) j["error"] = err;
    }
    auto resumed = (*store)->TryGet(holdfast::keys::kResumed);
    if (resumed.ok() && resumed->has_value()) {
      json r = json::parse(**resumed, nullptr, false);
      if (r.is_object()) j["resumed_from_step"] = r.value("step", int64_t{0});
    }
    // The state every slot ended with: one hash for the job, and whether
    // the replicated state agreed across slots.
    std::string parts;
    std::string replicated;
    bool agree = true;
    int slots = 0;
    for (int slot = 0; slot < s.world_size(); ++slot) {
      auto v = (*store)->TryGet(holdfast::keys::FinalState(slot));
      if (!v.ok() || !v->has_value()) break;
      json st = json::parse(**v, nullptr, false);
      if (!st.is_object()) break;
      const std::string rep = st.value("replicated", "");
      if (slot == 0) replicated = rep;
      agree &= rep == replicated;
      absl::StrAppend(&parts, st.value("sharded", ""), "/");
      ++slots;
    }
    if (slots > 0 && slots == s.world_size()) {
      absl::StrAppend(&parts, replicated);
      j["state_hash"] = absl::StrFormat(
          "%016x", holdfast::pieces::Checksum(parts.data(), parts.size()));
      j["replicas_agree"] = agree;
    }
    auto f = (*store)->TryGet(holdfast::keys::kFinal);
    if (f.ok() && f->has_value()) {
      json fin = json::parse(**f, nullptr, false);
      j["final"] = fin;
      if (fin.is_object()) {
        j["steps"] = fin.value("final_step", 0);
        const double wall = fin.value("wall_ms", 0);
        const double prod = fin.value("productive_ms", 0);
        j["productive_ms"] = prod;
        j["train_wall_ms"] = wall;
        j["ettr"] = wall > 0 ? prod / wall : 0.0;
      }
    }
  }
  j["recoveries"] = recoveries;
  json incidents = json::array();
  for (const auto& inc : s.incidents()) {
    json i;
    i["id"] = inc.id();
    i["kind"] = holdfast::control::IncidentKindName(inc.kind());
    i["slot"] = inc.slot();
    i["member"] = absl::StrCat(inc.member_id());
    i["host"] = inc.host();
    i["generation"] = inc.generation();
    i["detected_unix_ms"] = inc.detected_unix_ms();
    i["detect_ms"] = inc.time_to_detect_ms();
    i["evidence"] = inc.evidence();
    // The recovery that handled it: the first whose broken generation
    // range covers the incident's generation.
    for (const json& r : recoveries) {
      if (!r.is_object()) continue;
      const int64_t from = r.value("failed_generation", int64_t{-1});
      const int64_t to = r.value("generation", int64_t{-1});
      if (inc.generation() >= from && inc.generation() < to) {
        i["recovered_generation"] = to;
        i["recovery_ms"] =
            r.value("first_step_ms", int64_t{0}) - inc.detected_unix_ms();
        i["lost_steps"] = r.value("lost_steps", int64_t{0});
        break;
      }
    }
    incidents.push_back(i);
  }
  j["incidents"] = incidents;
  json procs = json::array();
  for (const auto& p : procs_) {
    procs.push_back(
        {{"index", p->index},
         {"pid", p->pid},
         {"last_label", p->label},
         {"exit", p->exited ? DescribeExit(p->status) : "running"}});
  }
  j["processes"] = procs;
  if (!checkpoint_dir_.empty()) {
    j["checkpoint_dir"] = checkpoint_dir_;
    auto newest = holdfast::pieces::FindNewest(checkpoint_dir_, std::nullopt);
    if (newest.ok() && newest->has_value()) {
      j["disk_checkpoint_step"] = (*newest)->step;
    }
  }
  return j;
}

void Launcher::PrintSummary(const json& j) {
  std::string out = "\n==== holdfast-run summary ====\n";
  absl::StrAppend(&out, "outcome: ", j.value("outcome", ""));
  if (!j.value("reason", std::string()).empty())
    absl::StrAppend(&out, " (", j.value("reason", ""), ")");
  if (j.contains("error")) {
    const json& e = j["error"];
    absl::StrAppend(&out, "\nerror: slot ", e.value("slot", -1), ": ",
                    e.value("code", ""), ": ", e.value("message", ""));
  }
  // Without a finished slot there is no final step: the committed one says
  // how far the job got.
  absl::StrAppend(
      &out, "\nsteps: ",
      j.contains("steps")
          ? absl::StrCat(j.value("steps", 0))
          : absl::StrCat("no slot finished (committed step ",
                         j.value("committed_step", int64_t{-1}), ")"),
      ", world ", j.value("world_size_initial", 0), " -> ",
      j.value("world_size_final", 0), ", generation ", j.value("generation", 0),
      "\n");
  const auto& incidents = j["incidents"];
  absl::StrAppend(&out, "incidents: ", incidents.size(), "\n");
  for (const json& i : incidents) {
    absl::StrAppend(&out, "  #", i.value("id", 0), " ", i.value("kind", ""),
                    " slot ", i.value("slot", -1), ": detected in ",
                    i.value("detect_ms", 0), " ms");
    if (i.contains("recovery_ms")) {
      absl::StrAppend(&out, ", recovered in ", i.value("recovery_ms", 0),
                      " ms (generation ", i.value("recovered_generation", 0),
                      "), ", i.value("lost_steps", 0), " lost steps");
    }
    absl::StrAppend(&out, "\n      ", i.value("evidence", ""), "\n");
  }
  if (j.contains("ettr")) {
    absl::StrAppend(
        &out,
        absl::StrFormat("ETTR: %.3f (productive step time %.0f ms over %.0f ms "
                        "from the first step to the last)\n",
                        j.value("ettr", 0.0), j.value("productive_ms", 0.0),
                        j.value("train_wall_ms", 0.0)));
  }
  if (j.contains("resumed_from_step")) {
    absl::StrAppend(&out, "resumed from the disk checkpoint of step ",
                    j.value("resumed_from_step", int64_t{0}), "\n");
  }
  if (j.contains("state_hash")) {
    absl::StrAppend(&out, "state: ", j.value("state_hash", ""),
                    j.value("replicas_agree", true)
                        ? ""
                        : " (the slots' replicated state differs!)",
                    "\n");
  }
  if (j.value("outcome", "") != "finished" && j.contains("checkpoint_dir")) {
    if (j.contains("disk_checkpoint_step")) {
      absl::StrAppend(&out, "disk tier: step ",
                      j.value("disk_checkpoint_step", int64_t{0}), " in ",
                      j.value("checkpoint_dir", ""),
                      "; run the same command again to resume from it\n");
    } else {
      absl::StrAppend(&out, "disk tier: no complete checkpoint in ",
                      j.value("checkpoint_dir", ""), " yet\n");
    }
  }
  absl::StrAppend(&out, "wall: ", j.value("wall_ms", 0), " ms\n");
  std::fputs(out.c_str(), stderr);
}

int Launcher::Main(int argc, char** argv) {
  CLI::App app{"holdfast-run: run a fault-tolerant job on this machine"};
  int n = 0, standby = 0, min_world = 1, hosts = 0, replicas = 0;
  std::string checkpoint_dir, verify_backups;
  int64_t checkpoint_every = 0;
  std::string mode = "replace";
  std::vector<std::string> inject;
  int64_t heartbeat_ms = 500, silent_ms = 3000, join_timeout_s = 60;
  int64_t rendezvous_grace_ms = 1000;
  bool no_disk_tier = false, fresh = false;
  app.add_option("-n,--nproc", n, "worker slots")->required();
  app.add_option("--standby", standby, "warm standbys")
      ->check(CLI::Range(0, 4096));
  app.add_option("--mode", mode, "replace or shrink")
      ->check(CLI::IsMember({"replace", "shrink"}));
  app.add_option("--min-world", min_world,
                 "stop the job below this many workers");
  app.add_option("--inject", inject,
                 "fault spec, e.g. kill:slot=2:step=30 (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--log-dir", log_dir_,
                 "write per-process logs and summary.json here");
  app.add_option("--hosts", hosts,
                 "fake host labels: workers' slots in H equal contiguous "
                 "blocks host0..host{H-1}, standbys spare0..")
      ->check(CLI::Range(0, 4096));
  app.add_option("--replicas", replicas,
                 "copies of each checkpoint piece on buddies "
                 "(HOLDFAST_REPLICAS; default 1)")
      ->check(CLI::Range(1, 64));
  app.add_option("--verify-backups", verify_backups,
                 "when buddies check received copies: arrival or restore "
                 "(HOLDFAST_VERIFY_BACKUPS; default arrival)")
      ->check(CLI::IsMember({"arrival", "restore"}));
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "disk tier directory (HOLDFAST_CHECKPOINT_DIR; default "
                 ".holdfast/checkpoints/<hash of the command>, removed when "
                 "the job finishes)");
  app.add_flag("--no-disk-tier", no_disk_tier,
               "write no disk checkpoints (a job that loses every memory "
               "copy cannot be resumed)");
  app.add_flag("--fresh", fresh,
               "start from step 0: remove the disk tier's checkpoints first");
  app.add_option("--checkpoint-every", checkpoint_every,
                 "disk tier cadence in steps (HOLDFAST_CHECKPOINT_EVERY)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--heartbeat-ms", heartbeat_ms, "member heartbeat interval")
      ->check(CLI::Range(int64_t{10}, int64_t{60000}));
  app.add_option("--silent-after-ms", silent_ms,
                 "declare a member silent after this long")
      ->check(CLI::Range(int64_t{50}, int64_t{3600000}));
  app.add_option("--rendezvous-grace-ms", rendezvous_grace_ms,
                 "leave out a member that does not come to a recovery's "
                 "rendezvous and does not answer, this long after the others "
                 "came")
      ->check(CLI::Range(int64_t{10}, int64_t{3600000}));
  app.add_option("--join-timeout-s", join_timeout_s,
                 "fail if not every process has joined the job by then")
      ->check(CLI::Range(int64_t{1}, int64_t{86400}));
  app.add_option("cmd", cmd_, "the trainer command (after --)")->required();
  app.allow_extras(false);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto usage = [](const std::string& msg) {
    std::fprintf(stderr, "holdfast-run: %s\n", msg.c_str());
    return 2;
  };
  if (n < 1 || n > 4096)
    return usage(absl::StrCat("-n ", n, " is out of range [1, 4096]"));
  if (min_world < 1 || min_world > n) {
    return usage(absl::StrCat("--min-world ", min_world,
                              " is out of range [1, ", n, "]"));
  }
  const std::string faults = absl::StrJoin(inject, ",");
  absl::StatusOr<std::vector<holdfast::fault::FaultSpec>> parsed =
      holdfast::fault::Parse(faults);
  if (!parsed.ok()) {
    return usage(absl::StrCat("--inject: ", parsed.status().message()));
  }
  // Slots are 0..n-1 in every generation (a standby takes a lost slot's
  // number, a shrink renumbers below it): a fault on slot n or above would
  // never fire.
  for (const holdfast::fault::FaultSpec& f : *parsed) {
    if (f.slot >= n) {
      return usage(absl::StrCat(
          "--inject: fault spec '", f.text, "' names slot ", f.slot,
          ", but -n ", n, " has slots 0..", n - 1, ": it would never fire"));
    }
  }
  if (hosts > n) {
    return usage(absl::StrCat("--hosts ", hosts, " is more than -n ", n,
                              ": a host would have no worker"));
  }
  if (!Resolves(cmd_[0])) {
    return usage(
        absl::StrCat("command '", cmd_[0], "' not found or not executable"));
  }
  n_ = n;
  absl::StatusOr<std::string> disk =
      ChooseCheckpointDir(checkpoint_dir, no_disk_tier, fresh);
  if (!disk.ok()) return usage(std::string(disk.status().message()));
  checkpoint_dir_ = *disk;
  if (!log_dir_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(log_dir_, ec);
    if (ec)
      return usage(absl::StrCat("--log-dir '", log_dir_, "': ", ec.message()));
  }

  absl::BitGen rng;
  const std::string token = absl::StrFormat(
      "%016x%016x", absl::Uniform<uint64_t>(rng), absl::Uniform<uint64_t>(rng));
  holdfast::control::ControllerOptions co;
  co.token = token;
  co.world_size = n;
  co.recovery.shrink = mode == "shrink";
  co.recovery.min_world = min_world;
  co.detection.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
  co.detection.silent_after = absl::Milliseconds(silent_ms);
  co.detection.rendezvous_grace = absl::Milliseconds(rendezvous_grace_ms);
  auto server = holdfast::control::ControllerServer::Start(co);
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
      client_.address.c_str(), n, standby, mode.c_str(),
      faults.empty() ? "" : absl::StrCat(", faults ", faults).c_str());

  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGPIPE, SIG_IGN);
  start_ = absl::Now();
  const int total = n + standby;
  // Standbys first, and the workers once they have registered: a fault
  // early in the job then finds its standby in place, however long the
  // trainer takes to start (a Python process importing torch).
  std::vector<int> order;
  for (int i = n; i < total; ++i) order.push_back(i);
  for (int i = 0; i < n; ++i) order.push_back(i);
  for (int i : order) {
    if (i == 0 && standby > 0) {
      absl::Status ready =
          AwaitStandbys(standby, start_ + absl::Seconds(join_timeout_s));
      if (!ready.ok()) {
        std::fprintf(stderr, "holdfast-run: %s\n",
                     std::string(ready.message()).c_str());
        KillAll(SIGKILL);
        (*server)->Shutdown();
        return 1;
      }
    }
    auto p = std::make_unique<Proc>();
    p->index = i;
    std::vector<std::string> env = {
        absl::StrCat("HOLDFAST_CONTROLLER=", client_.address),
        absl::StrCat("HOLDFAST_JOB_TOKEN=", token),
        absl::StrCat("HOLDFAST_FAULTS=", faults),
    };
    if (replicas > 0) {
      env.push_back(absl::StrCat("HOLDFAST_REPLICAS=", replicas));
    }
    if (!verify_backups.empty()) {
      env.push_back(absl::StrCat("HOLDFAST_VERIFY_BACKUPS=", verify_backups));
    }
    // Set even when empty: --no-disk-tier wins over an inherited one.
    env.push_back(absl::StrCat("HOLDFAST_CHECKPOINT_DIR=", checkpoint_dir_));
    if (checkpoint_every > 0) {
      env.push_back(
          absl::StrCat("HOLDFAST_CHECKPOINT_EVERY=", checkpoint_every));
    }
    // Worker i asks for slot i (standbys for the standby role), so fault
    // specs and host labels name the same processes in every run.
    env.push_back(absl::StrCat("HOLDFAST_PREFERRED_SLOT=",
                               i < n ? absl::StrCat(i) : "standby"));
    if (hosts > 0) {
      env.push_back(absl::StrCat(
          "HOLDFAST_HOST=",
          i < n ? absl::StrCat("host", static_cast<int64_t>(i) * hosts / n)
                : absl::StrCat("spare", i - n)));
    }
    if (!log_dir_.empty()) {
      env.push_back(absl::StrCat("HOLDFAST_TRACE_DIR=", log_dir_, "/trace"));
      p->log.open(absl::StrCat(log_dir_, "/proc", i, ".log"));
    }
    if (absl::Status s = Spawn(*p, env); !s.ok()) {
      std::fprintf(stderr, "holdfast-run: %s\n",
                   std::string(s.message()).c_str());
      KillAll(SIGKILL);
      (*server)->Shutdown();
      return 1;
    }
    procs_.push_back(std::move(p));
  }

  // Watch the job until it ends, every process is gone, or a signal.
  std::string outcome, reason;
  StatusResponse last;
  absl::Time next_status = absl::InfinitePast();
  int max_seen = 0;
  while (outcome.empty()) {
    Pump(absl::Milliseconds(50));
    Reap();
    if (g_signal != 0) {
      outcome = "failed";
      reason = absl::StrCat("interrupted by signal ", g_signal.load());
      break;
    }
    if (absl::Now() < next_status && !AllExited()) continue;
    next_status = absl::Now() + absl::Milliseconds(200);
    auto s = FetchJob();
    if (!s.ok()) continue;
    last = *s;
    RefreshLabels(last);
    WriteMembers(last);
    max_seen = std::max(max_seen, last.alive() + last.dead() + last.left());
    if (last.job_state() == holdfast::control::JOB_FINISHED) {
      outcome = "finished";
    } else if (last.job_state() == holdfast::control::JOB_STOPPED) {
      outcome = "stopped";
      reason = last.job_reason();
    } else if (AllExited()) {
      outcome = "failed";
      reason = max_seen == 0
                   ? "every process exited without joining the job (does the "
                     "command create a holdfast Runtime?)"
                   : "every process exited but the job did not finish";
    } else if (max_seen < n &&
               absl::Now() - start_ > absl::Seconds(join_timeout_s)) {
      outcome = "failed";
      reason = absl::StrCat("only ", max_seen, " of ", n,
                            " processes joined within ", join_timeout_s,
                            " s (does the command create a holdfast Runtime?)");
    }
  }
  // Let the processes finish: standbys and fenced members exit once told.
  // A frozen (stopped) process is woken so it can see it was fenced.
  // Members of a job that ended were told so by the controller; others
  // (an interrupted launch) get SIGTERM at once.
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
  if (auto s = FetchJob(); s.ok()) last = *s;
  WriteMembers(last);
  json summary = Summary(last, outcome, reason);
  PrintSummary(summary);
  if (!log_dir_.empty()) {
    std::ofstream f(absl::StrCat(log_dir_, "/summary.json"));
    f << summary.dump(2) << "\n";
  }
  // A finished job needs no resume point, so the next run starts afresh;
  // nor is a default directory without a checkpoint worth keeping.
  if (default_checkpoint_dir_ &&
      (outcome == "finished" || !summary.contains("disk_checkpoint_step"))) {
    std::error_code ec;
    std::filesystem::remove_all(checkpoint_dir_, ec);
  }
  (*server)->Shutdown();
  return outcome == "finished" ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Launcher launcher;
  return launcher.Main(argc, argv);
}
