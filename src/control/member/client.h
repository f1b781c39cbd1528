// ControllerStore: holdfast::Store over the controller's key-value RPCs, so
// communicators rendezvous through the controller (Gloo now, NCCL's unique
// id later). Also exposes the counter, compare-and-set and delete calls.
//
// Threading: thread-safe (one gRPC channel, per-call contexts).
#ifndef HOLDFAST_SRC_CONTROL_MEMBER_CLIENT_H_
#define HOLDFAST_SRC_CONTROL_MEMBER_CLIENT_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "holdfast/store.h"
#include "src/control/wire/controller.pb.h"
#include "src/control/wire/tls.h"

namespace holdfast::control {

struct ClientOptions {
  std::string address;  // "host:port" of the controller
  std::string token;    // the job token
  // Extra time allowed to an RPC beyond its own wait, for the network.
  absl::Duration rpc_slack = absl::Seconds(10);
  std::optional<TlsConfig> tls = std::nullopt;  // nullopt: plain TCP
};

class ControllerStore : public Store {
 public:
  // InvalidArgument for an empty address or token. Does not connect yet:
  // an unreachable controller shows up as Unavailable on the first call.
  static absl::StatusOr<std::shared_ptr<ControllerStore>> Connect(
      const ClientOptions& options);

  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;
  // {swapped, value after the call}
  virtual absl::StatusOr<std::pair<bool, std::string>> CompareAndSet(
      absl::string_view key, absl::string_view expected, bool expect_absent,
      absl::string_view desired) = 0;
  virtual absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix) = 0;
};

// One Status call (for `holdfast status` and tests). Unavailable if the
// controller does not answer within rpc_slack.
absl::StatusOr<StatusResponse> FetchStatus(const ClientOptions& options,
                                           const StatusRequest& request);

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_MEMBER_CLIENT_H_
