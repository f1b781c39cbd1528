// StepReporter: what a member's heartbeats say of its steps, read from
// the training communicator's trace: the collective it is inside, the
// time each step spent inside collectives and how late it issued them
// (the straggler rule's counted work), and its TCP retransmissions to
// each peer (the lossy-link rule).
//
// The rules:
//   - a step counts the collectives that completed since the last step's
//     report, on the communicator of the generation it ran in (a new one
//     starts the count over);
//   - the time inside them leaves out the time the process was paused
//     there (pause_clock.h);
//   - its arrival is the mean time from the step's start to the issue of
//     the collectives issued since then (zero if none);
//   - retransmissions are read at most every 200 ms (a syscall per peer),
//     and the 16 peers with the most are sent.
//
// StepReporter: the training thread only. CollectiveInProgress: any
// thread.
#ifndef HOLDFAST_SRC_RUNTIME_STEP_REPORTER_H_
#define HOLDFAST_SRC_RUNTIME_STEP_REPORTER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "holdfast/trace.h"
#include "src/control/member/member.h"
#include "src/runtime/generation_view.h"
#include "src/runtime/pause_clock.h"

namespace holdfast {

// The collectives of `trace` with a sequence number of at least `from`
// that completed: the time spent inside them, less the time this process
// was paused in them (`paused(from_ns, to_ns)`, on the trace's clock;
// none if empty: a pause inside a collective is the paused rank's own
// time, not a wait for its peers), the mean time from `step_start_ns` to
// the issue of those issued since then, and the sequence number after the
// newest counted (`from` if none).
struct CollectiveTimes {
  absl::Duration inside;
  absl::Duration arrival;
  uint64_t next_seq = 0;
};
CollectiveTimes TimeCollectives(
    const std::vector<TraceRecord>& trace, uint64_t from, int64_t step_start_ns,
    const std::function<int64_t(int64_t, int64_t)>& paused = nullptr);
// The coll_seq of the collective `trace` is inside (started, not ended),
// or -1: what heartbeats report as PHASE_COLLECTIVE.
int64_t CollectiveInside(const std::vector<TraceRecord>& trace);
// The collective the training communicator of `gens` is inside, or -1.
int64_t CollectiveInProgress(const GenerationView& gens);
// The `most` peers (by slot) with the most retransmissions, of `all` (by
// slot); those with none are left out.
std::vector<std::pair<int, int64_t>> MostRetransmits(
    const std::vector<int64_t>& all, size_t most);

class StepReporter {
 public:
  // All must outlive this object; `pauses` may be null (no pause counted).
  StepReporter(const GenerationView* gens, control::MemberClient* client,
               const PauseClock* pauses)
      : gens_(gens), client_(client), pauses_(pauses) {}

  // Reports step `step`, which ran from `t0` to `t1`, with `metrics`.
  void Report(int64_t step, absl::Time t0, absl::Time t1,
              const std::map<std::string, double>& metrics);

 private:
  const GenerationView* const gens_;
  control::MemberClient* const client_;
  const PauseClock* const pauses_;
  // The generation and the next op seq to count.
  int64_t timed_generation_ = -1;
  uint64_t timed_seq_ = 0;
  absl::Time retransmits_at_ = absl::InfinitePast();
};

}  // namespace holdfast

#endif  // HOLDFAST_SRC_RUNTIME_STEP_REPORTER_H_
