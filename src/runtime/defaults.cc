// The runtime's defaults (holdfast/runtime.h), from the HOLDFAST_* registry
// (src/common/config.h). None is clamped to its range: Runtime::Create's
// options check is the one range rule of each, and refuses a value out of
// it by name.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "holdfast/runtime.h"
#include "src/common/config.h"
#include "src/control/wire/tls.h"

namespace holdfast::defaults {
namespace {

// An integer parameter as an int, saturated (a value past INT32_MAX stays
// out of every range the options check has).
int IntOf(const char* env) {
  return static_cast<int>(std::min<int64_t>(config::IntParam(env), INT32_MAX));
}

}  // namespace

std::string Controller() { return config::StringParam("HOLDFAST_CONTROLLER"); }
std::string JobToken() { return config::StringParam("HOLDFAST_JOB_TOKEN"); }
TlsFiles Tls() { return control::TlsFilesFromEnv(); }
std::string Host() {
  std::string host = config::StringParam("HOLDFAST_HOST");
  if (host.empty()) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    host = name;
  }
  return host;
}
std::string TopologyBlock() {
  return config::StringParam("HOLDFAST_TOPOLOGY_BLOCK");
}
absl::Duration RecoveryTimeout() {
  return absl::Milliseconds(config::IntParam("HOLDFAST_RECOVERY_TIMEOUT_MS"));
}
std::string Faults() { return config::StringParam("HOLDFAST_FAULTS"); }
std::optional<int> PreferredSlot() {
  const std::string want = config::StringParam("HOLDFAST_PREFERRED_SLOT");
  if (want == "standby") return -1;
  int slot;
  if (absl::SimpleAtoi(want, &slot) && slot >= 0) return slot;
  return std::nullopt;
}
std::optional<int> StartGateFd() {
  int fd;
  if (absl::SimpleAtoi(config::StringParam("HOLDFAST_START_GATE_FD"), &fd) &&
      fd >= 0) {
    return fd;
  }
  return std::nullopt;
}
int Replicas() { return IntOf("HOLDFAST_REPLICAS"); }
VerifyBackups VerifyBackupsWhen() {
  return config::StringParam("HOLDFAST_VERIFY_BACKUPS") == "restore"
             ? VerifyBackups::kRestore
             : VerifyBackups::kArrival;
}
bool LiveRestore() {
  return config::StringParam("HOLDFAST_LIVE_RESTORE") == "on";
}
bool SameHostRestore() {
  return config::StringParam("HOLDFAST_SAME_HOST_RESTORE") == "on";
}
bool SideExchanges() {
  return config::StringParam("HOLDFAST_SIDE_EXCHANGES") == "on";
}
bool OverlapInit() {
  return config::StringParam("HOLDFAST_OVERLAP_INIT") == "on";
}
int TpSize() { return IntOf("HOLDFAST_TP_SIZE"); }
int PpSize() { return IntOf("HOLDFAST_PP_SIZE"); }
std::string CheckpointDir() {
  return config::StringParam("HOLDFAST_CHECKPOINT_DIR");
}
int64_t CheckpointEvery() {
  return config::IntParam("HOLDFAST_CHECKPOINT_EVERY");
}
int KeepSnapshots() { return IntOf("HOLDFAST_KEEP_SNAPSHOTS"); }
int MaxStepRetries() { return IntOf("HOLDFAST_MAX_STEP_RETRIES"); }
int ReplicaCheckEvery() { return IntOf("HOLDFAST_REPLICA_CHECK_EVERY"); }

}  // namespace holdfast::defaults
