#include "src/diagnosis/diagnosis.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "src/common/op_text.h"
#include "src/trace/trace_json.h"

namespace holdfast::diagnosis {
namespace {

bool Entered(const TraceRecord& r) { return r.state != OpState::kEnqueued; }

// Evidence names at most this many slots (or slot descriptions) in one
// list, and counts the rest: a rack's loss in a 100k-rank job must not
// make an incident of megabytes.
constexpr size_t kMaxListed = 16;

std::string Slots(const std::vector<int>& slots) {
  const size_t n = std::min(slots.size(), kMaxListed);
  std::string out = absl::StrCat(
      slots.size() == 1 ? "slot " : "slots ",
      absl::StrJoin(slots.begin(), slots.begin() + static_cast<ptrdiff_t>(n),
                    ", "));
  if (slots.size() > n) {
    absl::StrAppend(&out, " and ", slots.size() - n, " more");
  }
  return out;
}

// One answering slot's collectives, by sequence number.
struct Trace {
  const SlotEvidence* slot = nullptr;
  std::map<int64_t, const TraceRecord*> by_seq;
  int64_t first = -1;    // the lowest sequence number its tail holds
  int64_t entered = -1;  // the highest it entered
};

// The lowest collective at which the answering slots differ, if any.
std::optional<int64_t> FirstDifference(const std::vector<Trace>& traces) {
  int64_t lo = -1, hi = -1;
  for (const Trace& t : traces) {
    if (t.first >= 0) lo = std::max(lo, t.first);
    hi = std::max(hi, t.entered);
  }
  if (hi < 0) return std::nullopt;
  for (int64_t c = std::max<int64_t>(lo, 0); c <= hi; ++c) {
    std::set<std::string> signatures;
    int entered = 0, completed = 0;
    for (const Trace& t : traces) {
      auto it = t.by_seq.find(c);
      if (it == t.by_seq.end() || !Entered(*it->second)) continue;
      ++entered;
      signatures.insert(Signature(*it->second));
      if (it->second->state == OpState::kCompleted) ++completed;
    }
    const int n = static_cast<int>(traces.size());
    if (entered < n || signatures.size() > 1 ||
        (completed > 0 && completed < n)) {
      return c;
    }
  }
  return std::nullopt;
}

void Describe(const TraceRecord& r, Diagnosis* d) {
  d->coll_seq = r.coll_seq;
  d->op = r.op;
  d->count = r.count;
  d->dtype = r.dtype;
}

void SetVictims(const std::vector<SlotEvidence>& slots, Diagnosis* d) {
  d->victims.clear();
  for (const SlotEvidence& s : slots) {
    if (std::find(d->culprits.begin(), d->culprits.end(), s.slot) ==
        d->culprits.end()) {
      d->victims.push_back(s.slot);
    }
  }
  std::sort(d->culprits.begin(), d->culprits.end());
  std::sort(d->victims.begin(), d->victims.end());
}

// Slots that never entered collective `at` while the others waited there
// until their deadline: hung in compute.
void JudgeMissing(const std::vector<Trace>& traces,
                  const std::vector<int>& missing, const std::string& at,
                  Diagnosis* d) {
  d->kind = DiagnosisKind::kComputeHang;
  d->culprits = missing;
  d->confidence = 0.8;
  std::vector<std::string> where;
  for (const Trace& t : traces) {
    if (std::find(missing.begin(), missing.end(), t.slot->slot) ==
        missing.end()) {
      continue;
    }
    where.push_back(
        absl::StrCat("slot ", t.slot->slot, " is alive (phase ",
                     PhaseName(t.slot->phase), ", step ", t.slot->step,
                     t.slot->still_ms >= 0
                         ? absl::StrCat(", still for ", t.slot->still_ms, " ms")
                         : std::string(),
                     ") and never entered it (last entered #", t.entered, ")"));
  }
  d->evidence = absl::StrCat(at, ": ", absl::StrJoin(where, "; "),
                             "; the others entered it and wait");
}

// The slots entered collective `at` with different calls: the slots
// outside a strict majority call are the culprits; with no such call every
// side is named.
void JudgeMismatch(const std::map<std::string, std::vector<int>>& by_signature,
                   const std::string& at, Diagnosis* d) {
  d->kind = DiagnosisKind::kMismatch;
  std::vector<std::string> sides;
  size_t largest = 0, ties = 0;
  for (const auto& [sig, who] : by_signature) {
    sides.push_back(absl::StrCat(Slots(who), " called ", sig));
    if (who.size() > largest) {
      largest = who.size();
      ties = 1;
    } else if (who.size() == largest) {
      ++ties;
    }
  }
  for (const auto& [sig, who] : by_signature) {
    if (ties > 1 || who.size() != largest) {
      d->culprits.insert(d->culprits.end(), who.begin(), who.end());
    }
  }
  d->confidence = ties > 1 ? 0.5 : 0.9;
  d->evidence = absl::StrCat(
      at, " was called differently: ", absl::StrJoin(sides, "; "),
      ties > 1 ? " (no call is the majority's: every side named)" : "");
}

// At collective `c`, where the answering slots differ: who never entered
// it, who called it differently, or who is stuck in it.
void Judge(const std::vector<Trace>& traces, int64_t c, Diagnosis* d) {
  std::vector<int> missing;
  std::map<std::string, std::vector<int>> by_signature;
  std::vector<int> completed, stuck;
  // Whether a slot waited in #c until its deadline.
  bool waited = false;
  for (const Trace& t : traces) {
    auto it = t.by_seq.find(c);
    if (it == t.by_seq.end() || !Entered(*it->second)) {
      missing.push_back(t.slot->slot);
      continue;
    }
    const TraceRecord& r = *it->second;
    waited = waited || r.state == OpState::kTimedOut;
    if (d->coll_seq < 0) Describe(r, d);
    by_signature[Signature(r)].push_back(t.slot->slot);
    (r.state == OpState::kCompleted ? completed : stuck)
        .push_back(t.slot->slot);
  }
  const std::string at = absl::StrCat("collective #", c);
  // A slot that never entered #c is the culprit only if the others waited
  // for it there until their deadline; else another failure aborted the
  // group before it came (it may simply have been computing).
  if (!missing.empty() && !waited) {
    d->evidence = absl::StrCat(
        Slots(missing), " never entered ", at,
        ", but nobody timed out waiting for ",
        missing.size() == 1 ? "it" : "them",
        ": the group was aborted by a failure the traces do not show");
    return;
  }
  if (!missing.empty()) return JudgeMissing(traces, missing, at, d);
  if (by_signature.size() > 1) return JudgeMismatch(by_signature, at, d);
  d->kind = DiagnosisKind::kStuckInCollective;
  d->culprits = stuck;
  d->confidence = 0.6;
  d->evidence =
      absl::StrCat(Slots(stuck), " did not complete ", at, " (",
                   by_signature.begin()->first, "), which ", Slots(completed),
                   " completed: a link or peer problem between them");
}

}  // namespace

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kIdle:
      return "idle";
    case Phase::kComputing:
      return "computing";
    case Phase::kCollective:
      return "collective";
    case Phase::kCheckpointing:
      return "checkpointing";
    case Phase::kRecovering:
      return "recovering";
    case Phase::kUnspecified:
      break;
  }
  return "-";
}

