// Diagnosis benchmark: a seeded campaign of single faults on real jobs, and
// how often the controller names the right culprit, how fast, and how many
// members it fences for it.
//
// Each trial is one job of holdfast-run (R workers, 1 standby, no disk
// tier) and the example trainer, with one fault on a random slot at a
// random point of a random step:
//   kill             SIGKILL from outside (by pid, from members.json);
//   stop-compute     SIGSTOP from outside while the slot computes (steps
//                    of --step-ms of compute);
//   stop-collective  SIGSTOP from outside while the slot waits inside its
//                    all-reduce: the next slot is slowed (slow:ms=300) and
//                    the steps have almost no compute of their own, so
//                    the others spend their steps waiting for it there;
//   stall            the slot's step thread blocks (stall:): the process
//                    heartbeats on;
//   mismatch         the slot issues a Barrier where the others all-reduce
//                    (mismatch:);
//   fail-op          the slot's collective fails with a transport error
//                    (fail-op:): a transient fault; the right verdict
//                    names the slot and fences nobody.
// Every job runs with HOLDFAST_TIMEOUT_MS=3000 (the op timeout: a stall or
// a mismatch is seen when the others' collective times out) and
// holdfast-run's detection defaults (heartbeat 500 ms, silent after 3 s).
//
// For each kind and world size it prints the share of trials whose first
// incident's verdict named exactly the faulty slot with the kind that
// fault should get (right: kill dead, stop-compute and stop-collective
// frozen, stall compute-hang, mismatch mismatch, fail-op op-failed), named
// the faulty slot alone with another kind (wrong kind), named another slot
// (a false accusation), or named nobody (undecided); the time from
// the fault (the signal, or the injector's log line) to the verdict, p50
// and p90; the members fenced per fault (evictions); and the share that
// ended with the fault-free model. The baseline, measured in the same run
// as the fault-free hash, is what a job without diagnosis does: restart
// every process, R evictions per fault.
//
//   diagnosis_bench [--ranks 4,8] [--faults 100] [--seed 1] [--json]
//                   [--kinds kill,stop-compute,...] [--keep]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmarks/bench_job.h"
#include "test/support/members_json.h"
#include "test/support/process_group.h"

using nlohmann::json;
using namespace holdfast::bench;  // NOLINT: the benchmarks' helpers

