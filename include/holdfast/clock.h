// Injectable monotonic clock. The communicator's deadlines and trace
// timestamps read it, so a test can force a timeout by advancing a clock
// instead of sleeping (holdfast/testing/fake_clock.h). Implementations are
// thread-safe.
#ifndef HOLDFAST_CLOCK_H_
#define HOLDFAST_CLOCK_H_

#include <time.h>

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

}  // namespace holdfast

#endif  // HOLDFAST_CLOCK_H_
