#include "tools/diagnose.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "holdfast/types.h"
#include "src/control/controller/membership.h"
#include "src/trace/trace_json.h"

namespace holdfast::diagnose {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

absl::StatusOr<json> ReadJson(const fs::path& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  }
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), " is not a JSON object"));
  }
  return j;
}

}  // namespace

absl::StatusOr<Evidence> Load(const std::string& dir,
                              std::optional<int64_t> generation) {
  json incidents = json::array();
  if (fs::exists(fs::path(dir) / "summary.json")) {
    absl::StatusOr<json> summary = ReadJson(fs::path(dir) / "summary.json");
    if (!summary.ok()) return summary.status();
    if (summary->contains("incidents")) incidents = (*summary)["incidents"];
  }
  return Load(dir, generation, incidents);
}

absl::StatusOr<Evidence> Load(const std::string& dir,
                              std::optional<int64_t> generation,
                              const json& incidents) {
  // The dumps: generation -> rank -> file.
  static const std::regex kDump(R"(trace-g(\d+)-r(\d+)-p\d+\.json)");
  std::map<int64_t, std::map<int, fs::path>> dumps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "trace", ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, kDump)) {
      dumps[std::stoll(m[1])][std::stoi(m[2])] = e.path();
    }
  }
  Evidence ev;
  if (generation.has_value()) {
    ev.generation = *generation;
  } else {
    for (const json& i : incidents) {
      const int64_t g = i.value("generation", int64_t{-1});
      if (g >= 0 && (ev.generation < 0 || g < ev.generation)) ev.generation = g;
    }
    if (ev.generation < 0 && !dumps.empty())
      ev.generation = dumps.begin()->first;
  }
  auto of_gen = dumps.find(ev.generation);
  if (of_gen == dumps.end()) {
    return absl::NotFoundError(absl::StrCat(
        dir, "/trace holds no trace dump of generation ", ev.generation,
        " (holdfast-run writes them there with --log-dir)"));
  }
  int size = 0;
  std::map<int, diagnosis::SlotEvidence> slots;
  for (const auto& [rank, path] : of_gen->second) {
    absl::StatusOr<json> d = ReadJson(path);
    if (!d.ok()) return d.status();
    size = std::max(size, d->value("size", 0));
    diagnosis::SlotEvidence& s = slots[rank];
    s.slot = rank;
    s.answered = true;
    // The slot whose abort it adopted, as its abort reason names it.
    static const std::regex kPeer(R"(holdfast\.dev/peer='(\d+)')");
    std::smatch pm;
    const std::string reason = d->value("abort_reason", std::string());
    if (std::regex_search(reason, pm, kPeer)) {
      s.blames = std::stoi(pm[1]);
      if (s.blames == rank) s.blames = -1;
    }
    for (const json& o : d->value("ops", json::array())) {
      TraceRecord r;
      if (!trace::OpFromJson(o, &r)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path.string(), ": an op does not parse: ", o.dump()));
      }
      s.trace.push_back(r);
    }
  }
  for (const json& i : incidents) {
    if (i.value("generation", int64_t{-1}) != ev.generation) continue;
    const int slot = i.value("slot", -1);
    const std::string kind = i.value("kind", std::string());
    if (slot < 0) continue;
    diagnosis::SlotEvidence& s = slots[slot];
    s.slot = slot;
    // Its last heartbeat, as the incident recorded it.
    const std::string phase = i.value("phase", std::string());
    for (diagnosis::Phase p :
         {diagnosis::Phase::kIdle, diagnosis::Phase::kComputing,
          diagnosis::Phase::kCollective, diagnosis::Phase::kCheckpointing,
          diagnosis::Phase::kRecovering}) {
      if (phase == diagnosis::PhaseName(p)) s.phase = p;
    }
    s.step = i.value("step", s.step);
    s.collective_seq = i.value("collective_seq", s.collective_seq);
    if (kind == "crashed" || kind == "left") {
      s.liveness = diagnosis::SlotEvidence::Liveness::kDead;
    } else if (kind == "silent" || kind == "absent") {
      s.liveness = diagnosis::SlotEvidence::Liveness::kSilent;
    }
  }
  for (int r = 0; r < size; ++r) slots[r].slot = r;  // no dump: unanswered
  for (auto& [slot, s] : slots) ev.slots.push_back(std::move(s));
  return ev;
}

json ToJson(int64_t generation, const diagnosis::Diagnosis& d) {
  json j = {{"generation", generation},
            {"kind", diagnosis::DiagnosisKindName(d.kind)},
            {"culprits", d.culprits},
            {"victims", d.victims},
            {"evidence", d.evidence},
            {"confidence", d.confidence}};
  if (d.coll_seq >= 0) {
    j["collective"] = {{"seq", d.coll_seq},
                       {"op", std::string(OpTypeName(d.op))},
                       {"count", d.count},
                       {"dtype", std::string(DataTypeName(d.dtype))}};
  }
  return j;
}

}  // namespace holdfast::diagnose
