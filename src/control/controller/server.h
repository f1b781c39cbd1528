// ControllerServer: the controller's gRPC service, embeddable in-process (the
// launcher and tests) and run by the holdfast-controller binary. Membership,
// heartbeat streams, failure detection, checkpoint acks, status, the
// rendezvous key-value store, and an optional Prometheus endpoint.
//
// Threading: Start/Shutdown from one thread; the service runs on gRPC's
// callback threads and holds no thread per stream or waiting RPC, plus one
// detector thread.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_SERVER_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_SERVER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "src/control/controller/kv_store.h"
#include "src/control/controller/membership.h"
#include "src/control/wire/tls.h"

namespace holdfast::control {

struct ControllerOptions {
  // Address to bind; loopback unless told otherwise.
  std::string bind_address = "127.0.0.1";
  // 0 picks a free port (see ControllerServer::port()).
  int port = 0;
  // The job token every RPC must carry. Required (non-empty).
  std::string token;
  // Mutual TLS (src/control/wire/tls.h): clients must present a
  // certificate of the job's CA. nullopt: plain TCP.
  std::optional<TlsConfig> tls;
  // Worker slots; registrants beyond them become standbys. Required (> 0).
  int world_size = 0;
  KvLimits limits;
  DetectionOptions detection;
  MembershipLimits membership_limits;
  RecoveryPolicy recovery;
  // How often the silent and stalled detectors run.
  absl::Duration scan_interval = absl::Milliseconds(100);
  // Prometheus text endpoint on bind_address: -1 off, 0 any free port.
  int metrics_port = -1;
  // The leader's epoch when controllers are elected (holdfast-controller
  // --etcd); 0 for a lone controller. Members refuse a controller whose
  // epoch is below one they have seen (a deposed leader).
  int64_t epoch = 0;
};

class ControllerServer {
 public:
  // InvalidArgument for an empty token or a bad port; Unavailable if the
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<ControllerServer>> Start(
      const ControllerOptions& options);
  virtual ~ControllerServer() = default;

  virtual int port() const = 0;
  // The bound metrics port, or -1 when the endpoint is off.
  virtual int metrics_port() const = 0;
  // "host:port" for clients.
  virtual std::string address() const = 0;
  // Stops serving; pending waits end with Cancelled or Unavailable.
  virtual void Shutdown() = 0;
  // Stops acting at once, for a deposed leader: detection stops and every
  // call in flight is cancelled now, with no grace for it to finish.
  virtual void Abandon() = 0;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_SERVER_H_
