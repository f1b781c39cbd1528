// The communicator's defaults (holdfast/options.h), from the HOLDFAST_*
// registry (src/common/config.h). The ranges are checked where the options
// are used (CommunicatorImpl's options check).
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "holdfast/options.h"
#include "src/common/config.h"

namespace holdfast::defaults {

absl::Duration OpTimeout() {
  static const int64_t ms = config::IntParam("HOLDFAST_TIMEOUT_MS");
  return absl::Milliseconds(ms);
}
absl::Duration ConnectTimeout() {
  static const int64_t ms = config::IntParam("HOLDFAST_CONNECT_TIMEOUT_MS");
  return absl::Milliseconds(ms);
}
absl::Duration WatchdogInterval() {
  static const int64_t ms = config::IntParam("HOLDFAST_WATCHDOG_INTERVAL_MS");
  return absl::Milliseconds(ms);
}
size_t TraceCapacity() {
  static const int64_t n = config::IntParam("HOLDFAST_TRACE_CAPACITY");
  return static_cast<size_t>(n);
}
std::string Backend() { return config::StringParam("HOLDFAST_BACKEND"); }

int Device() {
  int device = 0;
  for (const char* env : {"HOLDFAST_DEVICE", "LOCAL_RANK"}) {
    const char* value = std::getenv(env);
    if (value != nullptr && *value != 0 && absl::SimpleAtoi(value, &device) &&
        device >= 0) {
      return device;
    }
  }
  return 0;
}

std::string TraceDir() {
  if (const char* dir = std::getenv("HOLDFAST_TRACE_DIR")) return dir;
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
         "/holdfast-trace";
}
std::string BindAddress() { return config::StringParam("HOLDFAST_BIND_ADDR"); }
std::string Interface() { return config::StringParam("HOLDFAST_IFACE"); }

}  // namespace holdfast::defaults
