// Gray-failure benchmark: a seeded campaign of slowed ranks, fault-free
// runs (uniform steps and an RL job's uneven steps), and NaNs, on real jobs
// of holdfast-run and the example trainer (R workers, 1 standby, no disk
// tier, the straggler policy "report").
//
//   stragglers  slow:slot=S:ms=(F-1)*step_ms:step=T for F of 1.2, 1.5, 2
//               and 5 on a random slot S from a random step T: that slot's
//               own work per step becomes F times its peers'. A straggler
//               incident naming S is a detection; any other incident (a
//               straggler naming another slot, a stall, a rollback) is a
//               false alarm. The time to detect runs from the
//               injector's first slowed step (its log line) to the
//               incident.
//   stop 60%    slowness from outside the process: slot S is SIGSTOPped
//               60 ms of every 100 ms by pid from step T, and every rank
//               burns its compute (--burn, CPU time, not a sleep);
//   quota 10%   slot S is capped at 10 % of a core with the cgroup v1 cpu
//               controller from step T (--burn too; on this 2-core VM
//               four burning ranks get about half a core each, so a cap
//               must be well below that to slow one: skipped where no
//               cgroup can be made). For both, as for slow, a straggler
//               incident naming S is a detection, timed from the
//               throttle's start.
//   uniform     no fault, replica checks on: any incident is a false
//               alarm.
//   uneven      no fault, --uneven 0.8 (lognormal step times, the same draw
//               on every rank, some steps 5-10x the median): the same.
//   nan         nan:slot=S:step=T: the job must roll back, name slot S in
//               one incident of kind numeric, and its final hash must equal
//               that of a fault-free run told to skip the data the job
//               skipped (summary.json's skipped_data).
//   bitflip     bitflip:slot=S:step=T with replica checks at every snapshot
//               (--replica-check-every 1): right when the job's one
//               incident is a numeric rollback naming slot S for its
//               replicated state, no data is skipped, nobody is fenced and
//               the final hash is the fault-free run's. The time to detect
//               runs from the injector's flip to the incident.
//   gradflip    gradflip:slot=S:step=T (bit 30 of one of slot S's local
//               gradients, before the all-reduce; the value stays
//               finite): right when the job's one incident is a numeric
//               rollback naming slot S for its local gradient norm, no
//               data is skipped, nobody is fenced and the final hash is
//               the fault-free run's.
//
// It prints, per kind, the runs, recall, false alarms, precision and the
// time to detect (p50, p90); the healthy members fenced; and the share of
// NaNs and bit flips rolled back to the reference model with the right
// culprit and kind. Minder's published figures
// (precision 0.904, F1 0.893 on ByteDance's fleet) are quoted beside ours
// for reference; they are not measured here.
//
//   gray_bench [--ranks 4] [--runs 10] [--nan 5] [--bitflip 5]
//              [--gradflip 5] [--seed 1] [--json]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "benchmarks/bench_job.h"
#include "test/support/process_group.h"
#include "test/support/throttle.h"

using nlohmann::json;
using namespace holdfast::bench;  // NOLINT: the benchmarks' helpers

