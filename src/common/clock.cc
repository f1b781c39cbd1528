#include "holdfast/clock.h"

namespace holdfast {
namespace {

class RealClock final : public Clock {
 public:
  int64_t NowNanos() const override { return MonotonicNanos(); }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

}  // namespace holdfast
