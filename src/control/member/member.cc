#include "src/control/member/member.h"

#include <algorithm>

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <iterator>
#include <map>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "holdfast/status.h"
#include "src/common/logging.h"
#include "src/common/thread_util.h"
#include "src/control/wire/controller.grpc.pb.h"
#include "src/control/wire/process_watch.h"
#include "src/control/wire/rpc_util.h"

namespace holdfast::control {

std::vector<std::pair<int64_t, int64_t>> SkipList(
    const google::protobuf::RepeatedPtrField<DataRange>& ranges) {
  std::vector<std::pair<int64_t, int64_t>> out;
  out.reserve(static_cast<size_t>(ranges.size()));
  for (const DataRange& r : ranges) out.emplace_back(r.begin(), r.end());
  return out;
}

namespace {

// Statuses after which this identity must never be used again.
bool IsFinal(absl::StatusCode c) {
  return c == absl::StatusCode::kFailedPrecondition ||
         c == absl::StatusCode::kUnauthenticated ||
         c == absl::StatusCode::kInvalidArgument;
}

class MemberClientImpl final : public MemberClient {
 public:
  MemberClientImpl(MemberOptions o, MemberCallbacks cb,
                   std::unique_ptr<Controller::Stub> stub, RegisterRequest reg,
                   const RegisterResponse& first, absl::Time asked_at)
      : options_(std::move(o)),
        callbacks_(std::move(cb)),
        stub_(std::move(stub)),
        register_(std::move(reg)) {
    Adopt(first, asked_at);
    interval_ = options_.heartbeat_interval > absl::ZeroDuration()
                    ? options_.heartbeat_interval
                    : absl::Milliseconds(
                          std::max<int64_t>(10, first.heartbeat_interval_ms()));
  }

  // Starts the heartbeat thread. When it cannot start (the process may not
  // have more threads), leaves the job on the calling thread so the
  // controller is not left waiting for a member that never speaks, and
  // returns ResourceExhausted.
  absl::Status Start() {
    absl::StatusOr<std::thread> t =
        StartThread("the heartbeat thread", [this] { Run(); });
    if (t.ok()) {
      worker_ = std::move(*t);
      return absl::OkStatus();
    }
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      thread_failed_ = true;  // the destructor parks the stub
    }
    LeaveInline();
    return absl::ResourceExhaustedError(
        absl::StrCat("member: ", t.status().message(), "; left the job"));
  }

  ~MemberClientImpl() override {
    Leave(false);
    absl::MutexLock lock(&mu_);
    if (thread_failed_) ParkStub();
  }

  Assignment assignment() const override {
    absl::MutexLock lock(&mu_);
    return assignment_;
  }

  absl::Status ReportStep(int64_t step, absl::Duration step_time,
                          const std::map<std::string, double>& metrics,
                          absl::Duration collective_time,
                          absl::Duration arrival) override {
    if (step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ReportStep: step ", step, " is negative"));
    }
    absl::MutexLock lock(&mu_);
    report_.set_step(step);
    report_.set_last_step_us(
        std::max<int64_t>(0, absl::ToInt64Microseconds(step_time)));
    report_.set_collective_us(std::clamp<int64_t>(
        absl::ToInt64Microseconds(collective_time), 0, report_.last_step_us()));
    report_.set_arrival_us(std::clamp<int64_t>(
        absl::ToInt64Microseconds(arrival), 0, report_.last_step_us()));
    report_.set_phase(PHASE_COMPUTING);
    report_.mutable_metrics()->clear();
    report_.mutable_metrics()->insert(metrics.begin(), metrics.end());
    step_end_ = true;
    return absl::OkStatus();
  }

