#include "src/control/wire/member_stream.h"

#include <atomic>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace holdfast::control {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

void MergePush(const HeartbeatResponse& msg, HeartbeatResponse* pending) {
  if (msg.has_membership()) *pending->mutable_membership() = msg.membership();
  if (msg.has_abort()) *pending->mutable_abort() = msg.abort();
  if (msg.has_committed_step() &&
      (!pending->has_committed_step() ||
       msg.committed_step() > pending->committed_step())) {
    pending->set_committed_step(msg.committed_step());
  }
  if (msg.has_ack_seq()) pending->set_ack_seq(msg.ack_seq());
  if (msg.has_job_end()) *pending->mutable_job_end() = msg.job_end();
  if (msg.has_epoch() && msg.epoch() > pending->epoch()) {
    pending->set_epoch(msg.epoch());
  }
}

namespace {

class MemberStream final
    : public grpc::ServerBidiReactor<HeartbeatRequest, HeartbeatResponse>,
      public MemberSink {
 public:
  MemberStream(BeatHandler* handler, bool authorized, int64_t epoch)
      : handler_(handler), epoch_(epoch) {
    if (!authorized) {
      CloseStream(absl::UnauthenticatedError("missing or wrong job token"));
      return;
    }
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The member closed its side, or the connection broke.
      Gone(leaving_ ? "left" : "stream ended without a goodbye");
      Close(absl::OkStatus());
      return;
    }
    // The id is set before the handler sees the message, so that a
    // message that binds the stream and then fails (a bad checkpoint ack)
    // still unbinds it below.
    absl::Status s;
    if (member_id_ != 0 && req_.member_id() != member_id_) {
      s = absl::InvalidArgumentError(
          absl::StrCat("member ", req_.member_id(), " on the stream of member ",
                       member_id_.load(), " (one stream carries one member)"));
    } else {
      member_id_ = req_.member_id();
      s = handler_->OnBeat(req_, this);
    }
    if (!s.ok()) {
      Gone(absl::StrCat("bad heartbeat: ", s.message()));
      Close(s);
      return;
    }
    if (req_.leaving()) {
      finished_ = req_.finished();
      leaving_ = true;
    }
    StartRead(&req_);
  }

  void OnCancel() override { Gone("connection lost"); }

  void OnWriteDone(bool ok) override {
    std::optional<absl::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (finish_pending_) {
        finish_pending_ = false;
        finish = finish_status_;
      } else if (!ok || !TakePendingLocked()) {
        return;  // a broken stream shows on the read side
      } else {
        writing_ = true;
      }
    }
    if (finish.has_value()) {
      Finish(ToGrpcStatus(*finish));
      return;
    }
    StartWrite(&out_);
  }

  void OnDone() override {
    Gone("stream done");
    delete this;
  }

  void Push(const HeartbeatResponse& msg) override {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      MergePush(msg, &pending_);
      if (epoch_ > 0) pending_.set_epoch(epoch_);
      has_pending_ = true;
      if (writing_ || !TakePendingLocked()) return;
      writing_ = true;
    }
    StartWrite(&out_);
  }

  void Close(const absl::Status& status) override { CloseStream(status); }

  bool Closed() const override {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  void CloseStream(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = true;
      gone_ = true;  // whoever closes drops the sink
      if (writing_) {
        finish_pending_ = true;
        finish_status_ = status;
        return;
      }
    }
    Finish(ToGrpcStatus(status));
  }

  // Moves pending_ into out_ for the next write; false if nothing pends.
  bool TakePendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!has_pending_) return false;
    out_.Clear();
    out_.Swap(&pending_);
    has_pending_ = false;
    return true;
  }

  void Gone(absl::string_view why) {
    {
      absl::MutexLock lock(&mu_);
      if (gone_) return;
      gone_ = true;
    }
    if (member_id_ != 0) {
      handler_->OnGone(member_id_, this, leaving_, finished_, why);
    }
  }

  BeatHandler* const handler_;
  const int64_t epoch_;   // stamped on every write when > 0
  HeartbeatRequest req_;  // read side only
  // Set by the read side, read by OnCancel too.
  std::atomic<uint64_t> member_id_{0};
  std::atomic<bool> leaving_{false};
  std::atomic<bool> finished_{false};

  mutable absl::Mutex mu_;
  HeartbeatResponse pending_ ABSL_GUARDED_BY(mu_);
  bool has_pending_ ABSL_GUARDED_BY(mu_) = false;
  HeartbeatResponse out_;  // owned by the one write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_pending_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerBidiReactor<HeartbeatRequest, HeartbeatResponse>* NewMemberStream(
    BeatHandler* handler, bool authorized, int64_t epoch) {
  return new MemberStream(handler, authorized, epoch);
}

}  // namespace holdfast::control
