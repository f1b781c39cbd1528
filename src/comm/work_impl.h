// WorkImpl: the Work handed to callers. Finished exactly once by the
// communicator; waited on by any number of threads.
#ifndef HOLDFAST_SRC_COMM_WORK_IMPL_H_
#define HOLDFAST_SRC_COMM_WORK_IMPL_H_

#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "holdfast/work.h"

namespace holdfast::comm {

// Lets a thread that waits on an op run it itself when the op is next in
// line and nothing else is running: the common `Op(...)->Wait()` then costs
// no thread hand-off. `runner` is cleared (under the writer lock) before the
// communicator goes away, so a Work never calls into a dead communicator.
class InlineRunner {
 public:
  virtual ~InlineRunner() = default;
  virtual void RunInline(uint64_t seq) = 0;
};
struct RunnerHandle {
  absl::Mutex mu;
  InlineRunner* runner ABSL_GUARDED_BY(mu) = nullptr;
};

class WorkImpl final : public Work {
 public:
  explicit WorkImpl(uint64_t seq,
                    std::shared_ptr<RunnerHandle> runner = nullptr)
      : seq_(seq), runner_(std::move(runner)) {}

  // A Work that is already finished with `status` (`on_queued`, if any,
  // called with null).
  static std::shared_ptr<WorkImpl> Done(
      uint64_t seq, absl::Status status,
      std::function<void(void*)> on_queued = nullptr);

  bool IsCompleted() const override;
  absl::Status Wait(absl::Duration timeout) override;
  uint64_t seq() const override { return seq_; }

  // Sets the final status and wakes waiters. Only the first call counts.
  // Calls the op's on_queued with null first if Queued was not called.
  void Finish(absl::Status status);

  // The op's OpOptions::on_queued (may be null); set before the Work is
  // handed out.
  void SetOnQueued(std::function<void(void*)> on_queued);
  // Calls on_queued(stream) unless it was called already.
  void Queued(void* stream);

 private:
  const uint64_t seq_;
  const std::shared_ptr<RunnerHandle> runner_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  // Guards on_queued_ alone: the callback runs with no lock held.
  absl::Mutex queued_mu_;
  std::function<void(void*)> on_queued_ ABSL_GUARDED_BY(queued_mu_);
};

}  // namespace holdfast::comm

#endif  // HOLDFAST_SRC_COMM_WORK_IMPL_H_
