// A member's heartbeat stream as the serving side sees it: the controller's
// Membership pushes to it, and so does a host agent relaying for the
// members behind it.
#ifndef HOLDFAST_SRC_CONTROL_WIRE_MEMBER_SINK_H_
#define HOLDFAST_SRC_CONTROL_WIRE_MEMBER_SINK_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/control/wire/controller.pb.h"

namespace holdfast::control {

// A member's heartbeat stream.
class MemberSink {
 public:
  virtual ~MemberSink() = default;
  // Queues `msg` for the member; merges with what is still queued (the
  // latest membership, abort and committed step win).
  virtual void Push(const HeartbeatResponse& msg) = 0;
  // Ends the stream with `status` (fenced, superseded).
  virtual void Close(const absl::Status& status) = 0;
  // Whether Close was called: a message the stream read before it closed
  // must not bind it again.
  virtual bool Closed() const = 0;
  // Whether the stream is relayed by the host agent on the member's host,
  // which watches the member's process and reports its exit after any
  // goodbye the member said (so the controller's own watch of it, racing
  // the relayed goodbye, must not judge it).
  virtual bool Relayed() const { return false; }
};

// A member's message on `sink` while `*bound` carries it: makes `sink` the
// member's stream, closing the one it supersedes. Aborted, and nothing
// changes, if `sink` was closed itself (a message a superseded stream read
// before it was closed must not take the member back). Returns whether
// `sink` is newly bound.
absl::StatusOr<bool> BindStream(MemberSink** bound, MemberSink* sink);

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_WIRE_MEMBER_SINK_H_
