#include "src/control/controller/diagnosis_cases.h"

namespace holdfast::control {
namespace {

// Incidents that are verdicts or judgements of their own: no case.
bool OpensCase(const Incident& i) {
  switch (i.kind()) {
    case INCIDENT_DIAGNOSED:
    case INCIDENT_STRAGGLER:
    case INCIDENT_NUMERIC:
    case INCIDENT_CORRUPTION:
    case INCIDENT_UNREACHABLE:
      return false;
    default:
      return i.slot() >= 0 && i.member_id() != 0;
  }
}

}  // namespace

void DiagnosisCases::NoteIncident(Incident* incident,
                                  const std::vector<uint64_t>& roster) {
  const int64_t g = incident->generation();
  if (auto v = verdicts_.find(g); v != verdicts_.end()) {
    if (!incident->has_diagnosis()) *incident->mutable_diagnosis() = v->second;
    return;
  }
  if (!OpensCase(*incident) || cases_.count(g) > 0) return;
  Case& c = cases_[g];
  c.since = absl::FromUnixMillis(incident->detected_unix_ms());
  c.roster = roster;
  while (cases_.size() > max_) cases_.erase(cases_.begin());
}

std::map<int64_t, const DiagnosisCases::Case*> DiagnosisCases::Pending() const {
  std::map<int64_t, const Case*> out;
  for (const auto& [g, c] : cases_) {
    if (verdicts_.count(g) == 0) out.emplace(g, &c);
  }
  return out;
}

const DiagnosisCases::Case* DiagnosisCases::Awaiting(int64_t generation) const {
  auto c = cases_.find(generation);
  if (c == cases_.end() || verdicts_.count(generation) > 0) return nullptr;
  return &c->second;
}

void DiagnosisCases::Decide(int64_t generation, const Verdict& v) {
  verdicts_[generation] = v;
  while (verdicts_.size() > max_) verdicts_.erase(verdicts_.begin());
}

}  // namespace holdfast::control