  void NoteReplicaCheck(int64_t generation, int64_t step, uint64_t hash,
                        int keep_snapshots) override {
    constexpr int kKept = 4;
    absl::MutexLock lock(&mu_);
    // Those of another generation go, and so does what was said of a step
    // redone after a rollback.
    google::protobuf::RepeatedPtrField<ReplicaCheck> kept;
    for (ReplicaCheck& c : *report_.mutable_replica_checks()) {
      if (c.generation() == generation && c.step() < step) kept.Add()->Swap(&c);
    }
    if (kept.size() >= kKept) kept.DeleteSubrange(0, kept.size() - kKept + 1);
    report_.mutable_replica_checks()->Swap(&kept);
    ReplicaCheck* c = report_.add_replica_checks();
    c->set_generation(generation);
    c->set_step(step);
    c->set_hash(hash);
    c->set_keep_snapshots(keep_snapshots);
  }

  void NoteLocalNorm(int64_t generation, const LocalNorm& norm) override {
    // Steps after the commit: the controller decides a step's norms
    // before it commits the step (a snapshot every 64 steps or more
    // leaves the oldest unchecked).
    constexpr int kKept = 64;
    absl::MutexLock lock(&mu_);
    google::protobuf::RepeatedPtrField<LocalNorm> kept;
    for (LocalNorm& n : *report_.mutable_local_norms()) {
      if (n.generation() == generation && n.step() < norm.step() &&
          n.step() > assignment_.committed_step) {
        kept.Add()->Swap(&n);
      }
    }
    if (kept.size() >= kKept) kept.DeleteSubrange(0, kept.size() - kKept + 1);
    report_.mutable_local_norms()->Swap(&kept);
    LocalNorm* n = report_.add_local_norms();
    *n = norm;
    n->set_generation(generation);
  }

  void NoteRetransmits(
      int64_t generation,
      const std::vector<std::pair<int, int64_t>>& counts) override {
    absl::MutexLock lock(&mu_);
    report_.clear_retransmits();
    report_.set_retransmits_generation(generation);
    for (const auto& [slot, count] : counts) {
      PeerCount* c = report_.add_retransmits();
      c->set_slot(slot);
      c->set_count(count);
    }
  }

  void SetPhase(Phase phase, int64_t collective_seq) override {
    absl::MutexLock lock(&mu_);
    report_.set_phase(phase);
    report_.set_collective_seq(collective_seq);
  }

  void AtRendezvous(int64_t generation) override {
    absl::MutexLock lock(&mu_);
    if (generation <= report_.rendezvous_generation() &&
        report_.has_rendezvous_generation()) {
      return;
    }
    report_.set_rendezvous_generation(generation);
    report_now_ = true;
  }

  absl::StatusOr<bool> ReportFailure(
      int peer_slot, const std::string& reason, int64_t generation,
      const std::vector<int>& unreachable) override {
    ReportFailureRequest req;
    req.set_peer_slot(peer_slot);
    req.set_reason(reason);
    for (int u : unreachable) req.add_unreachable_slots(u);
    return SendReport(std::move(req), generation);
  }

  absl::StatusOr<bool> ReportUnreachable(const std::vector<int>& unreachable,
                                         const std::string& reason,
                                         int64_t generation) override {
    ReportFailureRequest req;
    req.set_peer_slot(-1);
    req.set_reason(reason);
    req.set_evidence_only(true);
    for (int u : unreachable) req.add_unreachable_slots(u);
    return SendReport(std::move(req), generation);
  }

  absl::StatusOr<bool> ReportAnomaly(const Anomaly& anomaly,
                                     int64_t generation) override {
    ReportFailureRequest req;
    req.set_peer_slot(-1);
    req.set_reason(absl::StrCat(anomaly.kind(), " in ", anomaly.what(),
                                " at step ", anomaly.step()));
    *req.mutable_anomaly() = anomaly;
    return SendReport(std::move(req), generation);
  }

