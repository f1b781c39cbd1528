#include "src/comm/work_impl.h"

#include "absl/strings/str_cat.h"

namespace holdfast::comm {

std::shared_ptr<WorkImpl> WorkImpl::Done(uint64_t seq, absl::Status status,
                                         std::function<void(void*)> on_queued) {
  auto work = std::make_shared<WorkImpl>(seq);
  work->SetOnQueued(std::move(on_queued));
  work->Finish(std::move(status));
  return work;
}

bool WorkImpl::IsCompleted() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

absl::Status WorkImpl::Wait(absl::Duration timeout) {
  // Only an unbounded wait may run the op here: a bounded one must return
  // at its timeout, which an op running on this thread could outlast.
  if (runner_ != nullptr && timeout == absl::InfiniteDuration() &&
      !IsCompleted()) {
    absl::ReaderMutexLock lock(&runner_->mu);
    if (runner_->runner != nullptr) runner_->runner->RunInline(seq_);
  }
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "Work::Wait for op seq=", seq_, " gave up after ",
        absl::FormatDuration(timeout),
        "; the operation is still in flight under its own deadline"));
  }
  return status_;
}

void WorkImpl::SetOnQueued(std::function<void(void*)> on_queued) {
  absl::MutexLock lock(&queued_mu_);
  on_queued_ = std::move(on_queued);
}

void WorkImpl::Queued(void* stream) {
  std::function<void(void*)> fn;
  {
    absl::MutexLock lock(&queued_mu_);
    fn.swap(on_queued_);
  }
  if (fn) fn(stream);
}

void WorkImpl::Finish(absl::Status status) {
  Queued(nullptr);
  absl::MutexLock lock(&mu_);
  if (done_) return;
  status_ = std::move(status);
  done_ = true;
}

}  // namespace holdfast::comm
