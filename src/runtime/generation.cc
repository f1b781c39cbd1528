#include "src/runtime/runtime_impl.h"

#include "absl/strings/str_cat.h"
#include "holdfast/status.h"
#include "src/common/logging.h"
#include "src/common/status_util.h"
#include "src/common/thread_util.h"

namespace holdfast {

RuntimeImpl::View RuntimeImpl::CurrentView() const {
  absl::MutexLock lock(&mu_);
  return view_;
}

int64_t RuntimeImpl::CommGeneration() const {
  absl::MutexLock lock(&mu_);
  return comm_generation_;
}

bool RuntimeImpl::GenerationMoved() const {
  absl::MutexLock lock(&mu_);
  return view_.generation > comm_generation_;
}

absl::Status RuntimeImpl::CommHealth() const {
  absl::MutexLock lock(&mu_);
  return comm_ != nullptr ? comm_->health()
                          : absl::AbortedError("no communicator");
}

Communicator* RuntimeImpl::CurrentComm() {
  absl::MutexLock lock(&mu_);
  return comm_.get();
}

std::shared_ptr<Communicator> RuntimeImpl::SharedComm() const {
  absl::MutexLock lock(&mu_);
  return comm_;
}

int64_t RuntimeImpl::CollectiveInProgress() const {
  const std::shared_ptr<Communicator> comm = SharedComm();
  if (comm == nullptr) return -1;
  const std::vector<TraceRecord> ops = comm->TraceSnapshot();
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    if (!IsCollective(it->op) || it->state == OpState::kEnqueued) continue;
    return it->state == OpState::kStarted ? it->coll_seq : -1;
  }
  return -1;
}

absl::Duration RuntimeImpl::CollectiveTimeSinceLastStep() {
  const std::shared_ptr<Communicator> comm = SharedComm();
  if (comm == nullptr) return absl::ZeroDuration();
  if (comm->generation() != timed_generation_) {
    timed_generation_ = comm->generation();
    timed_seq_ = 0;
  }
  int64_t ns = 0;
  const uint64_t from = timed_seq_;
  for (const TraceRecord& r : comm->TraceSnapshot()) {
    if (r.seq < from || !IsCollective(r.op) || r.state != OpState::kCompleted ||
        r.started_ns <= 0) {
      continue;
    }
    ns += std::max<int64_t>(0, r.ended_ns - r.started_ns);
    timed_seq_ = std::max(timed_seq_, r.seq + 1);
  }
  return absl::Nanoseconds(ns);
}

absl::StatusOr<Communicator*> RuntimeImpl::HostComm() {
  absl::MutexLock lock(&mu_);
  Communicator* c = comm_.get();
  if (c != nullptr && c->memory() != MemoryKind::kHost) {
    c = side_generation_ == comm_generation_ ? side_.get() : nullptr;
  }
  if (c == nullptr) {
    return absl::AbortedError(
        "runtime: no communicator of this generation for the runtime's own "
        "exchanges");
  }
  return c;
}

void RuntimeImpl::OnMembership(const MembershipUpdate& u) {
  {
    absl::MutexLock lock(&mu_);
    if (u.generation() < view_.generation) return;
    view_.generation = u.generation();
    view_.slot = u.slot();
    view_.world = u.world_size();
    view_.standby = u.role() == control::ROLE_STANDBY;
    // A rollback abandons the newer commits.
    view_.rollback_to = u.rollback() ? u.committed_step() : -1;
    committed_ = u.rollback() ? u.committed_step()
                              : std::max(committed_, u.committed_step());
    job_skip_ = control::SkipList(u.skip_data());
  }
  snapshots_.EndGeneration(u.generation());
  AbortComm(u.generation() - 1,
            absl::StrCat("generation ", u.generation(), " opened"));
}

void RuntimeImpl::NoteCommitted(int64_t c) {
  absl::MutexLock lock(&mu_);
  committed_ = std::max(committed_, c);
}

void RuntimeImpl::AbortComm(int64_t upto, absl::string_view reason) {
  std::shared_ptr<Communicator> comm, side;
  std::shared_ptr<bulk::Links> links;
  {
    absl::MutexLock lock(&mu_);
    if (comm_generation_ <= upto) comm = comm_;
    if (side_generation_ <= upto) {
      side = side_;
      links = links_;
    }
  }
  // Outside mu_: a communicator's abort leaves a notice in the store (a
  // round trip to the controller, tens of ms while every member is
  // recovering), and the training thread reads the generation under
  // mu_ on its way into Recover.
  if (comm != nullptr) comm->Abort(reason);
  if (side != nullptr) side->Abort(reason);
  if (links != nullptr) links->Abort(reason);
}

void RuntimeImpl::QueueAbort(int64_t upto, std::string reason) {
  {
    absl::MutexLock lock(&abort_mu_);
    if (abort_stop_) return;
    if (aborter_.joinable()) {
      aborts_.emplace_back(upto, std::move(reason));
      return;
    }
    absl::StatusOr<std::thread> t =
        StartThread("the abort thread", [this] { AbortLoop(); });
    if (t.ok()) {
      aborter_ = std::move(*t);
      aborts_.emplace_back(upto, std::move(reason));
      return;
    }
    // No thread (a pids limit): the abort runs here, on the client's
    // thread, below; slower to hand over the next generation, but it
    // happens.
  }
  AbortComm(upto, reason);
}

