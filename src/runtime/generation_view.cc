#include "src/runtime/generation_view.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace holdfast {

void GenerationView::Join(const control::Assignment& a) {
  absl::MutexLock lock(&mu_);
  view_.generation = std::max(view_.generation, a.generation);
  if (view_.generation == a.generation) {
    view_.slot = a.slot;
    view_.world = a.world_size;
    view_.standby = a.standby;
  }
  committed_ = std::max(committed_, a.committed_step);
  job_skip_ = a.skip_data;
}

bool GenerationView::Update(const control::MembershipUpdate& u) {
  absl::MutexLock lock(&mu_);
  if (u.generation() < view_.generation) return false;
  view_.generation = u.generation();
  view_.slot = u.slot();
  view_.world = u.world_size();
  view_.standby = u.role() == control::ROLE_STANDBY;
  // A rollback abandons the newer commits.
  view_.rollback_to = u.rollback() ? u.committed_step() : -1;
  committed_ = u.rollback() ? u.committed_step()
                            : std::max(committed_, u.committed_step());
  job_skip_ = control::SkipList(u.skip_data());
  return true;
}

void GenerationView::NoteCommitted(int64_t c) {
  absl::MutexLock lock(&mu_);
  committed_ = std::max(committed_, c);
}

void GenerationView::SetCommitted(int64_t step) {
  absl::MutexLock lock(&mu_);
  committed_ = step;
}

void GenerationView::Fence(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  fenced_ = why;
}

void GenerationView::EndJob(const control::JobEnd& end) {
  absl::MutexLock lock(&mu_);
  job_end_ = end;
}

GenerationView::View GenerationView::Current() const {
  absl::MutexLock lock(&mu_);
  return view_;
}

int64_t GenerationView::committed() const {
  absl::MutexLock lock(&mu_);
  return committed_;
}

