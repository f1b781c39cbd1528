#include "tools/diagnose.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "holdfast/types.h"

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

template <typename E>
bool Named(const std::string& name, absl::string_view (*to_name)(E), int n,
           E* out) {
  for (int i = 0; i < n; ++i) {
    const E e = static_cast<E>(i);
    if (to_name(e) == name) {
      *out = e;
      return true;
    }
  }
  return false;
}

// One op of a dump (docs/trace-schema.md); false if it does not parse.
bool ParseOp(const json& o, TraceRecord* r) {
  if (!o.is_object()) return false;
  r->seq = o.value("seq", uint64_t{0});
  r->generation = o.value("generation", int64_t{0});
  r->coll_seq = o.value("coll_seq", int64_t{-1});
  r->count = o.value("count", uint64_t{0});
  r->bytes = o.value("bytes", uint64_t{0});
  r->started_ns = o.value("started_ns", int64_t{0});
  r->ended_ns = o.value("ended_ns", int64_t{0});
  r->enqueued_ns = o.value("enqueued_ns", int64_t{0});
  r->peer = o.value("root", o.value("peer", -1));
  return Named(o.value("op", std::string()), &OpTypeName, 8 /* kRecv + 1 */,
               &r->op) &&
         Named(o.value("dtype", std::string()), &DataTypeName, kNumDataTypes,
               &r->dtype) &&
         Named(o.value("state", std::string()), &OpStateName,
               6 /* kAborted + 1 */, &r->state) &&
         (!o.contains("reduce") ||
          Named(o.value("reduce", std::string()), &ReduceOpName, kNumReduceOps,
                &r->reduce));
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
  std::map<int, control::SlotEvidence> slots;
  for (const auto& [rank, path] : of_gen->second) {
    absl::StatusOr<json> d = ReadJson(path);
    if (!d.ok()) return d.status();
    size = std::max(size, d->value("size", 0));
    control::SlotEvidence& s = slots[rank];
    s.slot = rank;
    s.answered = true;
    for (const json& o : d->value("ops", json::array())) {
      TraceRecord r;
      if (!ParseOp(o, &r)) {
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
    control::SlotEvidence& s = slots[slot];
    s.slot = slot;
    if (kind == "crashed" || kind == "left") {
      s.liveness = control::SlotEvidence::Liveness::kDead;
    } else if (kind == "silent" || kind == "absent") {
      s.liveness = control::SlotEvidence::Liveness::kSilent;
    }
  }
  for (int r = 0; r < size; ++r) slots[r].slot = r;  // no dump: unanswered
  for (auto& [slot, s] : slots) ev.slots.push_back(std::move(s));
  return ev;
}

json ToJson(int64_t generation, const control::Diagnosis& d) {
  json j = {
      {"generation", generation}, {"kind", control::DiagnosisKindName(d.kind)},
      {"culprits", d.culprits},   {"victims", d.victims},
      {"evidence", d.evidence},   {"confidence", d.confidence}};
  if (d.coll_seq >= 0) {
    j["collective"] = {{"seq", d.coll_seq},
                       {"op", std::string(OpTypeName(d.op))},
                       {"count", d.count},
                       {"dtype", std::string(DataTypeName(d.dtype))}};
  }
  return j;
}

}  // namespace holdfast::diagnose
