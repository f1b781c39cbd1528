// Job-token handling shared by the controller server and its clients.
// Pure functions; thread-safe.
#ifndef HOLDFAST_SRC_CONTROL_WIRE_AUTH_H_
#define HOLDFAST_SRC_CONTROL_WIRE_AUTH_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace holdfast::control {

// The gRPC metadata entry that carries the token.
inline constexpr char kTokenMetadataKey[] = "x-holdfast-token";

// Compares in time that depends only on the lengths, not on where the first
// difference is.
bool TokensEqual(absl::string_view a, absl::string_view b);

// The job token: the file's first line if `token_file` is set, else
// HOLDFAST_JOB_TOKEN. InvalidArgument if neither gives a non-empty token;
// the token itself never appears in a message.
absl::StatusOr<std::string> LoadToken(const std::string& token_file);

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_WIRE_AUTH_H_