const char* DiagnosisKindName(DiagnosisKind kind) {
  switch (kind) {
    case DiagnosisKind::kUndecided:
      return "undecided";
    case DiagnosisKind::kDead:
      return "dead";
    case DiagnosisKind::kFrozen:
      return "frozen";
    case DiagnosisKind::kComputeHang:
      return "compute-hang";
    case DiagnosisKind::kMismatch:
      return "mismatch";
    case DiagnosisKind::kStuckInCollective:
      return "stuck-in-collective";
    case DiagnosisKind::kOpFailed:
      return "op-failed";
  }
  return "unknown";
}

namespace {

// ", its step still for N ms" when known.
std::string Still(const SlotEvidence& s) {
  return s.still_ms >= 0
             ? absl::StrCat(" (its step still for ", s.still_ms, " ms)")
             : std::string();
}

// Where each silent slot was last seen, from its last heartbeat.
std::string LastSeen(const std::vector<SlotEvidence>& slots) {
  std::vector<std::string> last;
  size_t more = 0;
  for (const SlotEvidence& s : slots) {
    if (s.liveness != SlotEvidence::Liveness::kSilent) continue;
    if (last.size() == kMaxListed) {
      ++more;
      continue;
    }
    if (s.phase == Phase::kCollective && s.collective_seq >= 0) {
      last.push_back(absl::StrCat("slot ", s.slot, " last seen in collective #",
                                  s.collective_seq, " at step ", s.step,
                                  Still(s)));
    } else if (s.phase != Phase::kUnspecified) {
      last.push_back(absl::StrCat("slot ", s.slot, " last seen ",
                                  PhaseName(s.phase), " at step ", s.step,
                                  Still(s)));
    }
  }
  if (more > 0) last.push_back(absl::StrCat("and ", more, " more"));
  return last.empty() ? "" : absl::StrCat("; ", absl::StrJoin(last, ", "));
}

// A process that is gone or silent is a culprit whatever the traces say;
// the others wait for it (in collective `k` where they differ, if the
// survivors' traces show one).
void JudgeGone(const std::vector<SlotEvidence>& slots,
               const std::vector<Trace>& traces, const std::vector<int>& dead,
               const std::vector<int>& frozen, std::optional<int64_t> k,
               Diagnosis* d) {
  d->kind = dead.empty() ? DiagnosisKind::kFrozen : DiagnosisKind::kDead;
  d->culprits = dead;
  d->culprits.insert(d->culprits.end(), frozen.begin(), frozen.end());
  d->confidence = frozen.empty() ? 1.0 : 0.9;
  std::vector<std::string> parts;
  if (!dead.empty()) {
    parts.push_back(absl::StrCat(Slots(dead), ": the process is gone"));
  }
  if (!frozen.empty()) {
    parts.push_back(absl::StrCat(
        Slots(frozen), ": no heartbeat (stopped or wedged)", LastSeen(slots)));
  }
  d->evidence = absl::StrJoin(parts, "; ");
  // Where the others wait: the collective where they differ, else the
  // lowest one they entered and did not complete.
  std::optional<int64_t> wait = k;
  if (!wait.has_value()) {
    for (const Trace& t : traces) {
      for (const auto& [c, r] : t.by_seq) {
        if (Entered(*r) && r->state != OpState::kCompleted &&
            (!wait.has_value() || c < *wait)) {
          wait = c;
        }
      }
    }
  }
  if (wait.has_value()) {
    for (const Trace& t : traces) {
      auto it = t.by_seq.find(*wait);
      if (it != t.by_seq.end() && Entered(*it->second)) {
        Describe(*it->second, d);
        break;
      }
    }
    absl::StrAppend(
        &d->evidence,
        k.has_value() ? "; the others differ first" : "; the others wait",
        " at collective #", *wait);
  }
  SetVictims(slots, d);
}

// No collective differs. One op failed on its own and the others adopted
// its abort: the slots that blame nobody, when every other one blames one
// of them. Else undecided.
void JudgeAdopted(const std::vector<SlotEvidence>& slots, Diagnosis* d) {
  std::set<int> origins;
  for (const SlotEvidence& s : slots) {
    if (s.blames < 0) origins.insert(s.slot);
  }
  bool adopted = origins.size() < slots.size();
  for (const SlotEvidence& s : slots) {
    if (s.blames >= 0 && origins.count(s.blames) == 0) adopted = false;
  }
  if (!adopted) {
    d->evidence =
        "every member answered, and no collective differs between their "
        "traces";
    return;
  }
  d->kind = DiagnosisKind::kOpFailed;
  d->culprits.assign(origins.begin(), origins.end());
  d->confidence = 0.7;
  d->evidence = absl::StrCat(
      "no collective differs; ", Slots(d->culprits),
      origins.size() == 1 ? " failed its op on its own"
                          : " failed their ops on their own",
      " and every other slot aborted because of it (a transient fault: "
      "the group is rebuilt)");
  SetVictims(slots, d);
}

}  // namespace

