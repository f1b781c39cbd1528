#include "src/runtime/runtime_impl.h"

#include "absl/strings/str_cat.h"
#include "holdfast/status.h"
#include "src/backend/backend.h"
#include "src/common/logging.h"
#include "src/common/status_util.h"
#include "src/common/thread_util.h"

namespace holdfast {

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

absl::Status RuntimeImpl::AwaitSlot(const RunOptions& options) {
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
    if (options.standby_warmup) {
      const absl::Time w0 = absl::Now();
      const absl::Status trainer = options.standby_warmup();
      if (!trainer.ok()) {
        HOLDFAST_LOG_WARN(
            "runtime: standby: the trainer's warm-up failed after {} (it "
            "waits for a slot all the same): {}",
            absl::FormatDuration(absl::Now() - w0), trainer.ToString());
      } else {
        HOLDFAST_LOG_INFO("runtime: standby: the trainer's warm-up took {}",
                          absl::FormatDuration(absl::Now() - w0));
      }
    }
    HOLDFAST_LOG_INFO("runtime: standby, waiting for a slot");
  }
  return gens_.AwaitSlot();
}

bool RuntimeImpl::AwaitRoundEnd(int64_t s, int64_t gen, absl::Time deadline) {
  return gens_.AwaitRoundEnd(s, gen, deadline);
}

}  // namespace holdfast
