// MemberClient: a process's membership in the job. Registers with the
// controller, keeps a heartbeat stream with step reports (at each step end
// and every heartbeat interval from a background thread), receives the
// controller's pushes (new generation, abort orders, committed step), and
// rides out controller restarts by reconnecting with back-off and resuming
// its slot and generation. Training never waits on the controller: reports
// are queued, never blocking.
//
// Threading: every method is thread-safe. Callbacks run on the client's
// reader thread, one at a time; they must not call Leave() or destroy the
// client.
#ifndef HOLDFAST_SRC_CONTROL_MEMBER_MEMBER_H_
#define HOLDFAST_SRC_CONTROL_MEMBER_MEMBER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/control/member/client.h"
#include "src/control/wire/controller.pb.h"

namespace holdfast::control {

struct MemberOptions {
  ClientOptions client;
  // Labels; host defaults to gethostname(), failure_domain to host.
  std::string host;
  std::string failure_domain;
  std::string topology_block;
  // A fresh registration's wish: this slot if still vacant, or -1 for the
  // standby role; unset lets the controller choose.
  std::optional<int> preferred_slot;
  // Periodic report interval; zero takes the controller's.
  absl::Duration heartbeat_interval = absl::ZeroDuration();
  // How long Join waits for the controller to come up.
  absl::Duration connect_timeout = absl::Seconds(60);
  // Reconnect back-off after a broken stream (doubling, with jitter).
  absl::Duration reconnect_min = absl::Milliseconds(50);
  absl::Duration reconnect_max = absl::Seconds(2);
};

struct MemberCallbacks {
  std::function<void(const MembershipUpdate&)> on_membership;
  std::function<void(const AbortOrder&)> on_abort;
  std::function<void(int64_t committed_step)> on_committed;
  // The controller declared this member dead (or refused to resume it).
  // No more heartbeats are sent; the process must not rejoin with its state.
  std::function<void(const absl::Status&)> on_fenced;
  // The stream came back after a break (controller restart, network).
  std::function<void(int reconnects)> on_reconnected;
  // The job is over (every worker finished, or it stopped below the
  // minimum world size).
  std::function<void(const JobEnd&)> on_job_end;
  // The collective the member's training communicator is inside (its
  // coll_seq), or -1. Asked on the heartbeat thread, with no lock held,
  // before each report whose phase is computing; such a report then says
  // PHASE_COLLECTIVE. Must not block.
  std::function<int64_t()> collective_in_progress;
};

struct Assignment {
  uint64_t member_id = 0;
  bool standby = false;
  int slot = -1;
  int64_t generation = 0;
  int world_size = 0;
  int64_t committed_step = -1;
  // The data the job skips (numeric anomalies), [begin, end) in order.
  std::vector<std::pair<int64_t, int64_t>> skip_data;
};

// The skip list of a generation update or a registration, as pairs.
std::vector<std::pair<int64_t, int64_t>> SkipList(
    const google::protobuf::RepeatedPtrField<DataRange>& ranges);

class MemberClient {
 public:
  // Registers (waiting up to connect_timeout for the controller) and starts
  // heartbeats. InvalidArgument for bad options; Unauthenticated for a wrong
  // token; Unavailable if the controller never answers; ResourceExhausted
  // if the heartbeat thread cannot start (the member has left the job
  // then). A heartbeat stream whose reader thread cannot start is retried
  // with a back-off, and health() says so meanwhile.
  static absl::StatusOr<std::unique_ptr<MemberClient>> Join(
      const MemberOptions& options, MemberCallbacks callbacks = {});
  // Leaves cleanly if Leave() was not called.
  virtual ~MemberClient() = default;

  virtual Assignment assignment() const = 0;

