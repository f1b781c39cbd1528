// HostAgent: one per host, between the members on that host and the job's
// controller (docs/controller.md, "Host agents"). Members point
// HOLDFAST_CONTROLLER at their host's agent and notice no difference: the
// agent serves the controller's interface, passes every call through, and
// carries all of its host's heartbeat streams on one stream to the
// controller (HostStream), batched, with the controller's pushes merged
// per host on the way back.
//
// - A member whose process dies breaks its local stream; the agent tells
//   the controller at once (MemberGone), which declares it crashed. The
//   agent watches its members' processes too, and tells it as soon as
//   one begins to exit (process_watch.h), before the stream breaks.
// - A member whose local stream goes quiet while the agent runs (a stopped
//   or frozen process: a local stream has no link to blip) is reported to
//   the controller (MemberQuiet), which declares it silent well before the
//   silence grace that protects members from link blips.
// - The agent's own death breaks its stream to the controller, which ends
//   every member on it: a whole-host loss.
// - A restart (Handover) is not a loss: the controller keeps the members,
//   whose streams the agent closes as UNAVAILABLE; they resume through the
//   next agent at the same address, as after a controller restart.
// - When its stream to the controller breaks, the agent closes its
//   members' streams the same way, and they resume once it is back.
//
// Threading: thread-safe.
#ifndef HOLDFAST_SRC_CONTROL_AGENT_AGENT_H_
#define HOLDFAST_SRC_CONTROL_AGENT_AGENT_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/control/wire/tls.h"

namespace holdfast::control {

struct AgentOptions {
  std::string controller;  // "host:port" of the controller
  std::string token;       // the job token (members must present it too)
  // Mutual TLS toward the controller and toward the members (tls.h);
  // nullopt: plain TCP.
  std::optional<TlsConfig> tls;
  // Where members connect: "unix:PATH" (recommended: a restarted agent
  // finds the same address) or "HOST:PORT" (port 0: any free port).
  std::string listen = "127.0.0.1:0";
  // This host's name (default gethostname()), for the controller's logs.
  std::string host;
  // How long beats wait to be batched; zero takes the heartbeat interval
  // the controller gives members (500 ms until the first member joins).
  // Messages that matter at once go at once: a member's first beat on a
  // stream, its checkpoint acks, its answer to a new generation, its
  // goodbye and its stream's end.
  absl::Duration flush_interval = absl::ZeroDuration();
  // A member whose local stream has been quiet this long is reported to
  // the controller (MemberQuiet), which declares it silent once the quiet
  // reaches its own bound (DetectionOptions::quiet_after); reported again
  // every 100 ms while it stays quiet. Zero: DefaultQuietAfter
  // (src/control/wire/quiet.h) of the heartbeat interval learned from the
  // members' registrations (750 ms at 500 ms). Infinite: never.
  absl::Duration quiet_after = absl::ZeroDuration();
  // How often the agent reads /proc for its members (process_watch.h): one
  // whose process begins to exit is reported gone then, not when its local
  // stream ends after its memory's teardown (about 60 ms per GiB after a
  // SIGKILL). Zero: off.
  absl::Duration exit_watch_interval = absl::Milliseconds(5);
  // Reconnect back-off after the stream to the controller breaks.
  absl::Duration reconnect_min = absl::Milliseconds(50);
  absl::Duration reconnect_max = absl::Seconds(2);
};

class HostAgent {
 public:
  // Listens and connects. InvalidArgument for bad options; Unavailable if
  // it cannot listen. A controller that is not up yet is retried.
  static absl::StatusOr<std::unique_ptr<HostAgent>> Start(
      const AgentOptions& options);
  // Stops without a handover (Stop).
  virtual ~HostAgent() = default;

  // The address members use: "unix:PATH" or "HOST:PORT" with the bound
  // port.
  virtual std::string address() const = 0;
  // Members with a live local stream.
  virtual int members() const = 0;
  // Whether the stream to the controller is up.
  virtual bool connected() const = 0;

  // For a restart: tells the controller that this host's members are not
  // lost, closes their streams (UNAVAILABLE: they resume through the next
  // agent) and stops serving.
  virtual void Handover() = 0;
  // Stops serving; to the controller, the host's remaining members are
  // lost (as if the agent had died).
  virtual void Stop() = 0;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_AGENT_AGENT_H_
