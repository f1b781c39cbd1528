// Helpers shared by the controller's clients: status translation and call
// contexts that carry the job token. Thread-safe (pure functions).
#ifndef HOLDFAST_SRC_CONTROL_RPC_UTIL_H_
#define HOLDFAST_SRC_CONTROL_RPC_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "src/control/auth.h"

namespace holdfast::control {

// A gRPC status as an absl::Status whose message says which call failed.
inline absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(
      static_cast<absl::StatusCode>(s.error_code()),
      absl::StrCat("controller ", what, ": ", s.error_message()));
}

// A call context with the token and `deadline` (infinite: none).
inline std::unique_ptr<grpc::ClientContext> TokenContext(
    const std::string& token, absl::Time deadline) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata(kTokenMetadataKey, token);
  if (deadline != absl::InfiniteFuture()) {
    ctx->set_deadline(absl::ToChronoTime(deadline));
  }
  return ctx;
}

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_RPC_UTIL_H_
