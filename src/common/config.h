// The one place where HOLDFAST_* environment variables are read. Each
// tunable is one HOLDFAST_PARAM line in config.cc and one row of
// docs/configuration.md. Thread-safe: values are read once, on first use.
#ifndef HOLDFAST_SRC_COMMON_CONFIG_H_
#define HOLDFAST_SRC_COMMON_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace holdfast::config {

// The one range rule of the committed snapshots a member keeps
// (HOLDFAST_KEEP_SNAPSHOTS, RuntimeOptions::keep_snapshots, and the count an
// anomaly report carries to the controller): at least two, because the
// newest committed snapshot may already be poisoned when a numeric anomaly
// shows.
inline constexpr int kMinKeepSnapshots = 2;
inline constexpr int kMaxKeepSnapshots = 64;

struct Param {
  const char* env;
  const char* default_value;
  const char* help;
};

// Every parameter, for documentation and `--help` output.
const std::vector<Param>& AllParams();

// OK if every HOLDFAST_* variable that is set parses; otherwise
// InvalidArgument naming the variable and its value.
absl::Status Validate();

// Value of an integer parameter (its default if unset or malformed).
int64_t IntParam(const char* env);
// Value of a string parameter (its default if unset).
std::string StringParam(const char* env);

// Turns off Abseil's mutex deadlock detector for this process unless
// HOLDFAST_MUTEX_DEADLOCK_CHECK=on. Release builds of Abseil have it off;
// Debian's libabsl (built without NDEBUG) has it on, and then every
// absl::Mutex acquisition in the process, gRPC's included, takes one
// process-wide spin lock. Called by the controller, the runtime and the
// communicator; idempotent.
void ApplyMutexMode();

}  // namespace holdfast::config

#endif  // HOLDFAST_SRC_COMMON_CONFIG_H_
