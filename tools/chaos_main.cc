// holdfast-chaos: soaks a trainer under holdfast-run with faults injected
// from outside, by pid, and checks that none costs the model or the job.
//
//   holdfast-chaos [-n N] [--standby K] [--replicas R] [--hosts H]
//                  [--duration-s S] [--seed X] [--gap-ms MS]
//                  [--hang-s S] [--log-dir DIR] [--json] -- CMD ARGS...
//
// It runs CMD under holdfast-run once without faults, for the reference
// state hash, then again and again with faults until --duration-s is
// spent. Faults come on a schedule drawn from --seed: SIGKILL of a worker,
// SIGSTOP of a worker (SIGCONT once the controller fenced it), SIGKILL of
// a standby, SIGKILL of every worker of one fake host (--hosts), and
// clusters of two or three of these within one second. The next cluster
// waits until the job has recovered from the last (every slot held, a few
// steps committed since) and never loses more failure domains than
// --replicas covers nor more processes than there are standbys.
//
// For each run it reports the faults, and whether the job hung (not done
// within --hang-s), was lost (did not finish), or diverged (finished in
// the full world with a state hash other than the fault-free run's); and
// the ETTR over all runs (productive step time over the wall time from
// the first step to the last, summed over the runs).
//
// Exit codes: 0 no hang, divergence or loss; 1 any; 2 bad usage or the
// fault-free run failed.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tools/chaos.h"

extern char** environ;

namespace {

namespace chaos = holdfast::chaos;
using nlohmann::json;

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return json(json::value_t::discarded);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str(), nullptr, false);
}

struct Options {
  std::string run_bin;
  int n = 4, standby = 4, replicas = 2, hosts = 0;
  int64_t duration_s = 120, seed = 1, gap_ms = 2000, hang_s = 0;
  std::string log_dir;
  bool as_json = false;
  std::vector<std::string> cmd;
};

// One fault as it was injected.
struct Injected {
  chaos::Fault fault;
  int64_t at_ms = 0;  // since the run's start
};

struct RunResult {
  int index = 0;
  std::vector<Injected> faults;
  bool timed_out = false;
  json summary;
  chaos::Verdict verdict;
  int64_t wall_ms = 0;
  std::string dir;
};

class Soak {
 public:
  explicit Soak(Options o) : o_(std::move(o)) {}
  int Main();

 private:
  // Runs the job once; with `faults`, injects them on `rng`'s schedule.
  RunResult RunOnce(int index, bool faults, std::mt19937_64* rng,
                    absl::Duration bound);
  pid_t Spawn(const std::string& dir);
  void Inject(pid_t group, const chaos::Fault& f, RunResult* r,
              absl::Time start);
  void Say(const std::string& line) {
    if (!o_.as_json) std::fprintf(stderr, "holdfast-chaos: %s\n", line.c_str());
  }

  Options o_;
  // Stopped processes waiting for their member to be fenced: pid -> member.
  std::map<int64_t, std::string> stopped_;
};

