// The controller's key-value store for rendezvous: Set/Get, counters (Add),
// CompareAndSet, DeletePrefix, and waits that complete through a callback,
// so thousands of waiting RPCs hold no thread. Keys and values are bounded
// (KvLimits); violations are InvalidArgument naming the limit.
//
// Threading: all methods are thread-safe. Wait callbacks run on the thread
// that made the keys appear (Set, Add, CompareAndSet), on the store's timer
// thread (timeouts), or on the caller of CancelWait or the destructor; they
// must not call back into the store.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_KV_STORE_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_KV_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace holdfast::control {

struct KvLimits {
  size_t max_key_bytes = 1024;
  size_t max_value_bytes = 4 << 20;
  size_t max_wait_keys = 4096;
  absl::Duration max_wait = absl::Hours(1);
};

class KvStore {
 public:
  using WaitDone = std::function<void(absl::Status)>;

  explicit KvStore(KvLimits limits = {});
  // Fails pending waits with Unavailable.
  ~KvStore();

  absl::Status Set(absl::string_view key, absl::string_view value);
  // The value, or nullopt if absent.
  absl::StatusOr<std::optional<std::string>> Get(absl::string_view key);
  // Adds `delta` to the decimal counter at `key` (absent counts as 0).
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta);
  // Returns {swapped, value after the call}.
  absl::StatusOr<std::pair<bool, std::string>> CompareAndSet(
      absl::string_view key, absl::string_view expected, bool expect_absent,
      absl::string_view desired);
  // Returns how many keys were deleted.
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix);

  // Reserves an id for WaitAsync (so a caller can record it before the
  // callback may run).
  uint64_t NewWaitId();
  // Calls `done` exactly once: OK once every key exists (at once if they all
  // do already), DeadlineExceeded naming the missing keys after `timeout`,
  // Cancelled after CancelWait(id), Unavailable if the store is destroyed, or
  // InvalidArgument for bad keys or timeout.
  void WaitAsync(uint64_t id, std::vector<std::string> keys,
                 absl::Duration timeout, WaitDone done);
  // Cancels wait `id` if still pending; a no-op otherwise.
  void CancelWait(uint64_t id);

  const KvLimits& limits() const { return limits_; }

 private:
  struct Waiter {
    std::vector<std::string> keys;
    absl::Time deadline;
    WaitDone done;
  };

  absl::Status CheckKey(absl::string_view key) const;
  absl::Status CheckValue(absl::string_view value) const;
  bool AllPresentLocked(const std::vector<std::string>& keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes and returns the waiters whose keys are now all present.
  std::vector<WaitDone> ReadyWaitersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();

  const KvLimits limits_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> data_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t next_wait_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;  // bumps when waiters change
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_KV_STORE_H_
