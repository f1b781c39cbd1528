#include "holdfast/clock.h"

#include <time.h>

namespace holdfast {
namespace {

class RealClock final : public Clock {
 public:
  int64_t NowNanos() const override {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

}  // namespace holdfast