pid_t Soak::Spawn(const std::string& dir) {
  std::vector<std::string> args = {o_.run_bin,
                                   "-n",
                                   absl::StrCat(o_.n),
                                   "--standby",
                                   absl::StrCat(o_.standby),
                                   "--replicas",
                                   absl::StrCat(o_.replicas),
                                   "--log-dir",
                                   dir,
                                   "--checkpoint-dir",
                                   dir + "/checkpoints"};
  if (o_.hosts > 0) {
    args.insert(args.end(), {"--hosts", absl::StrCat(o_.hosts)});
  }
  args.push_back("--");
  args.insert(args.end(), o_.cmd.begin(), o_.cmd.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string out = dir + "/out.txt", err = dir + "/err.txt";
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  // Its own process group, which its trainers inherit: a hung run is
  // killed whole.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return rc == 0 ? pid : -1;
}

void Soak::Inject(pid_t group, const chaos::Fault& f, RunResult* r,
                  absl::Time start) {
  // Only processes of this run's group: a pid read from members.json that
  // exited and was reused is never signalled.
  for (size_t i = 0; i < f.pids.size(); ++i) {
    const pid_t pid = static_cast<pid_t>(f.pids[i]);
    if (getpgid(pid) != group) continue;
    if (f.kind == chaos::Kind::kStop) {
      kill(pid, SIGSTOP);
      stopped_[pid] = f.members[i];
    } else {
      kill(pid, SIGKILL);
    }
  }
  r->faults.push_back({f, absl::ToInt64Milliseconds(absl::Now() - start)});
  std::vector<std::string> slots;
  for (int s : f.slots) slots.push_back(s < 0 ? "standby" : absl::StrCat(s));
  Say(absl::StrCat("run ", r->index, ": ", chaos::KindName(f.kind), " ",
                   f.domain, " (slot ", absl::StrJoin(slots, ","), "; pid ",
                   absl::StrJoin(f.pids, ","), ")"));
}

RunResult Soak::RunOnce(int index, bool faults, std::mt19937_64* rng,
                        absl::Duration bound) {
  RunResult r;
  r.index = index;
  r.dir = absl::StrCat(o_.log_dir, "/run-", index);
  std::filesystem::create_directories(r.dir);
  stopped_.clear();
  const absl::Time start = absl::Now();
  const pid_t pid = Spawn(r.dir);
  if (pid < 0) {
    r.verdict.job_lost = true;
    r.verdict.why = "could not start holdfast-run";
    return r;
  }
  // The schedule: a cluster is planned once the job is healthy (every slot
  // held, nothing stopped, `settle` steps committed since the last
  // cluster's faults were seen) and `gap` later; its faults go in at their
  // delays.
  constexpr int64_t kSettle = 3;
  std::exponential_distribution<double> gap_dist(1.0 / o_.gap_ms);
  std::vector<chaos::Fault> pending;
  absl::Time cluster_start = absl::InfinitePast();
  std::optional<absl::Time> next_at;
  int64_t mark = -1;             // committed step at which healthy again
  std::vector<std::string> hit;  // member ids of the last cluster
  int status = 0;
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (absl::Now() - start > bound) {
      r.timed_out = true;
      kill(-pid, SIGCONT);
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(25));
    if (!faults) continue;
    const json m = ReadJson(r.dir + "/members.json");
    if (!m.is_object()) continue;
    // Wake stopped members once the controller fenced them.
    std::map<std::string, std::string> state;
    for (const json& x : m["members"]) {
      state[x.value("member", "")] = x.value("state", "");
    }
    for (auto it = stopped_.begin(); it != stopped_.end();) {
      if (state[it->second] != "STATE_ALIVE") {
        kill(static_cast<pid_t>(it->first), SIGCONT);
        it = stopped_.erase(it);
      } else {
        ++it;
      }
    }
    if (m.value("job_state", "") != "JOB_RUNNING") continue;
    // Faults of the current cluster still to go in.
    if (!pending.empty()) {
      const int64_t since =
          absl::ToInt64Milliseconds(absl::Now() - cluster_start);
      while (!pending.empty() && pending.front().delay_ms <= since) {
        Inject(pid, pending.front(), &r, start);
        for (const std::string& id : pending.front().members) {
          hit.push_back(id);
        }
        pending.erase(pending.begin());
      }
      continue;
    }
    const std::vector<chaos::Member> live = chaos::LiveMembers(m);
    int workers = 0;
    bool waiting = !stopped_.empty();
    for (const chaos::Member& x : live) {
      workers += x.worker;
      for (const std::string& id : hit) waiting |= x.id == id;
    }
    const int64_t committed = m.value("committed_step", int64_t{-1});
    if (waiting || workers < o_.n) {
      mark = -1;
      next_at.reset();
      continue;
    }
    if (mark < 0) mark = committed;
    if (committed < mark + kSettle) continue;
    if (!next_at.has_value()) {
      next_at = absl::Now() +
                absl::Milliseconds(std::clamp<int64_t>(
                    static_cast<int64_t>(gap_dist(*rng)), 200, 3 * o_.gap_ms));
    }
    if (absl::Now() < *next_at) continue;
    chaos::PlanOptions po;
    po.replicas = o_.replicas;
    po.hosts = o_.hosts > 0;
    pending = chaos::PlanCluster(*rng, live, po);
    cluster_start = absl::Now();
    hit.clear();
    mark = -1;
    next_at.reset();
    if (pending.empty()) faults = false;  // no standby left to cover one
  }
  r.wall_ms = absl::ToInt64Milliseconds(absl::Now() - start);
  r.summary = ReadJson(r.dir + "/summary.json");
  return r;
}

