// holdfast: the operator's command line.
//
//   holdfast status --controller HOST:PORT [--token-file FILE] [--json]
//                   [--incidents N] [--timeout-ms MS]
//
// Prints the members table (slot, member, host, state, step, heartbeat age,
// step time, metrics) and the most recent incidents. The token comes from
// --token-file or HOLDFAST_JOB_TOKEN. Exit codes: 0 ok, 1 the controller
// refused or did not answer, 2 bad usage.
//
//   holdfast diagnose DIR [--generation G] [--json]
//
// Names the culprit of an incident from holdfast-run's log directory DIR
// (its trace dumps and summary.json; tools/diagnose.h). Exit codes: 0 a
// verdict (undecided included), 1 no usable evidence, 2 bad usage.
#include <google/protobuf/util/json_util.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "src/control/controller/membership.h"
#include "src/control/member/client.h"
#include "src/control/wire/auth.h"
#include "src/diagnosis/diagnosis.h"
#include "tools/diagnose.h"
#include "tools/tls_flags.h"

namespace {

using holdfast::control::StatusResponse;

std::string Ms(int64_t ms) {
  if (ms < 0) return "-";
  if (ms < 10000) return absl::StrCat(ms, " ms");
  return absl::StrFormat("%.1f s", static_cast<double>(ms) / 1000.0);
}

std::string Metrics(const google::protobuf::Map<std::string, double>& m) {
  std::map<std::string, double> sorted(m.begin(), m.end());
  return absl::StrJoin(sorted, " ", [](std::string* out, const auto& kv) {
    absl::StrAppend(out, kv.first, "=", absl::StrFormat("%.4g", kv.second));
  });
}

void PrintTable(const StatusResponse& s) {
  std::printf(
      "job: world %d, generation %lld, committed step %s, up %s\n"
      "members: %d alive, %d dead, %d left; %d standby, %d vacant slot(s)\n"
      "steps: median %s, stall threshold %s; %llu heartbeats, %llu "
      "incidents\n\n",
      s.world_size(), static_cast<long long>(s.generation()),
      s.committed_step() < 0 ? "none"
                             : absl::StrCat(s.committed_step()).c_str(),
      Ms(s.uptime_ms()).c_str(), s.alive(), s.dead(), s.left(), s.standbys(),
      s.vacant_slots(), Ms(s.median_step_us() / 1000).c_str(),
      s.stall_threshold_ms() < 0 ? "(needs history)"
                                 : Ms(s.stall_threshold_ms()).c_str(),
      static_cast<unsigned long long>(s.heartbeats_total()),
      static_cast<unsigned long long>(s.incidents_total()));
  std::printf("%-5s %-20s %-16s %-6s %8s %-13s %9s %9s  %s\n", "SLOT", "MEMBER",
              "HOST", "STATE", "STEP", "PHASE", "HB AGE", "STEP TIME",
              "METRICS");
  for (const auto& m : s.members()) {
    std::string phase = holdfast::control::PhaseName(m.phase());
    if (m.phase() == holdfast::control::PHASE_COLLECTIVE) {
      absl::StrAppend(&phase, " #", m.collective_seq());
    }
    std::printf(
        "%-5s %-20llu %-16s %-6s %8s %-13s %9s %9s  %s\n",
        m.slot() < 0 ? "sb" : absl::StrCat(m.slot()).c_str(),
        static_cast<unsigned long long>(m.member_id()), m.host().c_str(),
        holdfast::control::StateName(m.state()),
        m.step() < 0 ? "-" : absl::StrCat(m.step()).c_str(), phase.c_str(),
        Ms(m.heartbeat_age_ms()).c_str(),
        m.last_step_us() > 0 ? Ms(m.last_step_us() / 1000).c_str() : "-",
        Metrics(m.metrics()).c_str());
  }
  if (s.incidents().empty()) {
    std::printf("\nno incidents\n");
    return;
  }
  std::printf("\nrecent incidents:\n");
  for (const auto& i : s.incidents()) {
    std::printf(
        "  #%llu %s %-8s slot %d member %llu (%s) gen %lld, detected in %s: "
        "%s\n",
        static_cast<unsigned long long>(i.id()),
        absl::FormatTime("%H:%M:%E3S",
                         absl::FromUnixMillis(i.detected_unix_ms()),
                         absl::LocalTimeZone())
            .c_str(),
        holdfast::control::IncidentKindName(i.kind()), i.slot(),
        static_cast<unsigned long long>(i.member_id()), i.host().c_str(),
        static_cast<long long>(i.generation()),
        Ms(i.time_to_detect_ms()).c_str(), i.evidence().c_str());
    if (!i.has_diagnosis()) {
      std::printf("      diagnosis: pending\n");
      continue;
    }
    const auto& d = i.diagnosis();
    std::printf(
        "      diagnosis: %s; culprits [%s], victims [%s] "
        "(confidence %.2f): %s\n      action: %s (%s)\n",
        d.kind().c_str(), absl::StrJoin(d.culprits(), ", ").c_str(),
        absl::StrJoin(d.victims(), ", ").c_str(), d.confidence(),
        d.evidence().c_str(), d.action().c_str(), d.action_reason().c_str());
  }
}

// `holdfast diagnose`: 0 with a verdict (undecided included), 1 when the
// directory holds no usable evidence.
int Diagnose(const std::string& dir, std::optional<int64_t> generation,
             bool as_json) {
  absl::StatusOr<holdfast::diagnose::Evidence> ev =
      holdfast::diagnose::Load(dir, generation);
  if (!ev.ok()) {
    std::fprintf(stderr, "holdfast diagnose: %s\n",
                 std::string(ev.status().message()).c_str());
    return 1;
  }
  const holdfast::diagnosis::Diagnosis d =
      holdfast::diagnosis::Diagnose(ev->slots);
  const nlohmann::json j = holdfast::diagnose::ToJson(ev->generation, d);
  if (as_json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("generation %lld: %s", static_cast<long long>(ev->generation),
              holdfast::diagnosis::DiagnosisKindName(d.kind));
  if (!d.culprits.empty()) {
    std::printf("; culprit%s %s", d.culprits.size() > 1 ? "s" : "",
                absl::StrJoin(d.culprits, ", ").c_str());
  }
  if (!d.victims.empty()) {
    std::printf("; victims %s", absl::StrJoin(d.victims, ", ").c_str());
  }
  std::printf(" (confidence %.1f)\n  %s\n", d.confidence, d.evidence.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"holdfast: inspect a running job"};
  app.require_subcommand(1);
  CLI::App* status = app.add_subcommand(
      "status", "members table and recent incidents from the controller");
  std::string controller;
  std::string token_file;
  bool json = false;
  int incidents = 20;
  int64_t timeout_ms = 5000;
  status->add_option("--controller", controller, "controller HOST:PORT")
      ->required();
  status->add_option("--token-file", token_file,
                     "file whose first line is the job token (default: "
                     "HOLDFAST_JOB_TOKEN)");
  status->add_flag("--json", json, "print the status as JSON");
  holdfast::TlsFiles tls_files;
  holdfast::tools::AddTlsFlags(*status, &tls_files);
  status->add_option("--incidents", incidents, "recent incidents to show")
      ->check(CLI::Range(0, 1000));
  status
      ->add_option("--timeout-ms", timeout_ms, "how long to wait for an answer")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}));
  CLI::App* diagnose = app.add_subcommand(
      "diagnose",
      "name the culprit of an incident from a holdfast-run log directory");
  std::string dir;
  int64_t generation = -1;
  bool diagnose_json = false;
  diagnose->add_option("dir", dir, "holdfast-run's --log-dir")->required();
  diagnose->add_option("--generation", generation,
                       "the generation to analyze (default: the first with "
                       "an incident)");
  diagnose->add_flag("--json", diagnose_json, "print the verdict as JSON");
  CLI11_PARSE(app, argc, argv);
  if (diagnose->parsed()) {
    return Diagnose(
        dir,
        generation >= 0 ? std::optional<int64_t>(generation) : std::nullopt,
        diagnose_json);
  }

  auto token = holdfast::control::LoadToken(token_file);
  if (!token.ok()) {
    std::fprintf(stderr, "holdfast status: %s\n",
                 std::string(token.status().message()).c_str());
    return 2;
  }
  holdfast::control::ClientOptions options;
  if (!holdfast::tools::LoadTlsFlags("holdfast status", tls_files,
                                     &options.tls)) {
    return 2;
  }
  options.address = controller;
  options.token = *token;
  options.rpc_slack = absl::Milliseconds(timeout_ms);
  holdfast::control::StatusRequest req;
  req.set_include_members(true);
  req.set_max_incidents(incidents);
  auto s = holdfast::control::FetchStatus(options, req);
  if (!s.ok()) {
    std::fprintf(stderr, "holdfast status: %s\n",
                 s.status().ToString().c_str());
    return 1;
  }
  if (json) {
    std::string out;
    google::protobuf::util::JsonPrintOptions o;
    o.add_whitespace = true;
    o.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(*s, &out, o);
    std::fputs(out.c_str(), stdout);
    return 0;
  }
  PrintTable(*s);
  return 0;
}