  // A ReportFailure call with this member's identity.
  absl::StatusOr<bool> SendReport(ReportFailureRequest req,
                                  int64_t generation) {
    {
      absl::MutexLock lock(&mu_);
      req.set_member_id(assignment_.member_id);
    }
    req.set_generation(generation);
    ReportFailureResponse resp;
    auto ctx = Context();
    absl::Status s =
        FromGrpc(stub_->ReportFailure(ctx.get(), req, &resp), "ReportFailure");
    if (!s.ok()) return s;
    return resp.declared();
  }

  absl::StatusOr<int64_t> AckCheckpoint(int64_t step,
                                        int64_t generation) override {
    AckCheckpointRequest req;
    {
      absl::MutexLock lock(&mu_);
      req.set_member_id(assignment_.member_id);
      req.set_generation(generation >= 0 ? generation : assignment_.generation);
    }
    req.set_step(step);
    AckCheckpointResponse resp;
    auto ctx = Context();
    absl::Status s =
        FromGrpc(stub_->AckCheckpoint(ctx.get(), req, &resp), "AckCheckpoint");
    if (!s.ok()) return s;
    return resp.committed_step();
  }

  void SendCheckpointAck(int64_t step, int64_t generation) override {
    absl::MutexLock lock(&mu_);
    CheckpointAck a;
    a.set_generation(generation);
    a.set_step(step);
    ack_ = a;
  }

  absl::Duration lease() const override {
    absl::MutexLock lock(&mu_);
    return lease_;
  }

  absl::Duration Unheard(absl::Time now) const override {
    absl::MutexLock lock(&mu_);
    return now - heard_from_;
  }

  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    return health_;
  }

  int reconnects() const override {
    absl::MutexLock lock(&mu_);
    return reconnects_;
  }

