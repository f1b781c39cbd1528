#include "src/runtime/runtime_impl.h"

#include "absl/strings/str_cat.h"
#include "holdfast/status.h"
#include "src/backend/backend.h"
#include "src/common/logging.h"
#include "src/common/status_util.h"
#include "src/common/thread_util.h"

namespace holdfast {

int64_t RuntimeImpl::CollectiveInProgress() const {
  const std::shared_ptr<Communicator> comm = gens_.SharedComm();
  if (comm == nullptr) return -1;
  const std::vector<TraceRecord> ops = comm->TraceSnapshot();
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    if (!IsCollective(it->op) || it->state == OpState::kEnqueued) continue;
    return it->state == OpState::kStarted ? it->coll_seq : -1;
  }
  return -1;
}

RuntimeImpl::StepCollectives RuntimeImpl::CollectivesSinceLastStep(
    int64_t step_start_ns) {
  const std::shared_ptr<Communicator> comm = gens_.SharedComm();
  if (comm == nullptr) return {};
  if (comm->generation() != timed_generation_) {
    timed_generation_ = comm->generation();
    timed_seq_ = 0;
  }
  int64_t inside_ns = 0, arrival_ns = 0, issued = 0;
  const uint64_t from = timed_seq_;
  for (const TraceRecord& r : comm->TraceSnapshot()) {
    if (r.seq < from || !IsCollective(r.op) || r.state != OpState::kCompleted ||
        r.started_ns <= 0) {
      continue;
    }
    inside_ns += std::max<int64_t>(0, r.ended_ns - r.started_ns);
    timed_seq_ = std::max(timed_seq_, r.seq + 1);
    if (r.enqueued_ns >= step_start_ns) {
      arrival_ns += r.enqueued_ns - step_start_ns;
      ++issued;
    }
  }
  return {absl::Nanoseconds(inside_ns),
          absl::Nanoseconds(issued > 0 ? arrival_ns / issued : 0)};
}

void RuntimeImpl::OnMembership(const MembershipUpdate& u) {
  if (!gens_.Update(u)) return;
  snapshots_.EndGeneration(u.generation());
  gens_.Abort(u.generation() - 1,
              absl::StrCat("generation ", u.generation(), " opened"));
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
    HOLDFAST_RETURN_IF_ERROR(gens_.Stopped());
    if (gens_.Moved()) {
      return absl::AbortedError("a new generation was opened");
    }
    if (absl::Status health = gens_.CommHealth(); !health.ok()) return health;
    if (member_->Unheard(absl::Now()) < lease) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  HOLDFAST_LOG_INFO(
      "runtime: slot {}: the controller answered again after {}; step {} "
      "completes",
      slot(), absl::FormatDuration(absl::Now() - since), step);
  return absl::OkStatus();
}

absl::Status RuntimeImpl::AwaitSlot() {
  if (gens_.Current().standby) {
    // The first communicator of a backend can cost a process more than
    // the next ones (NCCL loads its device code); a standby's would be on
    // the critical path of the recovery it joins, so it pays now.
    const absl::Time t0 = absl::Now();
    const absl::Status warm =
        backend::Warm(options_.comm.backend, options_.comm.device);
    if (!warm.ok()) {
      HOLDFAST_LOG_WARN("runtime: standby: warming up backend {}: {}",
                        options_.comm.backend, warm.ToString());
    } else if (options_.comm.backend == "nccl") {
      HOLDFAST_LOG_INFO("runtime: standby: NCCL warmed up on device {} in {}",
                        options_.comm.device,
                        absl::FormatDuration(absl::Now() - t0));
    }
    HOLDFAST_LOG_INFO("runtime: standby, waiting for a slot");
  }
  return gens_.AwaitSlot();
}

bool RuntimeImpl::AwaitRoundEnd(int64_t s, int64_t gen, absl::Time deadline) {
  return gens_.AwaitRoundEnd(s, gen, deadline);
}

}  // namespace holdfast
