// AbortQueue: the aborts the controller orders, run in order on a thread
// of their own (the abort thread), not on the thread that queues them.
// The member client delivers the next generation right after an abort
// order, and the abort (a notice to the store for each communicator)
// would hold that up.
//
// The rules:
//   - aborts run one at a time, in the order they were queued;
//   - the thread starts with the first abort; where it cannot start (a
//     pids limit) an abort runs on the queuing thread instead: slower to
//     hand over the next generation, but it happens;
//   - after Stop nothing more is queued; Stop waits until what was
//     queued before it has run.
//
// Thread-safe.
#ifndef HOLDFAST_SRC_RUNTIME_ABORT_QUEUE_H_
#define HOLDFAST_SRC_RUNTIME_ABORT_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace holdfast {

class AbortQueue {
 public:
  // `abort(upto, reason)` aborts the communicators of generations up to
  // `upto`; it must be safe to call from any thread.
  using AbortFn = std::function<void(int64_t, const std::string&)>;
  explicit AbortQueue(AbortFn abort) : abort_(std::move(abort)) {}
  ~AbortQueue() { Stop(); }
  AbortQueue(const AbortQueue&) = delete;
  AbortQueue& operator=(const AbortQueue&) = delete;

  void Queue(int64_t upto, std::string reason);
  void Stop();

 private:
  void Loop();

  const AbortFn abort_;
  absl::Mutex mu_;
  std::deque<std::pair<int64_t, std::string>> queued_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // set once, under mu_; joined by Stop
};

}  // namespace holdfast

#endif  // HOLDFAST_SRC_RUNTIME_ABORT_QUEUE_H_
