#include "src/runtime/pause_clock.h"

#include <time.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

#include "holdfast/clock.h"
#include "src/common/thread_util.h"

namespace holdfast {

int64_t PausedWithin(const std::deque<Pause>& pauses, int64_t from_ns,
                     int64_t to_ns) {
  if (to_ns <= from_ns) return 0;
  // The first pause that ends after from_ns.
  auto it =
      std::upper_bound(pauses.begin(), pauses.end(), from_ns,
                       [](int64_t t, const Pause& p) { return t < p.end_ns; });
  int64_t sum = 0;
  for (; it != pauses.end() && it->begin_ns < to_ns; ++it) {
    sum += std::min(it->end_ns, to_ns) - std::max(it->begin_ns, from_ns);
  }
  return sum;
}

PauseClock* PauseClock::Process() {
  static PauseClock* const clock = [] {
    auto* c = new PauseClock;  // never destroyed
    return c->Running() ? c : nullptr;
  }();
  return clock;
}

PauseClock::PauseClock(const Options& options) : options_(options) {
  {
    absl::MutexLock lock(&mu_);
    next_ns_ = MonotonicNanos() + absl::ToInt64Nanoseconds(options_.period);
  }
  absl::StatusOr<std::thread> t =
      StartThread("the pause clock", [this] { Loop(); });
  if (t.ok()) thread_ = std::move(*t);
}

PauseClock::~PauseClock() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

namespace {

// The cpu.stat of the process' cpu cgroup ("" if none): v1's cpu
// controller, else v2's unified hierarchy.
std::string CpuStatPath() {
  std::ifstream in("/proc/self/cgroup");
  std::string line, v2;
  while (std::getline(in, line)) {
    // "ID:CONTROLLERS:PATH"
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (path == "/") continue;  // the root group has no quota
    if (controllers.empty()) {
      v2 = "/sys/fs/cgroup" + path + "/cpu.stat";
      continue;
    }
    for (absl::string_view c : absl::StrSplit(controllers, ',')) {
      if (c == "cpu") {
        for (const char* root :
             {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
          std::string p = std::string(root) + path + "/cpu.stat";
          if (std::ifstream(p).good()) return p;
        }
      }
    }
  }
  return std::ifstream(v2).good() ? v2 : "";
}

// cpu.stat's throttle count and throttled time in ns ({-1, -1} if none).
PauseClock::Throttle ReadThrottled(const std::string& path) {
  std::ifstream in(path);
  std::string key;
  int64_t value = 0;
  PauseClock::Throttle t{-1, -1};
  while (in >> key >> value) {
    if (key == "nr_throttled") t.count = value;
    if (key == "throttled_time") t.ns = value;         // v1: ns
    if (key == "throttled_usec") t.ns = value * 1000;  // v2
  }
  return t.count >= 0 && t.ns >= 0 ? t : PauseClock::Throttle{-1, -1};
}

}  // namespace

PauseClock::Throttle PauseClock::Throttled(int64_t now_ns, bool* moved) {
  *moved = false;
  constexpr int64_t kFindEvery = 250000000;  // 250 ms
  if (stat_found_ns_ == 0 || now_ns - stat_found_ns_ >= kFindEvery) {
    std::string path = CpuStatPath();
    *moved = path != stat_path_;
    stat_path_ = std::move(path);
    stat_found_ns_ = now_ns;
  }
  return stat_path_.empty() ? Throttle{-1, -1} : ReadThrottled(stat_path_);
}

void PauseClock::Add(int64_t begin_ns, int64_t end_ns) {
  if (!pauses_.empty()) begin_ns = std::max(begin_ns, pauses_.back().end_ns);
  if (end_ns <= begin_ns) return;
  pauses_.push_back(Pause{begin_ns, end_ns});
  total_ns_ += end_ns - begin_ns;
  if (pauses_.size() > options_.keep) pauses_.pop_front();
}

void PauseClock::Loop() {
  const int64_t period = absl::ToInt64Nanoseconds(options_.period);
  const int64_t slack = absl::ToInt64Nanoseconds(options_.slack);
  const int64_t stat_every = absl::ToInt64Nanoseconds(options_.stat_every);
  int64_t deadline = 0;
  {
    absl::MutexLock lock(&mu_);
    deadline = next_ns_;
  }
  int64_t stat_at = MonotonicNanos();
  int64_t accounted_at = stat_at;  // when throttled time was last taken
  Throttle throttled{-1, -1};
  bool moved = false;
  if (stat_every > 0) throttled = Throttled(stat_at, &moved);
  while (!stop_.load()) {
    timespec ts{static_cast<time_t>(deadline / 1000000000),
                static_cast<long>(deadline % 1000000000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) != 0) {
    }
    const int64_t woke = MonotonicNanos();
    int64_t late = woke - deadline > slack ? woke - deadline : 0;
    if (stat_every > 0 && woke - stat_at >= stat_every) {
      // The group's throttling since the last read. The kernel adds a
      // CPU's throttled time when it ends, and sums the group's CPUs, so
      // a throttle's length is the time over the count (the CPUs of one
      // period are throttled at once), up to the time since the last
      // throttle taken.
      const Throttle now = Throttled(woke, &moved);
      if (!moved && now.count > throttled.count && throttled.count >= 0) {
        const int64_t each =
            (now.ns - throttled.ns) / (now.count - throttled.count);
        late = std::max(late, std::min(each, woke - accounted_at));
        accounted_at = woke;
      }
      throttled = now;
      stat_at = woke;
    }
    absl::MutexLock lock(&mu_);
    if (late > 0) Add(woke - late, woke);
    // The next deadline is a period after the wake-up: a long pause is
    // one pause, not a burst of missed deadlines.
    deadline = std::max(deadline, woke) + period;
    next_ns_ = deadline;
  }
}

int64_t PauseClock::PausedNs(int64_t from_ns, int64_t to_ns) const {
  absl::MutexLock lock(&mu_);
  int64_t sum = PausedWithin(pauses_, from_ns, to_ns);
  // A pause not yet seen: the thread is late for its deadline now.
  const int64_t now = MonotonicNanos();
  if (now - next_ns_ > absl::ToInt64Nanoseconds(options_.slack)) {
    const int64_t begin = std::max(next_ns_, from_ns);
    const int64_t end = std::min(now, to_ns);
    if (end > begin) sum += end - begin;
  }
  return sum;
}

int64_t PauseClock::TotalPausedNs() const {
  absl::MutexLock lock(&mu_);
  return total_ns_;
}

}  // namespace holdfast
