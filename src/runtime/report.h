// What runtimes leave in the controller's store for the launcher's summary:
// one record per recovery (written by slot 0 of the generation that
// recovered, after its first step), the final result (slot 0 at the end)
// and the first error that ended a member's run. Internal; shared by the
// runtime and holdfast-run.
#ifndef HOLDFAST_SRC_RUNTIME_REPORT_H_
#define HOLDFAST_SRC_RUNTIME_REPORT_H_

#include <nlohmann/json.hpp>

#include "holdfast/runtime.h"

namespace holdfast {

inline constexpr char kRecoveryPrefix[] = "holdfast/report/recovery/";
inline constexpr char kFinalKey[] = "holdfast/report/final";
// The first error that ended a member's Run (other than being fenced or an
// unused standby), as {"slot", "code", "message"}: the launcher's summary
// names it instead of only "a worker left".
inline constexpr char kErrorKey[] = "holdfast/report/error";
// A fresh job that resumed from the disk tier, as {"step", "dir"} (slot 0).
inline constexpr char kResumedKey[] = "holdfast/report/resumed";
// Each slot's state at the end of the job, as {"replicated", "sharded"}:
// hex hashes of its registered replicated state (the same on every slot)
// and of its own partition of the sharded state, under this prefix and the
// slot number. The launcher combines them into one state hash.
inline constexpr char kFinalStatePrefix[] = "holdfast/report/state/";

inline nlohmann::json ToJson(const RecoveryRecord& r) {
  return {{"failed_generation", r.failed_generation},
          {"generation", r.generation},
          {"cause", r.cause},
          {"seen_ms", r.seen_ms},
          {"aborted_ms", r.aborted_ms},
          {"agreed_ms", r.agreed_ms},
          {"rebuilt_ms", r.rebuilt_ms},
          {"restored_ms", r.restored_ms},
          {"first_step_ms", r.first_step_ms},
          {"restored_step", r.restored_step},
          {"lost_steps", r.lost_steps},
          {"received_state", r.received_state},
          {"from_disk", r.from_disk},
          {"bytes_received", r.bytes_received},
          {"bytes_read_in_place", r.bytes_read_in_place}};
}

}  // namespace holdfast

#endif  // HOLDFAST_SRC_RUNTIME_REPORT_H_