namespace {

struct Paths {
  std::string run = HOLDFAST_RUN_BIN;
  std::string trainer = HOLDFAST_DP_TRAINER_BIN;
};

struct Config {
  int ranks = 4;
  int steps = 150;
  int step_ms = 20;
  bool keep = false;
};

// Slowness from outside the process (test/support/throttle.h): "stop"
// (SIGSTOP `amount` ms of every 100 ms) or "quota" (`amount` % of a core)
// on `slot` from step `from`.
struct Outside {
  std::string how;
  int slot = 0;
  int64_t from = 0;
  int amount = 0;
};

struct Job {
  int64_t outside_ms = 0;  // when the outside throttle began (Unix ms)
  bool finished = false;
  json summary;
  std::string hash;  // agreed by every slot, else ""
  std::string err;   // the launcher's and the processes' stderr
};

Job RunJob(const Paths& p, const Config& c, const std::string& inject,
           const std::vector<std::string>& extra,
           const Outside* outside = nullptr) {
  const std::string dir = holdfast::proc::MakeTempDir();
  std::string cmd = absl::StrCat("exec ", p.run, " -n ", c.ranks,
                                 " --standby 1 --no-disk-tier --log-dir ", dir);
  if (!inject.empty()) absl::StrAppend(&cmd, " --inject ", inject);
  absl::StrAppend(&cmd, " -- ", p.trainer, " --steps ", c.steps, " --step-ms ",
                  c.step_ms);
  for (const std::string& e : extra) absl::StrAppend(&cmd, " ", e);
  absl::StrAppend(&cmd, " > ", dir, "/out.txt 2> ", dir, "/err.txt");
  const pid_t launcher = Start(cmd);
  std::unique_ptr<holdfast::test::DutyCycle> stop;
  std::unique_ptr<holdfast::test::CpuQuota> quota;
  if (outside != nullptr && outside->how == "stop") {
    stop = std::make_unique<holdfast::test::DutyCycle>(
        dir, outside->slot, outside->amount, 100, outside->from);
  } else if (outside != nullptr) {
    quota = std::make_unique<holdfast::test::CpuQuota>(
        dir, outside->slot, outside->amount, outside->from);
  }
  const std::optional<int> status =
      Await(launcher, absl::Now() + absl::Seconds(180));
  Job j;
  if (stop != nullptr) {
    stop->Stop();
    j.outside_ms = stop->onset_ms();
  }
  if (quota != nullptr) {
    quota->Stop();
    j.outside_ms = quota->onset_ms();
  }
  j.err = ReadFile(dir + "/err.txt");
  j.summary = json::parse(ReadFile(dir + "/summary.json"), nullptr, false);
  j.finished = status.has_value() && WIFEXITED(*status) &&
               WEXITSTATUS(*status) == 0 && j.summary.is_object() &&
               j.summary.value("outcome", "") == "finished";
  j.hash = j.finished ? AgreedHash(ReadFile(dir + "/out.txt"), c.ranks) : "";
  if (!c.keep) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  } else {
    std::fprintf(stderr, "  logs: %s\n", dir.c_str());
  }
  return j;
}

json Incidents(const Job& j) {
  if (j.summary.is_object() && j.summary.contains("incidents") &&
      j.summary["incidents"].is_array()) {
    return j.summary["incidents"];
  }
  return json::array();
}

struct Row {
  std::string kind;
  int runs = 0, detected = 0, false_alarms = 0, healthy_evicted = 0;
  int failed = 0;  // jobs that did not finish
  std::vector<int64_t> detect_ms;
};

// A kind of straggler run: slowed by `how` ("slow": the slow: fault, the
// rank sleeping (amount - 1) step times more; "stop" or "quota": from
// outside, Outside), or fault-free ("": "uniform" or "uneven").
struct StragglerKind {
  std::string name;
  std::string how;
  double amount = 0;
};

// One run of a straggler or fault-free kind.
void StragglerRun(const Paths& p, const Config& c, const StragglerKind& kind,
                  std::mt19937_64* rng, Row* row, json* trials) {
  const int slot = static_cast<int>((*rng)() % c.ranks);
  const int from = 10 + static_cast<int>((*rng)() % 10);
  const bool faulty = !kind.how.empty();
  std::string inject;
  std::vector<std::string> extra;
  Outside outside{kind.how, slot, from, static_cast<int>(kind.amount)};
  if (kind.how == "slow") {
    const int ms = static_cast<int>((kind.amount - 1) * c.step_ms + 0.5);
    inject = absl::StrCat("slow:slot=", slot, ":ms=", ms, ":step=", from);
  } else if (faulty) {
    extra = {"--burn"};
  } else {
    // Fault-free: every check is on, the replica check's too, so any
    // alarm of any of them counts against it.
    extra = {"--replica-check-every", "1"};
    if (kind.name == "uneven") {
      extra.push_back("--uneven");
      extra.push_back("0.8");
    }
  }
  const bool from_outside = faulty && kind.how != "slow";
  const Job j = RunJob(p, c, inject, extra, from_outside ? &outside : nullptr);
  ++row->runs;
  row->failed += !j.finished;
  const int64_t onset = !faulty        ? 0
                        : from_outside ? j.outside_ms
                                       : InjectedAt(j.err, "slow");
  bool found = false;
  int64_t detect_ms = -1;
  for (const json& i : Incidents(j)) {
    const std::string k = i.value("kind", "");
    const bool ours = faulty && i.value("slot", -1) == slot;
    if (i.value("evicted", false) && !ours) ++row->healthy_evicted;
    if (ours && k == "straggler") {
      if (!found && onset > 0) {
        detect_ms = i.value("detected_unix_ms", int64_t{0}) - onset;
      }
      found = true;
    } else {
      ++row->false_alarms;
    }
  }
  row->detected += found;
  if (detect_ms >= 0) row->detect_ms.push_back(detect_ms);
  trials->push_back({{"kind", kind.name},
                     {"slot", faulty ? slot : -1},
                     {"from_step", faulty ? from : -1},
                     {"detected", found},
                     {"detect_ms", detect_ms},
                     {"finished", j.finished},
                     {"incidents", Incidents(j).size()}});
}

