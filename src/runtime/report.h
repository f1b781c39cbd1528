// The JSON of a recovery record, which runtimes leave in the controller's
// store for the launcher's summary (the keys: src/store/keys.h). Internal;
// shared by the runtime and holdfast-run.
#ifndef HOLDFAST_SRC_RUNTIME_REPORT_H_
#define HOLDFAST_SRC_RUNTIME_REPORT_H_

#include <nlohmann/json.hpp>

#include "holdfast/runtime.h"

namespace holdfast {

inline nlohmann::json ToJson(const RecoveryRecord& r) {
  return {{"failed_generation", r.failed_generation},
          {"generation", r.generation},
          {"cause", r.cause},
          {"seen_ms", r.seen_ms},
          {"aborted_ms", r.aborted_ms},
          {"agreed_ms", r.agreed_ms},
          {"rebuilt_ms", r.rebuilt_ms},
          {"restored_ms", r.restored_ms},
          {"comm_up_ms", r.comm_up_ms},
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