namespace {

constexpr int64_t kSteps = 30;

// The verdict kind each fault should get (src/diagnosis/diagnosis.h).
std::string ExpectedVerdict(const std::string& fault) {
  static const std::map<std::string, std::string> kExpected = {
      {"kill", "dead"},
      {"stop-compute", "frozen"},
      {"stop-collective", "frozen"},
      {"stall", "compute-hang"},
      {"mismatch", "mismatch"},
      {"fail-op", "op-failed"}};
  auto it = kExpected.find(fault);
  return it == kExpected.end() ? "" : it->second;
}

struct Trial {
  std::string kind;
  int ranks = 4;
  int slot = 0;
  int64_t step = 0;  // the fault comes at this step (or collective)
  int64_t ms = 0;    // and this far into it
};

struct Outcome {
  Trial trial;
  bool finished = false;
  bool model_ok = false;
  std::string verdict_kind;
  std::string evidence;  // the verdict's
  std::vector<int> culprits;
  int64_t verdict_ms = -1;  // from the fault; -1 without a verdict
  int evictions = 0;
  std::string note;
};

struct Paths {
  std::string run = HOLDFAST_RUN_BIN;
  std::string trainer = HOLDFAST_DP_TRAINER_BIN;
};

// One job; `trial.kind` empty runs it without a fault. The final hash of
// every slot goes to `hash` ("" when they differ or the job failed).
Outcome RunTrial(const Paths& p, const Trial& t, const std::string& want_hash,
                 std::string* hash, bool keep) {
  Outcome o;
  o.trial = t;
  const std::string dir = holdfast::proc::MakeTempDir();
  std::vector<std::string> args = {"-n", std::to_string(t.ranks), "--standby",
                                   "1",  "--no-disk-tier",        "--log-dir",
                                   dir};
  std::vector<std::string> trainer = {"--steps", std::to_string(kSteps),
                                      "--step-ms", "50"};
  std::string inject;
  if (t.kind == "stop-collective") {
    inject = absl::StrCat("slow:slot=", (t.slot + 1) % t.ranks, ":ms=300");
    trainer[3] = "2";
  } else if (t.kind == "stall") {
    inject =
        absl::StrCat("stall:slot=", t.slot, ":step=", t.step, ":ms=", t.ms);
  } else if (t.kind == "mismatch" || t.kind == "fail-op") {
    inject = absl::StrCat(t.kind, ":slot=", t.slot, ":seq=", t.step);
  }
  if (!inject.empty()) {
    args.push_back("--inject");
    args.push_back(inject);
  }
  const std::string cmd = absl::StrCat(
      "HOLDFAST_TIMEOUT_MS=3000 exec ", p.run, " ", absl::StrJoin(args, " "),
      " -- ", p.trainer, " ", absl::StrJoin(trainer, " "), " > ", dir,
      "/out.txt 2> ", dir, "/err.txt");
  const pid_t job = Start(cmd);
  int64_t fault_ms = 0;
  pid_t victim = -1;
  if (t.kind == "kill" || t.kind == "stop-compute" ||
      t.kind == "stop-collective") {
    victim = holdfast::test::AwaitWorker(
        dir, t.slot, t.step, absl::Seconds(60), [job] {
          // Exited (without reaping it: Await does).
          siginfo_t info{};
          return waitid(P_PID, static_cast<id_t>(job), &info,
                        WEXITED | WNOHANG | WNOWAIT) == 0 &&
                 info.si_pid == job;
        });
    if (victim > 0) {
      absl::SleepFor(absl::Milliseconds(t.ms));
      ::kill(victim, t.kind == "kill" ? SIGKILL : SIGSTOP);
      fault_ms = NowMs();
    }
  }
  const std::optional<int> status =
      Await(job, absl::Now() + absl::Seconds(180));
  if (victim > 0) ::kill(victim, SIGKILL);  // a stopped one, if left
  const std::string out = ReadFile(dir + "/out.txt");
  const std::string err = ReadFile(dir + "/err.txt");
  if (fault_ms == 0 && !t.kind.empty()) {
    fault_ms = InjectedAt(err, t.kind == "stall" ? "stall" : t.kind);
  }
  const json summary =
      json::parse(ReadFile(dir + "/summary.json"), nullptr, false);
  o.finished = status.has_value() && WIFEXITED(*status) &&
               WEXITSTATUS(*status) == 0 && summary.is_object() &&
               summary.value("outcome", "") == "finished";
  if (!status.has_value()) o.note = "the job hung (killed after 180 s)";
  const std::string agreed = AgreedHash(out, t.ranks);
  if (hash != nullptr) *hash = o.finished ? agreed : "";
  o.model_ok = o.finished && !agreed.empty() && agreed == want_hash;
  if (summary.is_object() && summary.contains("incidents") &&
      summary["incidents"].is_array()) {
    const json& incidents = summary["incidents"];
    for (const json& i : incidents) o.evictions += i.value("evicted", false);
    // The fault's incident: the first that is not a straggler report (the
    // slowed slot of stop-collective is one).
    size_t at = 0;
    while (at < incidents.size() &&
           incidents[at].value("kind", "") == "straggler") {
      ++at;
    }
    if (at < incidents.size() && incidents[at].contains("diagnosis")) {
      const json& d = incidents[at]["diagnosis"];
      o.verdict_kind = d.value("kind", "");
      o.evidence = d.value("evidence", "");
      o.culprits = d.value("culprits", std::vector<int>{});
      if (fault_ms > 0) {
        o.verdict_ms = d.value("verdict_unix_ms", int64_t{0}) - fault_ms;
      }
    } else if (!t.kind.empty()) {
      o.note = at >= incidents.size() ? "no incident" : "no verdict";
    }
  }
  if (!t.kind.empty() && fault_ms == 0) o.note = "the fault did not fire";
  if (!keep) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  } else {
    o.note += " (logs: " + dir + ")";
  }
  return o;
}

struct Row {
  std::string kind;
  int ranks = 0;
  int n = 0, right = 0, wrong_kind = 0, wrong = 0, undecided = 0;
  int model_ok = 0, hung = 0;
  int evictions = 0;
  std::vector<int64_t> verdict_ms;  // right ones only
};