// Whether the job's one incident is a numeric rollback naming `slot` that
// fenced nobody, with `evidence` in its words.
bool NamedOnce(const Job& j, int slot, const std::string& evidence) {
  const json inc = Incidents(j);
  return inc.size() == 1 && inc[0].value("kind", "") == "numeric" &&
         inc[0].value("slot", -1) == slot && !inc[0].value("evicted", false) &&
         inc[0].value("evidence", "").find(evidence) != std::string::npos;
}

// One bit flip of `row`'s kind: "bitflip" (at rest, with replica checks
// on) or "gradflip" (in the gradients before the all-reduce); whether it
// was named, rolled back without skipping and ended with `fault_free`.
bool FlipRun(const Paths& p, const Config& c, const std::string& fault_free,
             std::mt19937_64* rng, Row* row, json* trials) {
  const int slot = static_cast<int>((*rng)() % c.ranks);
  const int step = 10 + static_cast<int>((*rng)() % (c.steps - 20));
  const bool at_rest = row->kind == "bitflip";
  const Job j =
      RunJob(p, c, absl::StrCat(row->kind, ":slot=", slot, ":step=", step),
             at_rest ? std::vector<std::string>{"--replica-check-every", "1"}
                     : std::vector<std::string>{});
  ++row->runs;
  row->failed += !j.finished;
  const bool named = NamedOnce(
      j, slot, at_rest ? "replicated state differs" : "local gradient norms");
  const bool skipped = !j.summary.is_object() ||
                       !j.summary.value("skipped_data", json::array()).empty();
  for (const json& i : Incidents(j)) {
    row->healthy_evicted += i.value("evicted", false);
  }
  const bool model = !j.hash.empty() && j.hash == fault_free;
  const bool ok = named && !skipped && model;
  row->detected += ok;
  const int64_t onset = InjectedAt(j.err, row->kind);
  int64_t detect_ms = -1;
  if (named && onset > 0) {
    detect_ms = Incidents(j)[0].value("detected_unix_ms", int64_t{0}) - onset;
    row->detect_ms.push_back(detect_ms);
  }
  trials->push_back({{"kind", row->kind},
                     {"slot", slot},
                     {"step", step},
                     {"named", named},
                     {"data_skipped", skipped},
                     {"fault_free_model", model},
                     {"detect_ms", detect_ms},
                     {"finished", j.finished}});
  return ok;
}

