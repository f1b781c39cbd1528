// Injectable monotonic clock. The communicator's deadlines and trace
// timestamps read it, so a test can force a timeout by advancing a FakeClock
// instead of sleeping. Both implementations are thread-safe.
#ifndef HOLDFAST_CLOCK_H_
#define HOLDFAST_CLOCK_H_

#include <time.h>

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace holdfast {

// CLOCK_MONOTONIC in nanoseconds, inline: the real clock's hot path.
inline int64_t MonotonicNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

class Clock {
 public:
  virtual ~Clock() = default;
  // Nanoseconds on a monotonic scale (CLOCK_MONOTONIC for the real clock).
  virtual int64_t NowNanos() const = 0;

  // The process-wide real clock. Never null; never destroyed.
  static Clock* Real();
};

// A clock that moves only when told to. Starts at `start_ns`.
class FakeClock : public Clock {
 public:
  explicit FakeClock(int64_t start_ns = 1'000'000'000) : now_ns_(start_ns) {}
  int64_t NowNanos() const override {
    return now_ns_.load(std::memory_order_acquire);
  }
  void Advance(absl::Duration d) {
    now_ns_.fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_acq_rel);
  }

 private:
  std::atomic<int64_t> now_ns_;
};

}  // namespace holdfast

#endif  // HOLDFAST_CLOCK_H_
