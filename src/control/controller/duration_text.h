// Durations as the controller writes them in replies and incidents.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_DURATION_TEXT_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_DURATION_TEXT_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace holdfast::control {

inline int64_t ToMs(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

// "1.5 s".
inline std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d));
}

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_DURATION_TEXT_H_