json RowJson(const Row& r) {
  auto share = [&](int k) { return r.n > 0 ? double(k) / r.n : 0.0; };
  return {{"kind", r.kind},
          {"ranks", r.ranks},
          {"faults", r.n},
          {"right", share(r.right)},
          {"wrong_kind", share(r.wrong_kind)},
          {"false_accusations", share(r.wrong)},
          {"undecided", share(r.undecided)},
          {"verdict_ms_p50", Percentile(r.verdict_ms, 0.5)},
          {"verdict_ms_p90", Percentile(r.verdict_ms, 0.9)},
          {"evictions_per_fault", r.n > 0 ? double(r.evictions) / r.n : 0.0},
          {"fault_free_model", share(r.model_ok)},
          {"hung", r.hung}};
}

// The faults on world size `n`: a fault-free job first (the reference
// hash), then `faults` trials of random kinds; their rows and trials are
// added. False if the fault-free job failed.
bool Campaign(const Paths& paths, int n, int faults,
              const std::vector<std::string>& kinds, bool keep, bool verbose,
              std::mt19937_64* rng, std::vector<Row>* rows, json* trials) {
  std::string reference;
  RunTrial(paths, Trial{"", n}, "", &reference, false);
  if (reference.empty()) {
    std::fprintf(stderr,
                 "diagnosis_bench: the fault-free job of %d ranks failed\n", n);
    return false;
  }
  std::map<std::string, Row> by_kind;
  for (int f = 0; f < faults; ++f) {
    Trial t;
    t.ranks = n;
    t.kind = kinds[(*rng)() % kinds.size()];
    t.slot = static_cast<int>((*rng)() % n);
    t.step = 6 + static_cast<int64_t>((*rng)() % 12);
    t.ms = static_cast<int64_t>((*rng)() % 50);
    const Outcome o = RunTrial(paths, t, reference, nullptr, keep);
    Row& row = by_kind[t.kind];
    row.kind = t.kind;
    row.ranks = n;
    ++row.n;
    const bool named = o.culprits == std::vector<int>{t.slot};
    const bool right = named && o.verdict_kind == ExpectedVerdict(t.kind);
    const bool wrong = std::any_of(o.culprits.begin(), o.culprits.end(),
                                   [&](int c) { return c != t.slot; });
    row.right += right;
    row.wrong_kind += named && !right;
    row.wrong += wrong;
    row.undecided += o.culprits.empty();
    row.model_ok += o.model_ok;
    row.hung += o.note.find("hung") != std::string::npos;
    row.evictions += o.evictions;
    if (right && o.verdict_ms >= 0) row.verdict_ms.push_back(o.verdict_ms);
    trials->push_back({{"ranks", n},
                       {"kind", t.kind},
                       {"slot", t.slot},
                       {"step", t.step},
                       {"ms", t.ms},
                       {"verdict", o.verdict_kind},
                       {"culprits", o.culprits},
                       {"evidence", o.evidence},
                       {"verdict_ms", o.verdict_ms},
                       {"evictions", o.evictions},
                       {"fault_free_model", o.model_ok},
                       {"note", o.note}});
    if (verbose) {
      std::fprintf(stderr,
                   "  %d ranks #%d %-15s slot %d step %lld: %s [%s] in %lld "
                   "ms, %d evicted, model %s %s\n",
                   n, f + 1, t.kind.c_str(), t.slot,
                   static_cast<long long>(t.step), o.verdict_kind.c_str(),
                   absl::StrJoin(o.culprits, ",").c_str(),
                   static_cast<long long>(o.verdict_ms), o.evictions,
                   o.model_ok ? "ok" : "DIFFERS", o.note.c_str());
    }
  }
  for (auto& [k, r] : by_kind) rows->push_back(r);
  return true;
}