// One NaN run and its reference run; whether the model matched.
bool NanRun(const Paths& p, const Config& c, std::mt19937_64* rng, Row* row,
            json* trials) {
  const int slot = static_cast<int>((*rng)() % c.ranks);
  const int step = 10 + static_cast<int>((*rng)() % (c.steps - 20));
  const Job j =
      RunJob(p, c, absl::StrCat("nan:slot=", slot, ":step=", step), {});
  ++row->runs;
  row->failed += !j.finished;
  std::vector<std::string> ranges;
  if (j.summary.is_object() && j.summary.contains("skipped_data")) {
    for (const json& r : j.summary["skipped_data"]) {
      ranges.push_back(
          absl::StrCat(r[0].get<int64_t>(), ":", r[1].get<int64_t>()));
    }
  }
  const bool rolled = j.summary.is_object() &&
                      j.summary.value("rollbacks", 0) >= 1 && !ranges.empty();
  const bool named = NamedOnce(j, slot, "");
  for (const json& i : Incidents(j)) {
    row->healthy_evicted += i.value("evicted", false);
  }
  std::string reference;
  if (rolled) {
    reference =
        RunJob(p, c, "", {"--skip-data", absl::StrJoin(ranges, ",")}).hash;
  }
  const bool ok = rolled && named && !j.hash.empty() && j.hash == reference;
  row->detected += ok;
  trials->push_back({{"kind", "nan"},
                     {"slot", slot},
                     {"step", step},
                     {"rolled_back", rolled},
                     {"named", named},
                     {"skipped", absl::StrJoin(ranges, ",")},
                     {"reference_model", ok},
                     {"finished", j.finished}});
  return ok;
}

