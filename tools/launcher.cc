#include "tools/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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
#include "src/common/file_util.h"
#include "src/control/controller/membership.h"
#include "src/control/controller/server.h"
#include "src/control/member/client.h"
#include "src/runtime/report.h"
#include "src/store/keys.h"
#include "tools/diagnose.h"

extern char** environ;

namespace holdfast::run {

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal = sig; }

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

absl::Status Launcher::AwaitStandbys(int k, absl::Time deadline) {
  int ready = 0;
  for (;;) {
    Pump(absl::Milliseconds(20));
    Reap();
    if (g_signal != 0) return absl::CancelledError("interrupted");
    for (const auto& p : procs_) {
      if (!p->exited) continue;
      if (p->slot < 0) {
        return absl::UnavailableError(absl::StrCat(
            "a standby ", DescribeExit(p->status),
            " before it registered with the controller (does the command "
            "create a holdfast Runtime? see its output above)"));
      }
      return absl::UnavailableError(absl::StrCat(
          "the worker for slot ", p->slot, " ", DescribeExit(p->status),
          " while it waited for this node's standbys to register (see its "
          "output above)"));
    }
    auto s = FetchJob();
    if (s.ok()) {
      ready = 0;
      for (const auto& m : s->members()) {
        ready += OnThisNode(m) && m.role() == holdfast::control::ROLE_STANDBY &&
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
    if (!OnThisNode(m)) continue;
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
         {"step", m.step()},
         {"phase", holdfast::control::PhaseName(m.phase())},
         {"collective_seq", m.collective_seq()}});
  }
  json procs = json::array();
  for (const auto& p : procs_) {
    procs.push_back({{"index", p->index},
                     {"pid", p->pid},
                     {"role", p->slot >= 0 ? "worker" : "standby"},
                     {"exited", p->exited}});
  }
  const json j = {
      {"job_state", holdfast::control::JobState_Name(s.job_state())},
      {"generation", s.generation()},
      {"committed_step", s.committed_step()},
      {"processes", procs},
      {"members", members}};
  // Best effort: the next refresh writes it again.
  (void)WriteFileAtomically(absl::StrCat(log_dir_, "/members.json"),
                            j.dump() + "\n");
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
    // Many nodes may share a file system: one directory per node.
    if (plan_) absl::StrAppend(&dir, "-", plan_->node_name);
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
  // The data the job skipped after numeric anomalies: a trainer given
  // them (dp-trainer --skip-data B:E,...) reproduces the final model.
  json skipped = json::array();
  for (const auto& r : s.skip_data()) skipped.push_back({r.begin(), r.end()});
  j["skipped_data"] = skipped;
  j["rollbacks"] = s.rollbacks();
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
        // ETTR counts the productive steps at the job's healthy pace:
        // a step slowed by a straggler counts only the time it would have
        // taken at the members' median pace (docs/recovery.md, "ETTR").
        const double pace =
            s.pace_step_us() > 0
                ? static_cast<double>(s.pace_healthy_us()) / s.pace_step_us()
                : 1.0;
        j["productive_ms"] = prod;
        j["train_wall_ms"] = wall;
        j["healthy_pace"] = pace;
        j["ettr"] = wall > 0 ? prod * pace / wall : 0.0;
        j["ettr_step_time"] = wall > 0 ? prod / wall : 0.0;
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
    i["evicted"] = inc.evicted();
    i["phase"] = control::PhaseName(inc.phase());
    i["step"] = inc.step();
    if (inc.phase() == control::PHASE_COLLECTIVE) {
      i["collective_seq"] = inc.collective_seq();
    }
    if (inc.has_diagnosis()) {
      i["diagnosis"] = control::VerdictJson(inc.diagnosis());
      i["diagnosis"]["verdict_ms"] =
          inc.diagnosis().verdict_unix_ms() - inc.detected_unix_ms();
    }
    // The recovery that handled it: the first whose broken generation
    // range covers the incident's generation.
    for (const json& r : recoveries) {
      if (!r.is_object()) continue;
      const int64_t from = r.value("failed_generation", int64_t{-1});
      const int64_t to = r.value("generation", int64_t{-1});
      if (inc.generation() >= from && inc.generation() < to) {
        i["recovered_generation"] = to;
        // To the first step after it, or to the restore where no step
        // came after it (it restored the job's last step).
        const int64_t first = r.value("first_step_ms", int64_t{0});
        i["recovery_ms"] = (first > 0 ? first : r.value("restored_ms", first)) -
                           inc.detected_unix_ms();
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

int Launcher::Judge(const StatusResponse& s, json* summary) const {
  json& j = *summary;
  const std::string outcome = j.value("outcome", "");
  std::vector<std::pair<int, std::string>> problems;  // code, what
  if (outcome == "stopped") {
    problems.emplace_back(
        kExitStopped, absl::StrCat("the job stopped: ", j.value("reason", "")));
  }
  if (!j.value("replicas_agree", true)) {
    problems.emplace_back(
        kExitReplicasDiffer,
        "the slots' replicated state differs at the end (replicas_agree "
        "false): the final model is not the same everywhere");
  }
  // Each process against the controller's members with its pid.
  for (const auto& p : procs_) {
    bool finished = false, held_slot = false, fenced = false;
    std::vector<uint64_t> ids;
    for (const auto& m : s.members()) {
      if (m.pid() != p->pid || !OnThisNode(m)) continue;
      ids.push_back(m.member_id());
      held_slot |= m.role() == control::ROLE_WORKER;
      finished |=
          m.role() == control::ROLE_WORKER && m.state() == control::STATE_LEFT;
    }
    // Fenced by the controller's own decision, rather than gone by itself
    // (crashed, left): its exit after that is expected.
    for (const auto& inc : s.incidents()) {
      if (std::find(ids.begin(), ids.end(), inc.member_id()) == ids.end()) {
        continue;
      }
      fenced |= inc.kind() != control::INCIDENT_CRASHED &&
                inc.kind() != control::INCIDENT_LEFT;
    }
    const bool clean =
        p->exited && WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0;
    const std::string who = absl::StrCat("process ", p->index, " (pid ", p->pid,
                                         ", ", p->label, ")");
    if (finished && !clean) {
      problems.emplace_back(
          kExitWorkerExit,
          absl::StrCat(who, " finished training, then ",
                       p->exited ? DescribeExit(p->status) : "did not exit"));
    } else if (p->slot < 0 && held_slot && !finished && !fenced && p->exited &&
               WIFEXITED(p->status) && WEXITSTATUS(p->status) != 0) {
      problems.emplace_back(
          kExitStandbyFailed,
          absl::StrCat(who, " was a standby, took a slot and failed: ",
                       DescribeExit(p->status)));
    }
  }
  int code =
      outcome == "finished" || outcome == "stopped" ? kExitOk : kExitFailed;
  for (int want : {kExitStopped, kExitReplicasDiffer, kExitWorkerExit,
                   kExitStandbyFailed}) {
    if (code != kExitOk) break;
    for (const auto& [c, what] : problems) {
      if (c == want) {
        code = c;
        break;
      }
    }
  }
  json list = json::array();
  for (const auto& [c, what] : problems) {
    list.push_back({{"exit_code", c}, {"problem", what}});
  }
  j["problems"] = list;
  j["exit_code"] = code;
  return code;
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
    if (i.contains("diagnosis")) {
      const json& d = i["diagnosis"];
      std::vector<int> culprits = d.value("culprits", std::vector<int>{});
      absl::StrAppend(
          &out, "      diagnosis: ", d.value("kind", ""),
          culprits.empty()
              ? std::string()
              : absl::StrCat("; culprit", culprits.size() > 1 ? "s " : " ",
                             absl::StrJoin(culprits, ", ")),
          " (", d.value("evidence", ""), "); action: ", d.value("action", ""),
          " (", d.value("action_reason", ""), ")\n");
    }
  }
  if (j.value("rollbacks", 0) > 0) {
    std::vector<std::string> ranges;
    for (const json& r : j["skipped_data"]) {
      ranges.push_back(
          absl::StrCat(r[0].get<int64_t>(), ":", r[1].get<int64_t>()));
    }
    absl::StrAppend(
        &out, "numeric rollbacks: ", j.value("rollbacks", 0),
        "; data skipped: ",
        ranges.empty() ? std::string("none") : absl::StrJoin(ranges, ","),
        "\n");
  }
  if (j.contains("ettr")) {
    absl::StrAppend(
        &out, absl::StrFormat(
                  "ETTR: %.3f (productive step time %.0f ms at %.2f of "
                  "it the healthy pace, over %.0f ms from the first "
                  "step to the last; %.3f counting slow steps whole)\n",
                  j.value("ettr", 0.0), j.value("productive_ms", 0.0),
                  j.value("healthy_pace", 1.0), j.value("train_wall_ms", 0.0),
                  j.value("ettr_step_time", 0.0)));
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
  for (const json& p : j.value("problems", json::array())) {
    absl::StrAppend(&out, "problem (exit code ", p.value("exit_code", 0),
                    "): ", p.value("problem", ""), "\n");
  }
  absl::StrAppend(&out, "wall: ", j.value("wall_ms", 0), " ms\n");
  absl::StrAppend(&out, "exit code: ", j.value("exit_code", 0), "\n");
  std::fputs(out.c_str(), stderr);
}

void Launcher::AddDiagnoses(json* summary) const {
  if (log_dir_.empty() || !summary->contains("incidents")) return;
  const json incidents = (*summary)["incidents"];
  std::map<int64_t, json> verdicts;  // generation -> verdict
  for (json& i : (*summary)["incidents"]) {
    const int64_t g = i.value("generation", int64_t{-1});
    if (g < 0) continue;
    auto v = verdicts.find(g);
    if (v == verdicts.end()) {
      absl::StatusOr<diagnose::Evidence> ev =
          diagnose::Load(log_dir_, g, incidents);
      json verdict;
      if (ev.ok()) {
        verdict = diagnose::ToJson(g, diagnosis::Diagnose(ev->slots));
      } else {
        verdict = {{"generation", g},
                   {"kind", "undecided"},
                   {"evidence", std::string(ev.status().message())}};
      }
      v = verdicts.emplace(g, std::move(verdict)).first;
    }
    i["offline_diagnosis"] = v->second;
  }
}

}  // namespace holdfast::run
