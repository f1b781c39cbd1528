#include "src/control/controller/verdict.h"

#include <string>
#include <vector>

#include "holdfast/types.h"

namespace holdfast::control {

static_assert(
    static_cast<int>(diagnosis::Phase::kUnspecified) == PHASE_UNSPECIFIED &&
        static_cast<int>(diagnosis::Phase::kIdle) == PHASE_IDLE &&
        static_cast<int>(diagnosis::Phase::kComputing) == PHASE_COMPUTING &&
        static_cast<int>(diagnosis::Phase::kCollective) == PHASE_COLLECTIVE &&
        static_cast<int>(diagnosis::Phase::kCheckpointing) ==
            PHASE_CHECKPOINTING &&
        static_cast<int>(diagnosis::Phase::kRecovering) == PHASE_RECOVERING,
    "diagnosis::Phase mirrors the wire's Phase");

diagnosis::Phase ToDiagnosisPhase(Phase phase) {
  if (phase < PHASE_UNSPECIFIED || phase > PHASE_RECOVERING) {
    return diagnosis::Phase::kUnspecified;
  }
  return static_cast<diagnosis::Phase>(phase);
}

const char* PhaseName(Phase phase) {
  return diagnosis::PhaseName(ToDiagnosisPhase(phase));
}

Verdict ToProto(const diagnosis::Diagnosis& d, int64_t verdict_unix_ms) {
  Verdict v;
  v.set_kind(diagnosis::DiagnosisKindName(d.kind));
  for (int c : d.culprits) v.add_culprits(c);
  for (int c : d.victims) v.add_victims(c);
  v.set_coll_seq(d.coll_seq);
  if (d.coll_seq >= 0) {
    v.set_op(std::string(OpTypeName(d.op)));
    v.set_count(d.count);
    v.set_dtype(std::string(DataTypeName(d.dtype)));
  }
  v.set_evidence(d.evidence);
  v.set_confidence(d.confidence);
  v.set_verdict_unix_ms(verdict_unix_ms);
  return v;
}

nlohmann::json VerdictJson(const Verdict& v) {
  nlohmann::json j = {
      {"kind", v.kind()},
      {"culprits", std::vector<int>(v.culprits().begin(), v.culprits().end())},
      {"victims", std::vector<int>(v.victims().begin(), v.victims().end())},
      {"evidence", v.evidence()},
      {"confidence", v.confidence()},
      {"action", v.action()},
      {"action_reason", v.action_reason()},
      {"verdict_unix_ms", v.verdict_unix_ms()}};
  if (v.coll_seq() >= 0) {
    j["collective"] = {{"seq", v.coll_seq()},
                       {"op", v.op()},
                       {"count", v.count()},
                       {"dtype", v.dtype()}};
  }
  return j;
}

}  // namespace holdfast::control
