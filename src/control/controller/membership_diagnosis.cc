// Membership's side of the culprit analysis: the cases it opens at
// incidents, what it knows of each slot of them, and what it does with a
// verdict (src/diagnosis/diagnosis.h).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "src/common/logging.h"
#include "src/control/controller/membership.h"

namespace holdfast::control {

diagnosis::SlotEvidence::Liveness Membership::LivenessLocked(
    const Member& m, absl::Time now) const {
  if (m.state == STATE_LEFT || m.fenced_by == INCIDENT_CRASHED ||
      m.fenced_by == INCIDENT_LEFT) {
    return diagnosis::SlotEvidence::Liveness::kDead;
  }
  const absl::Time until = m.state == STATE_ALIVE ? now : m.fenced_at;
  const absl::Duration quiet =
      std::max(3 * detection_.heartbeat_interval, absl::Seconds(1));
  return until - m.last_seen > quiet
             ? diagnosis::SlotEvidence::Liveness::kSilent
             : diagnosis::SlotEvidence::Liveness::kAlive;
}

std::vector<DiagnosisCase> Membership::PendingDiagnoses(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  std::vector<DiagnosisCase> out;
  for (const auto& [g, c] : cases_.Pending()) {
    DiagnosisCase& d = out.emplace_back();
    d.generation = g;
    d.since = c->since;
    for (size_t slot = 0; slot < c->roster.size(); ++slot) {
      diagnosis::SlotEvidence& s = d.slots.emplace_back();
      s.slot = static_cast<int>(slot);
      auto m = members_.find(c->roster[slot]);
      if (m == members_.end()) {
        // Vacant, or its record was dropped: nothing is known of it.
        s.liveness = diagnosis::SlotEvidence::Liveness::kSilent;
        continue;
      }
      s.liveness = LivenessLocked(m->second, now);
      s.phase = ToDiagnosisPhase(m->second.phase);
      s.step = m->second.step;
      s.collective_seq =
          m->second.phase == PHASE_COLLECTIVE ? m->second.collective_seq : -1;
      const absl::Time until =
          m->second.state == STATE_ALIVE ? now : m->second.fenced_at;
      s.still_ms = std::max<int64_t>(
          0, absl::ToInt64Milliseconds(until - m->second.step_changed_at));
    }
  }
  return out;
}

Verdict Membership::SetDiagnosis(int64_t generation,
                                 const diagnosis::Diagnosis& d,
                                 absl::Time now) {
  absl::MutexLock lock(&mu_);
  Verdict v = ToProto(d, absl::ToUnixMillis(now));
  const DiagnosisCases::Case* c = cases_.Awaiting(generation);
  if (c == nullptr) {
    v.set_action("none");
    v.set_action_reason("no incident of that generation awaits a verdict");
    return v;
  }
  const DiagnosisCases::Case pending = *c;
  ActOnVerdictLocked(generation, pending, d, &v, now);
  HOLDFAST_LOG_WARN(
      "diagnosis of generation {}: {}; culprit{} {}; {} (confidence {:.2f}); "
      "action: {} ({})",
      generation, v.kind(), v.culprits_size() == 1 ? "" : "s",
      v.culprits().empty() ? std::string("none")
                           : absl::StrJoin(v.culprits(), ", "),
      v.evidence(), v.confidence(), v.action(), v.action_reason());
  cases_.Decide(generation, v);
  incidents_.SetVerdict(generation, v);
  return v;
}

void Membership::ActOnVerdictLocked(int64_t generation,
                                    const DiagnosisCases::Case& c,
                                    const diagnosis::Diagnosis& d, Verdict* v,
                                    absl::Time now) {
  v->set_action("none");
  if (!diagnosis::Actionable(d)) {
    v->set_action_reason(
        d.kind == diagnosis::DiagnosisKind::kUndecided
            ? "undecided: nobody is fenced on it"
            : "not sure enough to fence anyone on it (confidence below 0.8, "
              "or a fault that may be a link's)");
    return;
  }
  if (d.kind == diagnosis::DiagnosisKind::kMismatch &&
      mismatch_replaced_at_ == checkpoints_.committed()) {
    v->set_action_reason(absl::StrCat(
        "the mismatch came back with no step committed since its culprit "
        "was last replaced (at committed step ",
        checkpoints_.committed(),
        "): the program issues it, not a member; the job stops on it"));
    return;
  }
  std::vector<std::string> done;
  std::vector<Member*> fence;
  for (int slot : d.culprits) {
    if (slot < 0 || static_cast<size_t>(slot) >= c.roster.size()) continue;
    auto m = members_.find(c.roster[slot]);
    if (m == members_.end()) continue;
    if (m->second.state != STATE_ALIVE) {
      done.push_back(absl::StrCat(
          "slot ", slot, "'s member was already ",
          m->second.state == STATE_LEFT
              ? std::string("gone")
              : absl::StrCat("fenced (", IncidentKindName(m->second.fenced_by),
                             ")")));
    } else if (m->second.slot == slot) {
      fence.push_back(&m->second);
    }
  }
  if (job_state_ != JOB_RUNNING && !fence.empty()) {
    v->set_action_reason("the job is over");
    return;
  }
  v->set_action("replace");
  if (d.kind == diagnosis::DiagnosisKind::kMismatch)
    mismatch_replaced_at_ = checkpoints_.committed();
  for (Member* m : fence) {
    done.push_back(absl::StrCat("slot ", m->slot, " (member ", m->id,
                                ") fenced and replaced"));
  }
  v->set_action_reason(absl::StrJoin(done, "; "));
  for (Member* m : fence) {
    if (m->state != STATE_ALIVE) continue;  // an earlier one's generation
    Incident inc = MakeIncidentLocked(
        *m, INCIDENT_DIAGNOSED,
        absl::StrCat("the diagnosis of generation ", generation, " named it (",
                     v->kind(), "): ", d.evidence),
        m->last_seen, 0, now);
    *inc.mutable_diagnosis() = *v;
    inc.set_evicted(true);
    DeclareFencedLocked(*m, std::move(inc), now);
  }
}

}  // namespace holdfast::control