void RuntimeImpl::AbortLoop() {
  for (;;) {
    std::pair<int64_t, std::string> next;
    {
      absl::MutexLock lock(&abort_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(abort_mu_) {
        return !aborts_.empty() || abort_stop_;
      };
      abort_mu_.Await(absl::Condition(&ready));
      if (aborts_.empty()) return;
      next = std::move(aborts_.front());
      aborts_.pop_front();
    }
    AbortComm(next.first, next.second);
  }
}

int RuntimeImpl::AbsentPeer(const absl::Status& s) const {
  if (s.code() != absl::StatusCode::kDeadlineExceeded) return -1;
  const int r = GetAbsent(s).value_or(-1);
  return r == slot() ? -1 : r;
}

std::vector<int> RuntimeImpl::UnreachablePeers(const absl::Status& s) const {
  std::vector<int> out;
  for (int r : GetUnreachable(s)) {
    if (r >= 0 && r != slot()) out.push_back(r);
  }
  return out;
}

void RuntimeImpl::ReportUnreachable(const std::vector<int>& peers,
                                    const std::string& why, int64_t gen) {
  if (peers.empty()) return;
  absl::StatusOr<bool> r = member_->ReportUnreachable(peers, why, gen);
  if (!r.ok() && r.status().code() != absl::StatusCode::kFailedPrecondition) {
    HOLDFAST_LOG_WARN("runtime: reporting unreachable peers: {}",
                      std::string(r.status().message()));
  }
}

void RuntimeImpl::ReportBroken(const std::string& why, int peer, int64_t gen,
                               const std::vector<int>& unreachable) {
  if (gen < 0) gen = CurrentView().generation;
  absl::StatusOr<bool> r = member_->ReportFailure(peer, why, gen, unreachable);
  if (!r.ok() && r.status().code() != absl::StatusCode::kFailedPrecondition) {
    HOLDFAST_LOG_WARN("runtime: reporting the failure: {}",
                      std::string(r.status().message()));
  }
}

absl::Status RuntimeImpl::Stopped() const {
  absl::MutexLock lock(&mu_);
  if (!fenced_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this member was declared dead and is fenced; it must "
                     "not rejoin with its state (",
                     fenced_.message(), ")"));
  }
  if (job_end_.has_value()) {
    return absl::AbortedError(
        absl::StrCat("the job ",
                     job_end_->state() == control::JOB_STOPPED
                         ? "stopped: "
                         : "ended without this member: ",
                     job_end_->reason()));
  }
  return absl::OkStatus();
}

absl::Status RuntimeImpl::AwaitLease(int64_t step) {
  const absl::Duration lease = member_->lease();
  if (lease <= absl::ZeroDuration()) return absl::OkStatus();
  const absl::Time since = absl::Now();
  const absl::Duration unheard = member_->Unheard(since);
  if (unheard < lease) return absl::OkStatus();
  HOLDFAST_LOG_WARN(
      "runtime: slot {}: no word from the controller for {} (lease {}): "
      "step {} does not complete until it answers (a member cut off from "
      "it may be declared lost, and must not go on)",
      slot(), absl::FormatDuration(unheard), absl::FormatDuration(lease), step);
  for (;;) {
    HOLDFAST_RETURN_IF_ERROR(Stopped());
    if (GenerationMoved()) {
      return absl::AbortedError("a new generation was opened");
    }
    if (!CommHealthy()) return CommHealth();
    if (member_->Unheard(absl::Now()) < lease) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  HOLDFAST_LOG_INFO(
      "runtime: slot {}: the controller answered again after {}; step {} "
      "completes",
      slot(), absl::FormatDuration(absl::Now() - since), step);
  return absl::OkStatus();
}

bool RuntimeImpl::AwaitCommitted(int64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return committed_ >= step || !GoesOnLocked(comm_generation_) ||
           (comm_ != nullptr && !comm_->health().ok());
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  return committed_ >= step;
}

bool RuntimeImpl::AwaitGeneration(int64_t failed, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !GoesOnLocked(failed);
  };
  return mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
}

absl::Status RuntimeImpl::AwaitSlot() {
  {
    absl::MutexLock lock(&mu_);
    if (view_.standby) {
      HOLDFAST_LOG_INFO("runtime: standby, waiting for a slot");
    }
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !view_.standby || !MayGoOnLocked();
    };
    mu_.Await(absl::Condition(&ready));
    if (!view_.standby) return absl::OkStatus();
    if (job_end_.has_value() && job_end_->state() == control::JOB_FINISHED) {
      return absl::CancelledError(
          absl::StrCat("the job finished without needing this standby (",
                       job_end_->reason(), ")"));
    }
  }
  return Stopped();
}

std::optional<std::string> RuntimeImpl::RendezvousAbandoned(int64_t gen) const {
  absl::MutexLock lock(&mu_);
  if (view_.generation > gen) {
    return absl::StrCat("rendezvous of generation ", gen,
                        " abandoned: generation ", view_.generation, " opened");
  }
  if (!fenced_.ok()) return std::string("fenced");
  if (job_end_.has_value()) return std::string("the job ended");
  if (snapshots_.stopping()) {
    return std::string("the runtime is shutting down");
  }
  return std::nullopt;
}

bool RuntimeImpl::MayGoOnLocked() const {
  return fenced_.ok() && !job_end_.has_value();
}

bool RuntimeImpl::GoesOnLocked(int64_t gen) const {
  return view_.generation <= gen && MayGoOnLocked();
}

bool RuntimeImpl::AwaitRoundEnd(int64_t s, int64_t gen, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return committed_ >= s || !GoesOnLocked(gen) || snapshots_.stopping();
  };
  return mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
}

}  // namespace holdfast