  void Leave(bool finished) override {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      stop_ = true;
      finished_ = finished;
      if (resume_ctx_ != nullptr) resume_ctx_->TryCancel();
    }
    worker_.join();
  }

 private:
  std::unique_ptr<grpc::ClientContext> Context() const {
    return TokenContext(options_.client.token,
                        absl::Now() + options_.client.rpc_slack);
  }

  // `asked_at`: when the Register call that `r` answers was made.
  // Takes a Register answer. A resume's answer newer than the generation
  // this member knows leaves its place alone: the member learns that
  // generation as the others did, from the push its next stream gets
  // (its first beat names the older generation), so that on_membership
  // sees it.
  void Adopt(const RegisterResponse& r, absl::Time asked_at) {
    absl::MutexLock lock(&mu_);
    epoch_ = std::max(epoch_, r.epoch());
    lease_ = absl::Milliseconds(std::max<int64_t>(0, r.lease_ms()));
    heard_from_ = std::max(heard_from_, asked_at);
    if (assignment_.member_id != 0 && r.generation() > assignment_.generation) {
      return;
    }
    assignment_.member_id = r.member_id();
    assignment_.standby = r.role() == ROLE_STANDBY;
    assignment_.slot = r.slot();
    assignment_.generation = r.generation();
    assignment_.world_size = r.world_size();
    assignment_.committed_step = r.committed_step();
    assignment_.skip_data = SkipList(r.skip_data());
  }

  // Keeps the channel alive until the process exits. Under a thread limit
  // gRPC's own threads may not have started either, and tearing the
  // channel down then waits forever for them (seen with gRPC 1.51): a
  // member whose thread could not start must return its error or let its
  // process exit, not hang.
  void ParkStub() {
    static absl::Mutex mu(absl::kConstInit);
    static auto* const parked =
        new std::vector<std::unique_ptr<Controller::Stub>>();
    absl::MutexLock lock(&mu);
    parked->push_back(std::move(stub_));
  }

  // Says goodbye on a stream of its own, on the calling thread (no reader:
  // it writes, closes its side and drains until the controller finishes).
  void LeaveInline() {
    auto ctx = TokenContext(options_.client.token,
                            absl::Now() + options_.client.rpc_slack);
    auto stream = stub_->Heartbeat(ctx.get());
    HeartbeatRequest req;
    {
      absl::MutexLock lock(&mu_);
      req.set_member_id(assignment_.member_id);
      req.set_generation(assignment_.generation);
    }
    req.set_leaving(true);
    if (stream->Write(req)) stream->WritesDone();
    HeartbeatResponse msg;
    while (stream->Read(&msg)) {
    }
    (void)stream->Finish();
  }

  // The heartbeat thread: one stream at a time; reconnects until fenced or
  // told to leave.
  void Run() {
    absl::Duration backoff = options_.reconnect_min;
    absl::BitGen rng;
    // Waits the back-off (with jitter) and doubles it; false if told to
    // leave meanwhile.
    auto back_off = [&]() {
      const absl::Duration wait = backoff * (1 + absl::Uniform(rng, 0.0, 0.5));
      backoff = std::min(backoff * 2, options_.reconnect_max);
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), wait);
      return !stop_;
    };
    for (;;) {
      const absl::Status ended = RunStream();
      if (Stopping()) return;
      if (IsFinal(ended.code())) {
        Fence(ended);
        return;
      }
      if (ended.code() == absl::StatusCode::kResourceExhausted) {
        // The stream could not start its reader: the controller still has
        // us, so no Resume; the stream is tried again with a growing
        // back-off (while the controller hears nothing and may declare us
        // dead, which the next stream that runs learns). health() says
        // why meanwhile.
        HOLDFAST_LOG_WARN("member {}: {}", assignment().member_id,
                          std::string(ended.message()));
        SetHealth(ended);
        if (!back_off()) return;
        continue;
      }
      SetHealth(absl::UnavailableError(
          absl::StrCat("controller at ", options_.client.address,
                       " unreachable: ", ended.message())));
      // Resume with back-off until the controller takes us back.
      for (;;) {
        if (!back_off()) return;
        absl::Status s = Resume();
        if (Stopping()) return;
        if (s.ok()) break;
        if (IsFinal(s.code())) {
          Fence(s);
          return;
        }
      }
      backoff = options_.reconnect_min;
      int n;
      {
        absl::MutexLock lock(&mu_);
        health_ = absl::OkStatus();
        n = ++reconnects_;
        // The asks on the broken stream are lost: the first beat on the
        // new one asks again, so the lease is renewed within a round trip
        // (a controller that failed over, or restarted).
        last_ask_ = absl::InfinitePast();
        report_now_ = true;
        // So is an ack the old stream carried to a controller that died
        // before it counted it (a restart, a failover): sent again unless
        // committed, or a newer one waits, so commits go on.
        if (!ack_.has_value() && sent_ack_.has_value() &&
            sent_ack_->step() > assignment_.committed_step) {
          ack_ = sent_ack_;
        }
      }
      HOLDFAST_LOG_INFO("member {}: heartbeat stream back (reconnect {})",
                        assignment().member_id, n);
      if (callbacks_.on_reconnected) callbacks_.on_reconnected(n);
    }
  }

  absl::Status Resume() {
    RegisterRequest req = register_;
    const Assignment a = assignment();
    req.set_resume(true);
    req.set_member_id(a.member_id);
    req.set_slot(a.standby ? -1 : a.slot);
    req.set_generation(a.generation);
    req.set_world_size(a.world_size);
    RegisterResponse resp;
    const absl::Time asked_at = absl::Now();
    auto ctx =
        TokenContext(options_.client.token, asked_at + options_.reconnect_max +
                                                options_.client.rpc_slack);
    ctx->set_wait_for_ready(true);
    {
      // Leave() cancels it: it waits for a controller that may be gone.
      absl::MutexLock lock(&mu_);
      if (stop_) return absl::CancelledError("leaving");
      resume_ctx_ = ctx.get();
    }
    absl::Status s =
        FromGrpc(stub_->Register(ctx.get(), req, &resp), "Register");
    {
      absl::MutexLock lock(&mu_);
      resume_ctx_ = nullptr;
    }
    if (s.ok()) s = CheckEpoch(resp.epoch());
    if (s.ok()) Adopt(resp, asked_at);
    return s;
  }

  // Waits until `next`, or until there is something to send, and fills
  // `req`: the report, a lease renewal when one is due, a checkpoint ack,
  // and the collective the trainer is in. False when the stream broke
  // meanwhile.
  bool NextRequest(absl::Time next, HeartbeatRequest* req) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || broken_ || step_end_ || report_now_ || ack_.has_value();
      };
      mu_.AwaitWithDeadline(absl::Condition(&ready), next);
      if (broken_) return false;
      const bool leaving = stop_;
      req->set_member_id(assignment_.member_id);
      req->set_generation(assignment_.generation);
      *req->mutable_report() = report_;
      req->mutable_report()->set_step_end(step_end_);
      if (!step_end_) req->mutable_report()->clear_metrics();
      step_end_ = false;
      report_now_ = false;
      req->set_leaving(leaving);
      req->set_finished(leaving && finished_);
      const absl::Time now = absl::Now();
      if (lease_ > absl::ZeroDuration() && !leaving &&
          now - last_ask_ >= RenewEvery() * 0.9) {
        // The ack renews the lease from this send time.
        req->set_seq(++seq_);
        req->set_want_ack(true);
        asked_[seq_] = now;
        if (asked_.size() > 64) asked_.erase(asked_.begin());
        last_ask_ = now;
      }
      if (ack_.has_value()) {
        if (ack_->step() > assignment_.committed_step) {
          *req->mutable_checkpoint_ack() = *ack_;
          sent_ack_ = *ack_;
        }
        ack_.reset();
      }
    }
    if (req->report().phase() == PHASE_COMPUTING &&
        callbacks_.collective_in_progress) {
      const int64_t c = callbacks_.collective_in_progress();
      if (c >= 0) {
        req->mutable_report()->set_phase(PHASE_COLLECTIVE);
        req->mutable_report()->set_collective_seq(c);
      }
    }
    return true;
  }

  // One heartbeat stream, until it breaks (returns why) or we leave.
  absl::Status RunStream() {
    auto ctx = TokenContext(options_.client.token, absl::InfiniteFuture());
    auto stream = stub_->Heartbeat(ctx.get());
    {
      absl::MutexLock lock(&mu_);
      broken_ = false;
      step_end_ = true;  // the first message binds the stream: send it now
    }
    absl::StatusOr<std::thread> started =
        StartThread("the heartbeat stream's reader thread", [&] {
          HeartbeatResponse msg;
          while (stream->Read(&msg) && Dispatch(msg)) {
          }
          absl::MutexLock lock(&mu_);
          broken_ = true;
        });
    if (!started.ok()) {
      {
        absl::MutexLock lock(&mu_);
        thread_failed_ = true;
      }
      ctx->TryCancel();
      (void)stream->Finish();
      return started.status();
    }
    std::thread reader = std::move(*started);
    {
      absl::MutexLock lock(&mu_);
      if (health_.code() == absl::StatusCode::kResourceExhausted) {
        health_ = absl::OkStatus();
      }
    }
    absl::Time next = absl::Now();
    for (;;) {
      HeartbeatRequest req;
      if (!NextRequest(next, &req)) break;
      const bool leaving = req.leaving();
      if (!stream->Write(req)) {
        // The ack goes with the next stream (unless a newer one waits).
        absl::MutexLock lock(&mu_);
        if (req.has_checkpoint_ack() && !ack_.has_value()) {
          ack_ = req.checkpoint_ack();
        }
        break;
      }
      if (leaving) {
        stream->WritesDone();
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&broken_), absl::Seconds(2));
        break;
      }
      {
        absl::MutexLock lock(&mu_);
        next = absl::Now() + std::min(interval_, RenewEvery());
      }
    }
    ctx->TryCancel();  // a no-op once the server has finished the stream
    reader.join();
    return FromGrpc(stream->Finish(), "Heartbeat");
  }

  // Unavailable for a controller whose epoch is below one this member has
  // seen: a deposed leader, whose orders are refused (the member waits for
  // the current leader, as for a restarted controller).
  absl::Status CheckEpoch(int64_t epoch) {
    absl::MutexLock lock(&mu_);
    if (epoch >= epoch_) return absl::OkStatus();
    const std::string why = absl::StrCat(
        "controller at ", options_.client.address, " has epoch ", epoch,
        ", below ", epoch_, ": a deposed leader; its orders are refused");
    HOLDFAST_LOG_WARN("member {}: {}", assignment_.member_id, why);
    return absl::UnavailableError(why);
  }

  // Acts on one message of the stream; false (and nothing done) for one
  // from a deposed leader, which ends the stream.
  bool Dispatch(const HeartbeatResponse& msg) {
    if (msg.has_epoch() && !CheckEpoch(msg.epoch()).ok()) return false;
    {
      absl::MutexLock lock(&mu_);
      if (msg.has_ack_seq()) {
        // The controller had this heartbeat, and every one before it.
        auto it = asked_.upper_bound(msg.ack_seq());
        if (it != asked_.begin()) {
          heard_from_ = std::max(heard_from_, std::prev(it)->second);
          asked_.erase(asked_.begin(), it);
        }
      }
      if (msg.has_membership()) {
        const MembershipUpdate& u = msg.membership();
        assignment_.generation = u.generation();
        assignment_.world_size = u.world_size();
        assignment_.standby = u.role() == ROLE_STANDBY;
        assignment_.slot = u.slot();
        // A rollback abandons the newer commits.
        assignment_.committed_step =
            u.rollback()
                ? u.committed_step()
                : std::max(assignment_.committed_step, u.committed_step());
        assignment_.skip_data = SkipList(u.skip_data());
        // Answer at once: the controller tells a member that heard of a
        // new generation from one that does not answer.
        report_now_ = true;
      }
      if (msg.has_committed_step()) {
        assignment_.committed_step =
            std::max(assignment_.committed_step, msg.committed_step());
      }
    }
    if (msg.has_abort() && callbacks_.on_abort)
      callbacks_.on_abort(msg.abort());
    if (msg.has_membership() && callbacks_.on_membership) {
      callbacks_.on_membership(msg.membership());
    }
    if (msg.has_committed_step() && callbacks_.on_committed) {
      callbacks_.on_committed(msg.committed_step());
    }
    if (msg.has_job_end() && callbacks_.on_job_end) {
      callbacks_.on_job_end(msg.job_end());
    }
    return true;
  }

  void Fence(const absl::Status& why) {
    HOLDFAST_LOG_WARN("member {}: {}", assignment().member_id,
                      std::string(why.message()));
    SetHealth(why);
    if (callbacks_.on_fenced) callbacks_.on_fenced(why);
  }

  void SetHealth(absl::Status s) {
    absl::MutexLock lock(&mu_);
    health_ = std::move(s);
  }

  // How often the lease is renewed: four times per lease (and never
  // more often than every 10 ms).
  absl::Duration RenewEvery() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (lease_ <= absl::ZeroDuration()) return absl::InfiniteDuration();
    return std::max(lease_ / 4, absl::Milliseconds(10));
  }

  bool Stopping() const {
    absl::MutexLock lock(&mu_);
    return stop_;
  }

  const MemberOptions options_;
  const MemberCallbacks callbacks_;
  std::unique_ptr<Controller::Stub> stub_;
  const RegisterRequest register_;
  absl::Duration interval_;

  mutable absl::Mutex mu_;
  Assignment assignment_ ABSL_GUARDED_BY(mu_);
  StepReport report_ ABSL_GUARDED_BY(mu_);
  bool step_end_ ABSL_GUARDED_BY(mu_) = false;
  // Send a report now (a rendezvous reached, a generation heard of).
  bool report_now_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The Register call of a reconnect in flight, if any.
  grpc::ClientContext* resume_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // A checkpoint ack for the next message on the stream.
  std::optional<CheckpointAck> ack_ ABSL_GUARDED_BY(mu_);
  // The newest ack written to a stream (sent again after a reconnect).
  std::optional<CheckpointAck> sent_ack_ ABSL_GUARDED_BY(mu_);
  // A thread of ours could not start: see ParkStub.
  bool thread_failed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  int reconnects_ ABSL_GUARDED_BY(mu_) = 0;
  // The lease (zero: none), and the send time of the newest message the
  // controller is known to have had: a Register it answered, or a
  // heartbeat it acked. It cannot declare this member silent before that
  // plus its silence threshold, which is longer than the lease.
  absl::Duration lease_ ABSL_GUARDED_BY(mu_);
  absl::Time heard_from_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The highest controller epoch seen (RegisterResponse.epoch).
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Heartbeats that asked for an ack: seq -> send time.
  std::map<uint64_t, absl::Time> asked_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_ask_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread worker_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemberClient>> MemberClient::Join(
    const MemberOptions& given, MemberCallbacks callbacks) {
  MemberOptions options = given;
  options.reconnect_max =
      ReconnectCap(options.client.address, options.reconnect_max);
  options.reconnect_min =
      std::min(options.reconnect_min, options.reconnect_max);
  if (options.client.address.empty()) {
    return absl::InvalidArgumentError("member: empty controller address");
  }
  if (options.client.token.empty()) {
    return absl::InvalidArgumentError("member: empty job token");
  }
  if (options.heartbeat_interval < absl::ZeroDuration() ||
      options.reconnect_min <= absl::ZeroDuration() ||
      options.reconnect_max < options.reconnect_min) {
    return absl::InvalidArgumentError(
        "member: heartbeat interval must be >= 0 and 0 < reconnect_min <= "
        "reconnect_max");
  }
  RegisterRequest req;
  if (options.host.empty()) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    req.set_host(name);
  } else {
    req.set_host(options.host);
  }
  const ProcessIdentity me = SelfIdentity();
  req.set_pid(me.pid);
  req.set_process_start(me.start);
  req.set_host_key(me.host_key);
  req.set_failure_domain(
      options.failure_domain.empty() ? req.host() : options.failure_domain);
  req.set_topology_block(options.topology_block);
  if (options.preferred_slot.has_value()) {
    req.set_preferred_slot(*options.preferred_slot);
  }
  auto channel = ControllerChannel(options.client.address, options.client.tls);
  const absl::Time asked_at = absl::Now();
  HOLDFAST_RETURN_IF_ERROR(AwaitChannel(channel, options.client.address,
                                        options.client.tls.has_value(),
                                        asked_at + options.connect_timeout));
  auto stub = Controller::NewStub(channel);
  RegisterResponse resp;
  auto ctx =
      TokenContext(options.client.token, asked_at + options.connect_timeout);
  ctx->set_wait_for_ready(true);
  grpc::Status s = stub->Register(ctx.get(), req, &resp);
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::UnavailableError(absl::StrCat(
        "member: no controller answered at ", options.client.address,
        " within ", absl::FormatDuration(options.connect_timeout)));
  }
  if (!s.ok()) {
    return ExplainTls(FromGrpc(s, "Register"), options.client.address,
                      options.client.tls.has_value());
  }
  auto client = std::make_unique<MemberClientImpl>(
      options, std::move(callbacks), std::move(stub), std::move(req), resp,
      asked_at);
  HOLDFAST_RETURN_IF_ERROR(client->Start());
  return std::unique_ptr<MemberClient>(std::move(client));
}

}  // namespace holdfast::control
