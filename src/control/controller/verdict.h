// The diagnosis (src/diagnosis/diagnosis.h) as the controller records and
// sends it: conversions between the wire's types and the pure analysis's.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_VERDICT_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_VERDICT_H_

#include <cstdint>

#include <nlohmann/json.hpp>

#include "src/control/wire/controller.pb.h"
#include "src/diagnosis/diagnosis.h"

namespace holdfast::control {

// A heartbeat's phase as the analysis takes it.
diagnosis::Phase ToDiagnosisPhase(Phase phase);

// "idle", "computing", ... (diagnosis::PhaseName); "-" for unspecified.
const char* PhaseName(Phase phase);

// The verdict as the controller records it (without the action).
Verdict ToProto(const diagnosis::Diagnosis& d, int64_t verdict_unix_ms);

// A recorded verdict as JSON (the store's keys::Verdict, summary.json):
// kind, culprits, victims, evidence, confidence, action, action_reason,
// verdict_unix_ms, and the collective when there is one.
nlohmann::json VerdictJson(const Verdict& v);

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_VERDICT_H_
