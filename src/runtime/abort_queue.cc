#include "src/runtime/abort_queue.h"

#include "absl/status/statusor.h"
#include "src/common/thread_util.h"

namespace holdfast {

void AbortQueue::Queue(int64_t upto, std::string reason) {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    if (!thread_.joinable()) {
      absl::StatusOr<std::thread> t =
          StartThread("the abort thread", [this] { Loop(); });
      if (t.ok()) thread_ = std::move(*t);
    }
    if (thread_.joinable()) {
      queued_.emplace_back(upto, std::move(reason));
      return;
    }
  }
  abort_(upto, reason);  // no thread: here, after the lock
}

void AbortQueue::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void AbortQueue::Loop() {
  for (;;) {
    std::pair<int64_t, std::string> next;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queued_.empty() || stop_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queued_.empty()) return;  // stopped
      next = std::move(queued_.front());
      queued_.pop_front();
    }
    abort_(next.first, next.second);
  }
}

}  // namespace holdfast