json RowJson(const Row& r, bool faulty) {
  const double recall = r.runs > 0 ? double(r.detected) / r.runs : 0.0;
  const int alarms = r.detected + r.false_alarms;
  return {{"kind", r.kind},
          {"runs", r.runs},
          {"failed_jobs", r.failed},
          {"recall", faulty ? json(recall) : json(nullptr)},
          {"false_alarms", r.false_alarms},
          {"precision", faulty && alarms > 0 ? json(double(r.detected) / alarms)
                                             : json(nullptr)},
          {"detect_ms_p50", Percentile(r.detect_ms, 0.5)},
          {"detect_ms_p90", Percentile(r.detect_ms, 0.9)},
          {"healthy_evicted", r.healthy_evicted}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "gray_bench: stragglers found, false alarms, NaNs rolled back to the "
      "reference model"};
  Config c;
  int runs = 10, nans = 5, bitflips = 5, gradflips = 5;
  uint64_t seed = 1;
  bool as_json = false;
  Paths paths;
  app.add_option("--ranks", c.ranks, "workers per job")
      ->check(CLI::Range(3, 32));
  app.add_option("--runs", runs, "runs per slowdown and per fault-free kind")
      ->check(CLI::Range(0, 10000));
  app.add_option("--nan", nans, "NaN runs (each with its reference run)")
      ->check(CLI::Range(0, 10000));
  app.add_option("--bitflip", bitflips,
                 "bit-flip runs (replica checks on; one fault-free run to "
                 "compare with)")
      ->check(CLI::Range(0, 10000));
  app.add_option("--gradflip", gradflips,
                 "runs with a bit flipped in one rank's gradients")
      ->check(CLI::Range(0, 10000));
  app.add_option("--steps", c.steps, "steps per job")
      ->check(CLI::Range(40, 100000));
  app.add_option("--step-ms", c.step_ms, "compute per step, ms")
      ->check(CLI::Range(5, 10000));
  app.add_option("--seed", seed, "campaign seed");
  app.add_option("--run", paths.run, "holdfast-run");
  app.add_option("--trainer", paths.trainer, "the example trainer");
  app.add_flag("--json", as_json, "print JSON");
  app.add_flag("--keep", c.keep, "keep each job's log directory");
  CLI11_PARSE(app, argc, argv);

  std::mt19937_64 rng(seed);
  std::vector<Row> rows;
  json trials = json::array();
  const std::vector<StragglerKind> kinds = {
      {"slow 1.2x", "slow", 1.2}, {"slow 1.5x", "slow", 1.5},
      {"slow 2x", "slow", 2.0},   {"slow 5x", "slow", 5.0},
      {"stop 60%", "stop", 60},   {"quota 10%", "quota", 10},
      {"uniform", "", 0},         {"uneven", "", 0}};
  const bool cgroup = holdfast::test::CpuQuota::Available();
  for (const StragglerKind& kind : kinds) {
    if (kind.how == "quota" && !cgroup) {
      std::fprintf(stderr, "  %s skipped: no cgroup v1 cpu controller\n",
                   kind.name.c_str());
      continue;
    }
    Row row;
    row.kind = kind.name;
    for (int r = 0; r < runs; ++r) {
      StragglerRun(paths, c, kind, &rng, &row, &trials);
      if (!as_json) {
        std::fprintf(stderr, "  %s run %d: %d found, %d false alarms\n",
                     kind.name.c_str(), r + 1, row.detected, row.false_alarms);
      }
    }
    rows.push_back(row);
  }
  Row nan;
  nan.kind = "nan";
  for (int r = 0; r < nans; ++r) {
    const bool ok = NanRun(paths, c, &rng, &nan, &trials);
    if (!as_json) {
      std::fprintf(stderr, "  nan run %d: %s\n", r + 1,
                   ok ? "rolled back, reference model" : "NOT the reference");
    }
  }

  Row flip, grad;
  flip.kind = "bitflip";
  grad.kind = "gradflip";
  const std::string fault_free =
      bitflips + gradflips > 0 ? RunJob(paths, c, "", {}).hash : std::string();
  for (auto [row, count] :
       {std::make_pair(&flip, bitflips), std::make_pair(&grad, gradflips)}) {
    for (int r = 0; r < count; ++r) {
      const bool ok = FlipRun(paths, c, fault_free, &rng, row, &trials);
      if (!as_json) {
        std::fprintf(stderr, "  %s run %d: %s\n", row->kind.c_str(), r + 1,
                     ok ? "named, rolled back, fault-free model" : "NOT right");
      }
    }
  }

  // Precision and recall over the slowdowns of 1.5x and more (sleeps),
  // and over those from outside the process (stops and quotas), with the
  // fault-free runs' false alarms counted against each.
  int tp = 0, fp = 0, n = 0, evicted = 0;
  int out_tp = 0, out_fp = 0, out_n = 0, clean_fp = 0;
  std::vector<int64_t> detect, out_detect;
  json out_rows = json::array();
  for (const Row& r : rows) {
    const bool slow = r.kind.rfind("slow", 0) == 0;
    const bool outside =
        r.kind.rfind("stop", 0) == 0 || r.kind.rfind("quota", 0) == 0;
    out_rows.push_back(RowJson(r, slow || outside));
    evicted += r.healthy_evicted;
    if (r.kind == "slow 1.2x") continue;
    if (!slow && !outside) clean_fp += r.false_alarms;
    (outside ? out_fp : fp) += slow || outside ? r.false_alarms : 0;
    (outside ? out_tp : tp) += r.detected;
    (outside ? out_n : n) += slow || outside ? r.runs : 0;
    std::vector<int64_t>& d = outside ? out_detect : detect;
    d.insert(d.end(), r.detect_ms.begin(), r.detect_ms.end());
  }
  fp += clean_fp;
  out_fp += clean_fp;
  const double out_precision =
      out_tp + out_fp > 0 ? double(out_tp) / (out_tp + out_fp) : 0.0;
  const double out_recall = out_n > 0 ? double(out_tp) / out_n : 0.0;
  evicted += nan.healthy_evicted + flip.healthy_evicted + grad.healthy_evicted;
  const double flip_ok =
      flip.runs > 0 ? double(flip.detected) / flip.runs : 0.0;
  const double grad_ok =
      grad.runs > 0 ? double(grad.detected) / grad.runs : 0.0;
  const double precision = tp + fp > 0 ? double(tp) / (tp + fp) : 0.0;
  const double recall = n > 0 ? double(tp) / n : 0.0;
  const double f1 = precision + recall > 0
                        ? 2 * precision * recall / (precision + recall)
                        : 0.0;
  const double nan_ok = nan.runs > 0 ? double(nan.detected) / nan.runs : 0.0;
  const json doc = {{"seed", seed},
                    {"ranks", c.ranks},
                    {"steps", c.steps},
                    {"step_ms", c.step_ms},
                    {"runs_per_kind", runs},
                    {"rows", out_rows},
                    {"slowdowns_1_5x_and_more",
                     {{"precision", precision},
                      {"recall", recall},
                      {"f1", f1},
                      {"detect_ms_p50", Percentile(detect, 0.5)},
                      {"detect_ms_p90", Percentile(detect, 0.9)},
                      {"precision_vs_minder", precision / 0.904},
                      {"f1_vs_minder", f1 / 0.893}}},
                    {"slowed_from_outside",
                     {{"precision", out_precision},
                      {"recall", out_recall},
                      {"detect_ms_p50", Percentile(out_detect, 0.5)},
                      {"detect_ms_p90", Percentile(out_detect, 0.9)}}},
                    {"healthy_evicted", evicted},
                    {"nan",
                     {{"runs", nan.runs},
                      {"rolled_back_to_reference", nan_ok},
                      {"failed_jobs", nan.failed}}},
                    {"bitflip",
                     {{"runs", flip.runs},
                      {"right", flip_ok},
                      {"detect_ms_p50", Percentile(flip.detect_ms, 0.5)},
                      {"detect_ms_p90", Percentile(flip.detect_ms, 0.9)},
                      {"failed_jobs", flip.failed}}},
                    {"gradflip",
                     {{"runs", grad.runs},
                      {"right", grad_ok},
                      {"detect_ms_p50", Percentile(grad.detect_ms, 0.5)},
                      {"detect_ms_p90", Percentile(grad.detect_ms, 0.9)},
                      {"failed_jobs", grad.failed}}},
                    {"trials", trials}};
  if (as_json) {
    std::printf("%s\n", doc.dump(1).c_str());
    return 0;
  }
  std::printf("\n%-10s %5s %7s %7s %9s %8s %8s %8s\n", "kind", "runs", "recall",
              "false", "precision", "p50 ms", "p90 ms", "evicted");
  for (const json& r : out_rows) {
    auto pct = [](const json& v) {
      return v.is_null()
                 ? std::string("-")
                 : absl::StrCat(static_cast<int>(100 * v.get<double>() + 0.5),
                                "%");
    };
    std::printf("%-10s %5d %7s %7d %9s %8lld %8lld %8d\n",
                r["kind"].get<std::string>().c_str(), r["runs"].get<int>(),
                pct(r["recall"]).c_str(), r["false_alarms"].get<int>(),
                pct(r["precision"]).c_str(),
                static_cast<long long>(r["detect_ms_p50"].get<int64_t>()),
                static_cast<long long>(r["detect_ms_p90"].get<int64_t>()),
                r["healthy_evicted"].get<int>());
  }
  std::printf(
      "\nslowdowns of 1.5x and more (the fault-free runs' false alarms "
      "counted): precision %.3f, recall %.3f, F1 %.3f, detection p50 %lld "
      "ms, p90 %lld ms\n"
      "  against Minder's published precision 0.904 and F1 0.893 (quoted, "
      "not measured here): %.2fx and %.2fx\n"
      "slowed from outside (stops and quotas; the fault-free runs' false "
      "alarms counted): precision %.3f, recall %.3f, detection p50 %lld ms\n"
      "healthy members fenced: %d\n"
      "NaNs named and rolled back to the reference model: %d of %d "
      "(%.0f%%)\n"
      "bit flips at rest named, rolled back, fault-free model: %d of %d "
      "(%.0f%%), detection p50 %lld ms, p90 %lld ms\n"
      "bit flips in gradients named, rolled back, fault-free model: %d of "
      "%d (%.0f%%), detection p50 %lld ms, p90 %lld ms\n",
      precision, recall, f1, static_cast<long long>(Percentile(detect, 0.5)),
      static_cast<long long>(Percentile(detect, 0.9)), precision / 0.904,
      f1 / 0.893, out_precision, out_recall,
      static_cast<long long>(Percentile(out_detect, 0.5)), evicted,
      nan.detected, nan.runs, 100 * nan_ok, flip.detected, flip.runs,
      100 * flip_ok, static_cast<long long>(Percentile(flip.detect_ms, 0.5)),
      static_cast<long long>(Percentile(flip.detect_ms, 0.9)), grad.detected,
      grad.runs, 100 * grad_ok,
      static_cast<long long>(Percentile(grad.detect_ms, 0.5)),
      static_cast<long long>(Percentile(grad.detect_ms, 0.9)));
  return 0;
}
