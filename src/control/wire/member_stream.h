// A member's heartbeat stream on the serving side, shared by the controller
// (which feeds Membership) and the host agent (which batches the beats
// upstream): reads the member's messages into a BeatHandler, and writes
// what is pushed to it, one write at a time, merging what piles up (so a
// slow reader costs one pending message, not a growing queue).
//
// Threading: Push, Close and Closed are thread-safe. The handler is called
// on gRPC's threads with no lock of the stream's held.
#ifndef HOLDFAST_SRC_CONTROL_WIRE_MEMBER_STREAM_H_
#define HOLDFAST_SRC_CONTROL_WIRE_MEMBER_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "src/control/wire/controller.pb.h"
#include "src/control/wire/member_sink.h"

namespace holdfast::control {

// What a member's stream feeds.
class BeatHandler {
 public:
  virtual ~BeatHandler() = default;
  // A message read from `sink`'s stream (the first binds the stream to the
  // member). A non-OK status ends the stream with that status.
  virtual absl::Status OnBeat(const HeartbeatRequest& req,
                              MemberSink* sink) = 0;
  // The stream bound to `member_id` ended: the member said it was leaving
  // (`leaving`, and `finished` if it completed its last step), or its
  // process or connection is gone. Not called after `sink` was closed by
  // Close (whoever closes a sink drops it).
  virtual void OnGone(uint64_t member_id, MemberSink* sink, bool leaving,
                      bool finished, absl::string_view why) = 0;
};

// A reactor for one Heartbeat call; deletes itself when gRPC is done with
// it. Unauthorized: ends at once with UNAUTHENTICATED. `handler` must
// outlive the server. An `epoch` above 0 (an elected controller's) is
// stamped on every message written; a host agent passes 0 and forwards
// the controller's.
grpc::ServerBidiReactor<HeartbeatRequest, HeartbeatResponse>* NewMemberStream(
    BeatHandler* handler, bool authorized, int64_t epoch = 0);

// Merges `msg` into `pending`: the latest membership, abort order, ack and
// job end win, and the newest committed step and epoch.
void MergePush(const HeartbeatResponse& msg, HeartbeatResponse* pending);

// A status as gRPC's, and back.
grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_WIRE_MEMBER_STREAM_H_