Diagnosis Diagnose(const std::vector<SlotEvidence>& slots) {
  Diagnosis d;
  std::vector<Trace> traces;
  std::vector<int> dead, frozen, unanswered;
  for (const SlotEvidence& s : slots) {
    if (s.liveness == SlotEvidence::Liveness::kDead) {
      dead.push_back(s.slot);
      continue;
    }
    if (s.liveness == SlotEvidence::Liveness::kSilent) {
      frozen.push_back(s.slot);
      continue;
    }
    if (!s.answered) {
      unanswered.push_back(s.slot);
      continue;
    }
    Trace t;
    t.slot = &s;
    for (const TraceRecord& r : s.trace) {
      if (!IsCollective(r.op) || r.coll_seq < 0) continue;
      t.by_seq[r.coll_seq] = &r;
      t.first = t.first < 0 ? r.coll_seq : std::min(t.first, r.coll_seq);
      if (Entered(r)) t.entered = std::max(t.entered, r.coll_seq);
    }
    traces.push_back(std::move(t));
  }
  const std::optional<int64_t> k = FirstDifference(traces);
  if (!dead.empty() || !frozen.empty()) {
    JudgeGone(slots, traces, dead, frozen, k, &d);
  } else if (!unanswered.empty()) {
    d.evidence =
        absl::StrCat(Slots(unanswered),
                     " heartbeat but gave no trace: the traces cannot be "
                     "compared");
  } else if (!k.has_value()) {
    JudgeAdopted(slots, &d);
  } else {
    Judge(traces, *k, &d);
    SetVictims(slots, &d);
  }
  return d;
}

bool ReadNotice(const std::string& notice, SlotEvidence* s) {
  const nlohmann::json j =
      nlohmann::json::parse(notice, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("trace") || !j.at("trace").is_array()) {
    return false;
  }
  std::vector<TraceRecord> trace;
  for (const nlohmann::json& o : j.at("trace")) {
    TraceRecord r;
    if (!trace::OpFromJson(o, &r)) return false;
    trace.push_back(r);
  }
  s->trace = std::move(trace);
  s->blames = j.contains("peer") && j.at("peer").is_number_integer()
                  ? j.at("peer").get<int>()
                  : -1;
  if (s->blames == s->slot) s->blames = -1;
  s->answered = true;
  return true;
}

bool Actionable(const Diagnosis& d) {
  if (d.culprits.empty() || d.confidence < 0.8) return false;
  switch (d.kind) {
    case DiagnosisKind::kDead:
    case DiagnosisKind::kFrozen:
    case DiagnosisKind::kComputeHang:
    case DiagnosisKind::kMismatch:
      return true;
    case DiagnosisKind::kUndecided:
    case DiagnosisKind::kStuckInCollective:
    case DiagnosisKind::kOpFailed:
      return false;
  }
  return false;
}

}  // namespace holdfast::diagnosis