  // At a step's end: sends a report now (without waiting for it).
  // InvalidArgument for a negative step.
  // `collective_time`: how much of the step the member spent inside its
  // collectives (StepReport::collective_us); `arrival`: the mean time from
  // the step's start to the issue of each of them (StepReport::arrival_us).
  virtual absl::Status ReportStep(
      int64_t step, absl::Duration step_time,
      const std::map<std::string, double>& metrics = {},
      absl::Duration collective_time = absl::ZeroDuration(),
      absl::Duration arrival = absl::ZeroDuration()) = 0;
  // A hash of the member's replicated state after `step` of `generation`
  // (StepReport::replica_checks): reports carry the newest few until a
  // newer generation drops them.
  virtual void NoteReplicaCheck(int64_t generation, int64_t step, uint64_t hash,
                                int keep_snapshots) = 0;
  // The norm of the member's local gradients in `step` of `generation`
  // (StepReport::local_norms, `norm` its step and data): reports carry
  // those of the steps after the newest commit the member knows, up to a
  // bound, until a newer generation drops them.
  virtual void NoteLocalNorm(int64_t generation, const LocalNorm& norm) = 0;
  // The segments retransmitted to each peer in `generation` so far
  // (StepReport::retransmits): reports carry the newest.
  virtual void NoteRetransmits(
      int64_t generation,
      const std::vector<std::pair<int, int64_t>>& counts) = 0;
  // Where the member is inside its step; periodic reports carry it.
  virtual void SetPhase(Phase phase, int64_t collective_seq = 0) = 0;
  // The member has come to the rendezvous of `generation`: sends a report
  // now (the controller leaves out a member that does not come while the
  // others have, DetectionOptions::rendezvous_grace).
  virtual void AtRendezvous(int64_t generation) = 0;

  // Unary calls with this member's identity (fenced: FailedPrecondition).
  // `generation`: the generation whose communicator failed. A report
  // that arrives after the next one opened is refused, not held against
  // the new generation; its `unreachable` slots (peers this member could
  // not reach on the data network) are kept as evidence all the same.
  virtual absl::StatusOr<bool> ReportFailure(
      int peer_slot, const std::string& reason, int64_t generation,
      const std::vector<int>& unreachable = {}) = 0;
  // Evidence only: the slots of `generation` this member could not reach
  // on the data network; the controller opens no generation for it (but
  // may fence whom the evidence of several members names).
  virtual absl::StatusOr<bool> ReportUnreachable(
      const std::vector<int>& unreachable, const std::string& reason,
      int64_t generation) = 0;
  // A numeric anomaly of a step of `generation` (the controller rolls the
  // job back by opening the next generation). Whether it was taken up
  // (false: the job is not running).
  virtual absl::StatusOr<bool> ReportAnomaly(const Anomaly& anomaly,
                                             int64_t generation) = 0;
  // `generation`: the generation the snapshot was taken in (-1: the
  // current one); an ack from an older one is refused.
  virtual absl::StatusOr<int64_t> AckCheckpoint(int64_t step,
                                                int64_t generation = -1) = 0;
  // The same ack, sent on the heartbeat stream at once instead of as a
  // call of its own (less latency, and no RPC per step per member at the
  // controller). Nothing comes back but the commit, through on_committed.
  // While the stream is down, the newest ack waits and goes with the next
  // stream's first message.
  virtual void SendCheckpointAck(int64_t step, int64_t generation) = 0;

  // The lease the controller gave (zero: none): with no word from it for
  // this long, the member must stop acting (the runtime completes no step)
  // until it hears again, since the controller may be about to declare it
  // lost. Unheard(now): how long it has had no word, counted from the
  // send time of the newest heartbeat the controller acked (or its
  // Register call), so it errs long. Heartbeats ask for acks four times
  // per lease.
  virtual absl::Duration lease() const = 0;
  virtual absl::Duration Unheard(absl::Time now) const = 0;

  // OK while a member; the fencing status once fenced; Unavailable while
  // the controller is unreachable (reports are kept and sent on return).
  virtual absl::Status health() const = 0;
  virtual int reconnects() const = 0;

  // Says goodbye and closes the stream. `finished`: a worker that completed
  // its last step; a worker that leaves unfinished while the job runs is a
  // lost worker to the controller (a standby's leave is always clean).
  virtual void Leave(bool finished = false) = 0;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_MEMBER_MEMBER_H_