int Soak::Main() {
  if (o_.log_dir.empty()) {
    char tmpl[] = "/tmp/holdfast-chaos-XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (d == nullptr) {
      std::fprintf(stderr, "holdfast-chaos: mkdtemp: %s\n", strerror(errno));
      return 2;
    }
    o_.log_dir = d;
  }
  Say(absl::StrCat("logs in ", o_.log_dir, "; seed ", o_.seed));
  const absl::Time soak_start = absl::Now();
  // The fault-free run: its state hash is the reference, its wall time
  // sets the default hang bound.
  RunResult ref = RunOnce(0, false, nullptr, absl::Seconds(600));
  const std::string reference = ref.summary.is_object()
                                    ? ref.summary.value("state_hash", "")
                                    : std::string();
  if (ref.timed_out || !ref.summary.is_object() ||
      ref.summary.value("outcome", "") != "finished" || reference.empty()) {
    std::fprintf(stderr,
                 "holdfast-chaos: the fault-free run did not finish with a "
                 "state hash (see %s/err.txt)\n",
                 ref.dir.c_str());
    return 2;
  }
  const absl::Duration bound =
      o_.hang_s > 0 ? absl::Seconds(o_.hang_s)
                    : absl::Milliseconds(3 * ref.wall_ms) + absl::Seconds(60);
  Say(absl::StrCat("fault-free run: state ", reference, " in ", ref.wall_ms,
                   " ms; hang bound ", absl::FormatDuration(bound)));
  std::mt19937_64 rng(static_cast<uint64_t>(o_.seed));
  std::vector<RunResult> runs;
  const absl::Time end = soak_start + absl::Seconds(o_.duration_s);
  // A run starts while there is time for one more fault-free run's length.
  while (runs.empty() || absl::Now() + absl::Milliseconds(ref.wall_ms) <= end) {
    RunResult r = RunOnce(static_cast<int>(runs.size()) + 1, true, &rng, bound);
    r.verdict = chaos::Judge(r.timed_out, r.summary, reference, o_.n);
    Say(absl::StrCat(
        "run ", r.index, ": ", r.faults.size(), " faults; ",
        r.verdict.hang        ? "HANG"
        : r.verdict.job_lost  ? "JOB LOST"
        : r.verdict.divergent ? "DIVERGED"
        : r.verdict.shrunk    ? "finished in a smaller world"
                              : "finished with the fault-free state",
        r.verdict.why.empty() ? "" : absl::StrCat(" (", r.verdict.why, ")"),
        " in ", r.wall_ms, " ms"));
    runs.push_back(std::move(r));
  }

  std::map<std::string, int> by_kind;
  int faults = 0, processes = 0, hangs = 0, losses = 0, divergences = 0,
      shrunk = 0;
  double productive = 0, train_wall = 0;
  json jruns = json::array();
  for (const RunResult& r : runs) {
    json jf = json::array();
    for (const Injected& i : r.faults) {
      ++faults;
      processes += static_cast<int>(i.fault.pids.size());
      ++by_kind[chaos::KindName(i.fault.kind)];
      jf.push_back({{"kind", chaos::KindName(i.fault.kind)},
                    {"domain", i.fault.domain},
                    {"slots", i.fault.slots},
                    {"pids", i.fault.pids},
                    {"at_ms", i.at_ms}});
    }
    hangs += r.verdict.hang;
    losses += r.verdict.job_lost;
    divergences += r.verdict.divergent;
    shrunk += r.verdict.shrunk;
    if (r.summary.is_object() && !r.verdict.hang && !r.verdict.job_lost) {
      productive += r.summary.value("productive_ms", 0.0);
      train_wall += r.summary.value("train_wall_ms", 0.0);
    }
    jruns.push_back(
        {{"index", r.index},
         {"dir", r.dir},
         {"faults", jf},
         {"wall_ms", r.wall_ms},
         {"hang", r.verdict.hang},
         {"job_lost", r.verdict.job_lost},
         {"divergent", r.verdict.divergent},
         {"shrunk", r.verdict.shrunk},
         {"why", r.verdict.why},
         {"state_hash",
          r.summary.is_object() ? r.summary.value("state_hash", "") : ""},
         {"ettr", r.summary.is_object() ? r.summary.value("ettr", 0.0) : 0.0}});
  }
  const double ettr = train_wall > 0 ? productive / train_wall : 0.0;
  const bool ok = hangs == 0 && losses == 0 && divergences == 0;
  json out = {{"seed", o_.seed},
              {"duration_s", o_.duration_s},
              {"n", o_.n},
              {"standby", o_.standby},
              {"replicas", o_.replicas},
              {"hosts", o_.hosts},
              {"command", absl::StrJoin(o_.cmd, " ")},
              {"reference_state_hash", reference},
              {"reference_wall_ms", ref.wall_ms},
              {"reference_ettr", ref.summary.value("ettr", 0.0)},
              {"runs", runs.size()},
              {"faults", faults},
              {"processes_hit", processes},
              {"faults_by_kind", by_kind},
              {"hangs", hangs},
              {"job_losses", losses},
              {"divergences", divergences},
              {"shrunk", shrunk},
              {"ettr", ettr},
              {"ok", ok},
              {"log_dir", o_.log_dir},
              {"run_details", jruns}};
  if (o_.as_json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::string kinds;
    for (const auto& [k, c] : by_kind) absl::StrAppend(&kinds, " ", k, "=", c);
    std::printf(
        "holdfast-chaos: seed %lld, %zu runs, %d faults (%d processes;%s)\n"
        "  hangs %d, divergences %d, job losses %d, shrunk %d\n"
        "  ETTR %.3f (fault-free run %.3f)\n  %s\n",
        static_cast<long long>(o_.seed), runs.size(), faults, processes,
        kinds.c_str(), hangs, divergences, losses, shrunk, ettr,
        ref.summary.value("ettr", 0.0), ok ? "OK" : "FAILED");
  }
  return ok ? 0 : 1;
}