absl::Status GenerationView::Stopped() const {
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

std::optional<std::string> GenerationView::RendezvousAbandoned(
    int64_t gen) const {
  absl::MutexLock lock(&mu_);
  if (view_.generation > gen) {
    return absl::StrCat("rendezvous of generation ", gen,
                        " abandoned: generation ", view_.generation, " opened");
  }
  if (!fenced_.ok()) return std::string("fenced");
  if (job_end_.has_value()) return std::string("the job ended");
  if (stopping_()) return std::string("the runtime is shutting down");
  return std::nullopt;
}

std::vector<std::pair<int64_t, int64_t>> GenerationView::JobSkip() const {
  absl::MutexLock lock(&mu_);
  return job_skip_;
}

int64_t GenerationView::CommGeneration() const {
  absl::MutexLock lock(&mu_);
  return comm_generation_;
}

bool GenerationView::Moved() const {
  absl::MutexLock lock(&mu_);
  return view_.generation > comm_generation_;
}

absl::Status GenerationView::CommHealth() const {
  absl::MutexLock lock(&mu_);
  return comm_ != nullptr ? comm_->health()
                          : absl::AbortedError("no communicator");
}

Communicator* GenerationView::Comm() const {
  absl::MutexLock lock(&mu_);
  return comm_.get();
}

std::shared_ptr<Communicator> GenerationView::SharedComm() const {
  absl::MutexLock lock(&mu_);
  return comm_;
}

Communicator* GenerationView::CurrentHealthyComm() const {
  absl::MutexLock lock(&mu_);
  if (comm_ != nullptr && comm_generation_ == view_.generation &&
      comm_->health().ok()) {
    return comm_.get();
  }
  return nullptr;
}

absl::StatusOr<Communicator*> GenerationView::HostComm() const {
  absl::MutexLock lock(&mu_);
  Communicator* c = comm_.get();
  if (exchanges_on_side_ ||
      (c != nullptr && c->memory() != MemoryKind::kHost)) {
    c = side_generation_ == comm_generation_ ? side_.get() : nullptr;
  }
  if (c == nullptr) {
    return absl::AbortedError(
        "runtime: no communicator of this generation for the runtime's own "
        "exchanges");
  }
  return c;
}

std::shared_ptr<Communicator> GenerationView::BeginComm(
    int64_t gen, bool exchanges_on_side) {
  absl::MutexLock lock(&mu_);
  comm_generation_ = gen;
  exchanges_on_side_ = exchanges_on_side;
  return std::move(comm_);
}

void GenerationView::SetComm(int64_t gen, std::shared_ptr<Communicator> comm) {
  absl::MutexLock lock(&mu_);
  comm_ = std::move(comm);
  comm_generation_ = gen;
  // An order that arrived while building applies now.
  if (view_.generation > gen) comm_->Abort("a newer generation opened");
}

GenerationView::Comms GenerationView::BeginSide(int64_t gen) {
  absl::MutexLock lock(&mu_);
  side_generation_ = gen;
  Comms old;
  old.side = std::move(side_);
  old.links = std::move(links_);
  return old;
}

absl::Status GenerationView::SetLinks(int64_t gen,
                                      std::shared_ptr<bulk::Links> links) {
  absl::MutexLock lock(&mu_);
  if (view_.generation > gen) {
    return absl::AbortedError("a newer generation opened");
  }
  links_ = std::move(links);  // Abort() reaches it from here on
  return absl::OkStatus();
}

void GenerationView::SetSide(int64_t gen, std::shared_ptr<Communicator> side) {
  absl::MutexLock lock(&mu_);
  side_ = std::move(side);
  if (view_.generation > gen) side_->Abort("a newer generation opened");
}

absl::StatusOr<GenerationView::SideChannel> GenerationView::Side(
    int64_t gen) const {
  absl::MutexLock lock(&mu_);
  if (side_generation_ != gen || side_ == nullptr || links_ == nullptr) {
    return absl::AbortedError(
        absl::StrCat("no side communicator of generation ", gen));
  }
  absl::Status health = side_->health();
  if (!health.ok()) return health;
  return SideChannel{side_, links_};
}

void GenerationView::Abort(int64_t upto, absl::string_view reason) {
  Comms doomed;
  {
    absl::MutexLock lock(&mu_);
    if (comm_generation_ <= upto) doomed.comm = comm_;
    if (side_generation_ <= upto) {
      doomed.side = side_;
      doomed.links = links_;
    }
  }
  // Outside mu_: a communicator's abort leaves a notice in the store (a
  // round trip to the controller, tens of ms while every member is
  // recovering), and the training thread reads the generation under mu_
  // on its way into a recovery.
  if (doomed.comm != nullptr) doomed.comm->Abort(reason);
  if (doomed.side != nullptr) doomed.side->Abort(reason);
  if (doomed.links != nullptr) doomed.links->Abort(reason);
}

GenerationView::Comms GenerationView::TakeAll() {
  absl::MutexLock lock(&mu_);
  Comms out;
  out.comm = std::move(comm_);
  out.side = std::move(side_);
  return out;
}

bool GenerationView::AwaitCommitted(int64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return committed_ >= step || !GoesOnLocked(comm_generation_) ||
           (comm_ != nullptr && !comm_->health().ok());
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  return committed_ >= step;
}

bool GenerationView::AwaitGeneration(int64_t failed, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !GoesOnLocked(failed);
  };
  return mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
}

absl::Status GenerationView::AwaitSlot() {
  {
    absl::MutexLock lock(&mu_);
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

bool GenerationView::AwaitRoundEnd(int64_t s, int64_t gen,
                                   absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return committed_ >= s || !GoesOnLocked(gen) || stopping_();
  };
  return mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
}

void GenerationView::AwaitStopped(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !MayGoOnLocked();
  };
  mu_.AwaitWithDeadline(absl::Condition(&stopped), deadline);
}

void GenerationView::Wake() {
  // Conditions are evaluated again when mu_ is released.
  absl::MutexLock lock(&mu_);
}

bool GenerationView::MayGoOnLocked() const {
  return fenced_.ok() && !job_end_.has_value();
}

bool GenerationView::GoesOnLocked(int64_t gen) const {
  return view_.generation <= gen && MayGoOnLocked();
}

}  // namespace holdfast