// Prints the table (or, with `as_json`, the rows and trials as JSON).
void Report(const std::vector<Row>& rows, const json& trials, uint64_t seed,
            int faults, bool as_json) {
  // Totals per world size.
  json out_rows = json::array();
  std::map<int, Row> totals;
  for (const Row& r : rows) {
    out_rows.push_back(RowJson(r));
    Row& t = totals[r.ranks];
    t.kind = "all";
    t.ranks = r.ranks;
    t.n += r.n;
    t.right += r.right;
    t.wrong_kind += r.wrong_kind;
    t.wrong += r.wrong;
    t.undecided += r.undecided;
    t.model_ok += r.model_ok;
    t.hung += r.hung;
    t.evictions += r.evictions;
    t.verdict_ms.insert(t.verdict_ms.end(), r.verdict_ms.begin(),
                        r.verdict_ms.end());
  }
  for (auto& [n, t] : totals) out_rows.push_back(RowJson(t));
  if (as_json) {
    json doc = {{"seed", seed},
                {"faults_per_world", faults},
                {"op_timeout_ms", 3000},
                {"rows", out_rows},
                {"trials", trials}};
    std::printf("%s\n", doc.dump(1).c_str());
    return;
  }
  std::printf("\n%-15s %5s %6s %6s %6s %6s %6s %8s %8s %9s %9s %7s\n", "kind",
              "ranks", "faults", "right", "kind?", "false", "undec", "p50 ms",
              "p90 ms", "evict/f", "vs restart", "model");
  for (const json& r : out_rows) {
    const double evict = r["evictions_per_fault"].get<double>();
    std::printf(
        "%-15s %5d %6d %5.0f%% %5.0f%% %5.0f%% %5.0f%% %8lld %8lld %9.2f "
        "%9.2fx %6.0f%%\n",
        r["kind"].get<std::string>().c_str(), r["ranks"].get<int>(),
        r["faults"].get<int>(), 100 * r["right"].get<double>(),
        100 * r["wrong_kind"].get<double>(),
        100 * r["false_accusations"].get<double>(),
        100 * r["undecided"].get<double>(),
        static_cast<long long>(r["verdict_ms_p50"].get<int64_t>()),
        static_cast<long long>(r["verdict_ms_p90"].get<int64_t>()), evict,
        evict / r["ranks"].get<int>(),
        100 * r["fault_free_model"].get<double>());
  }
  std::printf(
      "\nright: the first incident's verdict named the faulty slot alone, "
      "with the kind that fault should get; kind?: the slot alone, another "
      "kind; false: it named another slot; undec: nobody; p50/p90: from the "
      "fault to the verdict "
      "(right ones); evict/f: members fenced per fault (fail-op: 0 is "
      "right); vs restart: against restarting every process (R per fault); "
      "model: ended with the fault-free hash.\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"diagnosis_bench: culprits named right, wrong or not at all"};
  std::string ranks_list = "4,8";
  std::string kinds_list =
      "kill,stop-compute,stop-collective,stall,mismatch,fail-op";
  int faults = 100;
  uint64_t seed = 1;
  bool as_json = false, keep = false;
  Paths paths;
  app.add_option("--ranks", ranks_list, "world sizes, comma-separated");
  app.add_option("--faults", faults, "faults per world size")
      ->check(CLI::Range(1, 100000));
  app.add_option("--kinds", kinds_list, "fault kinds, comma-separated");
  app.add_option("--seed", seed, "campaign seed");
  app.add_option("--run", paths.run, "holdfast-run");
  app.add_option("--trainer", paths.trainer, "the example trainer");
  app.add_flag("--json", as_json, "print JSON");
  app.add_flag("--keep", keep, "keep each job's log directory");
  CLI11_PARSE(app, argc, argv);
  const std::vector<std::string> kinds = absl::StrSplit(kinds_list, ',');
  for (const std::string& k : kinds) {
    if (k != "kill" && k != "stop-compute" && k != "stop-collective" &&
        k != "stall" && k != "mismatch" && k != "fail-op") {
      std::fprintf(stderr, "diagnosis_bench: unknown fault kind '%s'\n",
                   k.c_str());
      return 2;
    }
  }
  std::vector<int> ranks;
  for (absl::string_view r : absl::StrSplit(ranks_list, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(r, &v) || v < 3 || v > 64) {
      std::fprintf(stderr,
                   "diagnosis_bench: --ranks: '%s' is not a world size in "
                   "[3, 64]\n",
                   std::string(r).c_str());
      return 2;
    }
    ranks.push_back(v);
  }
  std::mt19937_64 rng(seed);
  std::vector<Row> rows;
  json trials = json::array();
  for (int n : ranks) {
    if (!Campaign(paths, n, faults, kinds, keep, !as_json, &rng, &rows,
                  &trials)) {
      return 1;
    }
  }
  Report(rows, trials, seed, faults, as_json);
  return 0;
}
