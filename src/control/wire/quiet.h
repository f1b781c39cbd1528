// The bound after which a member's quiet local stream to its host agent
// means a stopped or frozen process (MemberQuiet), when none is set: the
// host agent reports at it and the controller acts at it
// (AgentOptions::quiet_after, DetectionOptions::quiet_after), so the two
// must agree.
#ifndef HOLDFAST_SRC_CONTROL_WIRE_QUIET_H_
#define HOLDFAST_SRC_CONTROL_WIRE_QUIET_H_

#include <algorithm>

#include "absl/time/time.h"

namespace holdfast::control {

// The heartbeat interval, plus half of it and at least 250 ms more:
// 750 ms with the default 500 ms interval.
inline absl::Duration DefaultQuietAfter(absl::Duration heartbeat_interval) {
  return heartbeat_interval +
         std::max(heartbeat_interval / 2, absl::Milliseconds(250));
}

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_WIRE_QUIET_H_
