// A clock for tests: it moves only when told to, so a test forces a
// deadline by advancing it instead of sleeping. Thread-safe.
#ifndef HOLDFAST_TESTING_FAKE_CLOCK_H_
#define HOLDFAST_TESTING_FAKE_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "holdfast/clock.h"

namespace holdfast {

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

#endif  // HOLDFAST_TESTING_FAKE_CLOCK_H_