// holdfast-run beside this binary, else on PATH.
std::string DefaultRunBin() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto beside = self.parent_path() / "holdfast-run";
    if (std::filesystem::exists(beside, ec)) return beside.string();
  }
  return "holdfast-run";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "holdfast-chaos: soak a trainer under holdfast-run with faults "
      "injected by pid"};
  Options o;
  o.run_bin = DefaultRunBin();
  app.add_option("-n,--nproc", o.n, "worker slots")->check(CLI::Range(3, 256));
  app.add_option("--standby", o.standby, "warm standbys")
      ->check(CLI::Range(1, 256));
  app.add_option("--replicas", o.replicas,
                 "copies of each piece on buddies; a cluster never takes out "
                 "more failure domains")
      ->check(CLI::Range(1, 16));
  app.add_option("--hosts", o.hosts,
                 "fake hosts (holdfast-run --hosts): host kills, and hosts "
                 "as failure domains")
      ->check(CLI::Range(0, 256));
  app.add_option("--duration-s", o.duration_s,
                 "keep starting faulty runs for this long")
      ->check(CLI::Range(int64_t{1}, int64_t{7} * 24 * 3600));
  app.add_option("--seed", o.seed, "seed of the fault schedule");
  app.add_option("--gap-ms", o.gap_ms,
                 "mean time from a recovered job to the next cluster")
      ->check(CLI::Range(int64_t{10}, int64_t{3600000}));
  app.add_option("--hang-s", o.hang_s,
                 "a run not done in this long is a hang (default: three "
                 "fault-free runs plus 60 s)")
      ->check(CLI::Range(int64_t{1}, int64_t{86400}));
  app.add_option("--log-dir", o.log_dir,
                 "keep each run's logs here (default: a new /tmp directory)");
  app.add_option("--run", o.run_bin, "the holdfast-run binary");
  app.add_flag("--json", o.as_json, "print the report as JSON on stdout");
  app.add_option("cmd", o.cmd, "the trainer command (after --)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (o.hosts > o.n) {
    std::fprintf(stderr, "holdfast-chaos: --hosts %d is more than -n %d\n",
                 o.hosts, o.n);
    return 2;
  }
  Soak soak(o);
  return soak.Main();
}
