// PauseClock: when this process was not running while it should have
// been. A thread of its own sleeps to absolute deadlines `period` apart
// (CLOCK_MONOTONIC) and takes each wake-up later than `slack` as a pause,
// from the deadline to the wake-up. A SIGSTOP, a CPU quota's throttling
// (cgroup cpu.cfs_quota_us), a host whose CPUs others take: each stops
// this thread with the rest of the process, and shows. A thread of the
// process blocked in a wait (a collective waiting for a peer) does not:
// it does not stop this one.
//
// A CPU quota throttles each CPU's share of the group once the group's
// quota is spent, and a thread that runs for microseconds a wake-up (this
// one) mostly runs on the slice its CPU still holds while the busy
// threads wait. So the clock also reads its cgroup's throttling
// (cpu.stat's nr_throttled, and throttled_time in v1 or throttled_usec in
// v2; the group found again every 250 ms, as a process may be moved; the
// root group, which has no quota, is not read) every `stat_every`, and
// takes a throttle that ended since the last read as a pause ending now.
//
// The straggler rule needs it (StepReporter): a rank stopped while it is
// inside a collective makes every rank wait there alike, so the step time
// less the time inside collectives, its own work, hid the stop; the pause
// clock gives that time back to the rank that was stopped.
//
// Thread-safe.
#ifndef HOLDFAST_SRC_RUNTIME_PAUSE_CLOCK_H_
#define HOLDFAST_SRC_RUNTIME_PAUSE_CLOCK_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace holdfast {

// A pause: [begin_ns, end_ns) on CLOCK_MONOTONIC.
struct Pause {
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
};
// How much of [from_ns, to_ns) the pauses `pauses` (in time order, not
// overlapping) cover.
int64_t PausedWithin(const std::deque<Pause>& pauses, int64_t from_ns,
                     int64_t to_ns);

class PauseClock {
 public:
  struct Options {
    absl::Duration period = absl::Milliseconds(10);
    // A wake-up later than this is a pause (a loaded machine's scheduler
    // delays a thread by a millisecond or two).
    absl::Duration slack = absl::Milliseconds(2);
    // The newest pauses kept (older ones are forgotten).
    size_t keep = 4096;
    // How often the cgroup's throttled time is read (0: never).
    absl::Duration stat_every = absl::Milliseconds(50);
  };

  // The process' clock, started on the first call (nullptr where the
  // system refused its thread: a pids limit). Never destroyed.
  static PauseClock* Process();

  // Starts the thread; Running() says whether it started.
  explicit PauseClock(const Options& options);
  PauseClock() : PauseClock(Options()) {}
  ~PauseClock();
  PauseClock(const PauseClock&) = delete;
  PauseClock& operator=(const PauseClock&) = delete;

  bool Running() const { return thread_.joinable(); }

  // A cgroup's cpu.stat: throttles, and their time summed over its CPUs.
  struct Throttle {
    int64_t count = -1;
    int64_t ns = -1;
  };

  // How much of [from_ns, to_ns) this process was paused, over the pauses
  // kept, and the one going on if the thread is late now (its wake-up not
  // yet seen).
  int64_t PausedNs(int64_t from_ns, int64_t to_ns) const;
  // All pauses since the start.
  int64_t TotalPausedNs() const;

 private:
  void Loop();
  // How often and how long (ns, summed over its CPUs) the process' cgroup
  // has been throttled (Throttle), or {-1, -1} where there is nothing to read;
  // follows the process to a new group (then the count starts over:
  // `moved`).
  Throttle Throttled(int64_t now_ns, bool* moved);
  // Records the pause [begin_ns, end_ns), clipped to after the last one.
  void Add(int64_t begin_ns, int64_t end_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  std::atomic<bool> stop_{false};
  mutable absl::Mutex mu_;
  std::deque<Pause> pauses_ ABSL_GUARDED_BY(mu_);
  int64_t total_ns_ ABSL_GUARDED_BY(mu_) = 0;
  // The deadline the thread sleeps to now.
  int64_t next_ns_ ABSL_GUARDED_BY(mu_) = 0;
  // The clock thread's own: the cpu.stat read, and when it was found.
  std::string stat_path_;
  int64_t stat_found_ns_ = 0;
  std::thread thread_;
};

}  // namespace holdfast

#endif  // HOLDFAST_SRC_RUNTIME_PAUSE_CLOCK_H_
