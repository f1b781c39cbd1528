// The controller's failure detection, as objects of their own: the
// options of every detector, the job's step pace (from which the stall
// threshold comes), and the watch on the controller's own link, which
// holds silence verdicts back while most members are unheard at once
// (more likely the controller is cut off than all of them), and the
// straggler rule. Membership runs the scans over its members with them
// (membership_scan.cc).
//
// Not thread-safe: Membership's mutex guards them.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_DETECTION_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_DETECTION_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace holdfast::control {

struct DetectionOptions;
// The lease that `d` gives members: d.lease, or two thirds of
// d.silent_after when unset.
absl::Duration Lease(const DetectionOptions& d);
// The quiet bound that `d` gives members behind a host agent
// (DetectionOptions::quiet_after); zero: off.
absl::Duration QuietAfter(const DetectionOptions& d);

// "" if `text` is a gradient outlier factor (DetectionOptions): 0 (off) or
// a number from 2 up; else what is wrong (a command-line check).
std::string CheckGradientOutlierFactor(const std::string& text);

struct DetectionOptions {
  // How often members send a periodic report (told to them at Register).
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // How often the controller reads /proc for the members that run on its
  // own machine (src/control/wire/process_watch.h): one whose process
  // begins to exit is declared crashed then, instead of when its stream
  // ends, which a SIGKILL delays by the teardown of its memory (about
  // 60 ms per GiB). Zero: off.
  absl::Duration exit_watch_interval = absl::Milliseconds(5);
  // silent: no heartbeat for this long. This is the grace of a link blip
  // too: a member whose link is down for less costs no fence. A blip of
  // b silences a member for up to b + heartbeat_interval + TCP's
  // retransmission back-off (0.2, 0.4, 0.8 s: about 1.9 s for b = 1 s),
  // so 3 s keeps blips of a second or so, and finds a frozen process or
  // a lost host in 3 s (docs/network.md).
  absl::Duration silent_after = absl::Seconds(3);
  // A member that has not heard from the controller for this long stops
  // acting: no step completes and no snapshot is acked until it hears
  // again (told to members at Register). Shorter than silent_after, so a
  // cut-off member has stopped before the controller declares it lost and
  // gives its slot to another: no split brain. Unset: two thirds of
  // silent_after (2 s with its default); zero: no lease. See Lease().
  std::optional<absl::Duration> lease;
  // A member behind a host agent whose local stream has been quiet for
  // this long while the agent is heard (the agent's MemberQuiet) is
  // silent at once: a stopped or frozen process. A link blip cannot
  // silence a local stream, so this needs no blip grace; members that
  // reach the controller directly keep silent_after. Unset:
  // DefaultQuietAfter(heartbeat_interval) (src/control/wire/quiet.h, the
  // agents' default too: 750 ms at 500 ms), never more than silent_after.
  // Zero: off. See QuietAfter().
  std::optional<absl::Duration> quiet_after;
  // Silence verdicts pause while more than half of the live members are
  // unheard for max(2 heartbeat intervals, silent_after / 2): the
  // controller's own link is then the likelier fault (its host cut off).
  // Reported failures are still acted on. When a majority is heard again, no
  // member is declared silent for as long as the isolation lasted plus
  // silent_after (TCP backs its retransmissions off during an outage, so queued
  // heartbeats may take about that long to arrive), and every stall clock
  // restarts.
  //
  // stalled: the step has not advanced for
  //   max(stall_floor, stall_factor x median, stall_max_factor x longest)
  // over the job's last `step_history` steps. Needs stall_min_history steps
  // of history first: a long first step (compilation, loading) is never a
  // stall, and a job with periodic long steps (an RL rollout every few
  // steps) has shown one before the rule applies.
  double stall_factor = 10.0;
  double stall_max_factor = 3.0;
  absl::Duration stall_floor = absl::Seconds(30);
  int stall_min_history = 16;
  int step_history = 128;
  // A recovery's rendezvous (generations after the first): once every
  // other slot's member has come to it, a member that has not is left out
  // (kind absent) after rendezvous_grace when it does not answer either
  // (no heartbeat of the new generation, or none for the longer of the
  // grace and two heartbeat intervals: frozen, or dead without a broken
  // stream), and after rendezvous_timeout when it still heartbeats (its
  // training thread is stuck or slow). Faults come in clusters: a frozen
  // member must not hold a recovery while more members fail.
  absl::Duration rendezvous_grace = absl::Seconds(1);
  absl::Duration rendezvous_timeout = absl::Seconds(30);
  // The culprit analysis of an incident's generation runs once every
  // member of it that still heartbeats has left its abort notice, or
  // this long after the incident (src/diagnosis/diagnosis.h).
  absl::Duration diagnosis_settle = absl::Seconds(2);
  // straggler: over the last straggler_window steps that every worker
  // reported, a worker's own work (its step time less its time inside
  // collectives, or more when it issued its collectives late: CountedWork)
  // summed was at least straggler_factor times its peers' medians summed,
  // and it was slow so (and straggler_floor more) on two steps or more
  // (Slow(), below); and that held for a window of steps more. Needs 3
  // workers or more. Each step is compared across the workers, so steps
  // that are long on every rank (an RL rollout) raise nothing. 0 turns it
  // off.
  int straggler_window = 8;
  double straggler_factor = 1.3;
  absl::Duration straggler_floor = absl::Milliseconds(5);
  // Short steps make a window of 8 a fraction of a second, in which one
  // worker's share of a busy machine is noise: the window grows to cover
  // this much of the job's time at its median step, up to 16 x
  // straggler_window steps (StragglerWindow). Zero: straggler_window.
  absl::Duration straggler_span = absl::Seconds(1);
  // A numeric anomaly (ReportFailureRequest::anomaly) is decided once
  // every worker has reported one for the generation, or this long after
  // the first report (a loss spike seen by one slot only).
  absl::Duration anomaly_settle = absl::Seconds(1);
  // A verdict of a link between two hosts with as many members each
  // (ReachVerdict::tie), or of one member's bad NIC, is taken only once
  // the first report of a lost peer since the last commit is this old: a
  // host cut off from the data network is first reported by one peer host,
  // and looks like the link to it until another reports it too, and its
  // first member named looks like a bad NIC until its others are. The
  // loop bound (RecoveryPolicy::max_unexplained_rebuilds) takes it at once.
  absl::Duration link_settle = absl::Seconds(3);
  // A slot whose local gradient norm of a step (StepReport::local_norms)
  // is above this many times the median of the other slots' is named
  // (GradientLedger): a bit flipped in its gradients, or data of its own.
  // The slots' data differ, so their norms do: over 1000 steps of the
  // example trainer on 4 slots the largest ratio was 210 with one sample
  // per slot, 29 with two and 4 with 64 (the Python DDP example's: 6).
  // An exponent bit flipped from 0 to 1 in a float32 below 2 multiplies it
  // by 2^(2^k) for bit 23 + k: bits 28 and up (2^32 and more) stand out of
  // any norm, lower ones only where the value weighs in it. A false alarm
  // costs a replay (and, when the replay shows it again, the step's data).
  // 0: off.
  double gradient_outlier_factor = 1000.0;
  // A host whose data link loses packets (LossLedger): over the last
  // lossy_link_window, at least lossy_link_min_segments TCP segments were
  // retransmitted between it and each other host on the training
  // connections, and at most a quarter of that between any two other
  // hosts, while every worker's step moves (a cut link stops training, and
  // its retransmissions are the cut's). Its workers are reported as
  // stragglers (they are the ones the others wait for), once a
  // generation; under RecoveryPolicy::replace_stragglers they are replaced
  // by standbys on other hosts when enough are there within the budget.
  // Needs 3 hosts or more; a min_segments of 0 turns it off.
  absl::Duration lossy_link_window = absl::Seconds(2);
  int64_t lossy_link_min_segments = 20;
  // A host whose data link flaps (LossLedger): training stalled at least
  // flap_min_stalls times within flap_window, and over those stalls the
  // same host rule held for what was retransmitted during them (a cut
  // retransmits while nothing moves). One cut shorter than the grace (a
  // blip) costs nothing; a link that keeps going down costs a pause each
  // time, and is reported as the lossy one is (the same policy). 0 stalls:
  // off.
  absl::Duration flap_window = absl::Seconds(30);
  int flap_min_stalls = 3;
  // A gap between a worker's step ends longer than this (or 5 x the median
  // step, if longer) is a stall, for the two rules above: what was
  // retransmitted meanwhile is the stall's, not loss's. A cut link stalls
  // training for its outage and TCP's back-off (a 0.2 s cut and a 1 s cut
  // both about 1 s or more on the netns hosts); a lost segment costs a
  // retransmission timeout (0.2 s, 0.6 s when lost twice), which is loss
  // slowing training.
  absl::Duration link_stall = absl::Milliseconds(800);
  // A generation opened within this of the last push of one waits, and
  // goes with those that follow it in one push of the newest: faults come
  // in clusters (a host's eight ranks, a rack), and a thousand deaths at
  // once cost a few pushes to every member, not a thousand. The first
  // generation after a quiet spell goes at once. Zero: every generation
  // is pushed at once.
  absl::Duration push_merge = absl::Milliseconds(50);
};

// The job's step pace: the step times workers report, one sample per step
// number (whoever reports it first: the history does not grow with the
// world size), the newest `step_history` of them.
class StepPace {
 public:
  explicit StepPace(const DetectionOptions& d) : d_(d) {}
  void Note(int64_t step, int64_t step_us);
  absl::Duration Median() const;
  // A step not done after this long is stalled: the largest of the
  // floor, stall_factor times the median and stall_max_factor times the
  // longest step; none before stall_min_history samples.
  std::optional<absl::Duration> StallThreshold() const;

 private:
  const DetectionOptions& d_;
  std::deque<int64_t> history_us_;
  int64_t last_step_ = -1;
};

// The job's pace against the pace it would have without its slowest
// members (StatusResponse::pace_step_us and pace_healthy_us): for every
// step every slot reported, its step time, and the healthy step time (the
// median member's own work plus the least collective wait). Within the
// straggler factor of the healthy pace a step counts whole (the jitter
// every job has); slower, it counts at the healthy pace. A bounded sample
// of the members' work per step keeps a report O(1) at any world size;
// steps that never complete (a failure, a rollback) are dropped.
class HealthyPace {
 public:
  explicit HealthyPace(const DetectionOptions& d) : d_(d) {}
  // A worker of `generation` (of `world` slots) ended `step` after
  // `step_us`, `collective_us` of them inside collectives.
  void Note(int64_t generation, int world, int64_t step, int64_t step_us,
            int64_t collective_us);
  int64_t step_us() const { return step_us_; }
  int64_t healthy_us() const { return healthy_us_; }

 private:
  // A step still awaiting a member's report: up to kSamples members' own
  // work, the least collective wait and the longest step time.
  struct Open {
    std::vector<int64_t> work_us;
    int64_t min_collective_us = INT64_MAX;
    int64_t step_us = 0;
    int reports = 0;
  };
  static constexpr size_t kSamples = 63;
  static constexpr int64_t kOpenSteps = 16;

  const DetectionOptions& d_;
  std::map<int64_t, Open> open_;
  int64_t generation_ = -1;
  int64_t step_us_ = 0;
  int64_t healthy_us_ = 0;
};

// A worker's own work in a step: its step time less its time inside
// collectives (0 at least).
inline int64_t OwnWork(int64_t step_us, int64_t collective_us) {
  return std::max<int64_t>(0, step_us - collective_us);
}

// One worker's step, as the straggler rule sees it: its own work (step
// time less time inside collectives) and its arrival (the mean time from
// the step's start to the issue of its collectives; 0: none).
struct StepSample {
  int64_t step = 0;
  int64_t work_us = 0;
  int64_t arrival_us = 0;
};
// The work the straggler rule counts for each of the workers of one step
// (`steps[i]`): its own work, or, when it issued its collectives later
// than the others, the median worker's work plus how much later (its
// arrival less the median arrival), whichever is more. Slowness that
// falls inside a worker's own collectives (its op thread throttled with
// it; DDP issuing buckets during a slow backward) shows only in the
// latter. Arrivals count only where every worker has one.
std::vector<int64_t> CountedWork(const std::vector<StepSample>& steps);

// A worker's own work over a window of the newest steps every worker
// reported, against its peers' (the straggler rule).
struct SlowWindow {
  int steps = 0;     // in the window
  int slow = 0;      // steps on which it alone was slow
  double mine = 0;   // its own work, summed (us)
  double peers = 0;  // its peers' median work, summed (us)
};
// The straggler rule on window `w`: it was slow on at least two steps,
// and its work summed is at least `factor` times its peers' and twice
// `floor_us` more. A sum, not a run of slow steps in a row: a process
// stopped part of the time from outside (a duty cycle, a CPU quota) is
// slow on some steps and not the next. One long step (a pause, a write)
// is not enough, and Membership wants the rule to go on holding for a
// window more before it reports (two pauses close together pass).
bool Slow(const SlowWindow& w, double factor, int64_t floor_us);
// The straggler rule's window, in steps, at the job's median step time:
// straggler_span of it, no fewer than straggler_window steps and no more
// than kStragglerWindowGrowth x straggler_window (StragglerWatch keeps that
// many samples per slot).
inline constexpr int kStragglerWindowGrowth = 16;
int StragglerWindow(const DetectionOptions& d, absl::Duration median_step);

// Where a worker is: its step and the last collective it entered.
using Progress = std::pair<int64_t, int64_t>;
// The stall rule, over the workers whose step has not advanced past the
// stall threshold (`stuck`: their progress) among `live_workers`. When one
// rank hangs in its step, the others soon wait for it inside the next
// collective: they stop advancing too, but they are ahead. So the culprits
// are the laggards, those furthest behind (indices into `stuck`); unless
// every live worker, more than one, is stuck at the same point: then the
// stall is the job's (`job_wide`), and nobody is to be fenced.
struct Stall {
  std::vector<size_t> laggards;
  bool job_wide = false;
};
Stall Laggards(const std::vector<Progress>& stuck, int live_workers);

// The watch on the controller's own link. Members that report at every
// step end are heard more often than the others: when most live members
// are unheard for half the silence threshold, the controller is more
// likely cut off than they are, and silence verdicts pause. When most are
// heard again, none is declared silent for as long as TCP may take to
// deliver their queued heartbeats (about the outage again), and every
// stall clock restarts.
class LinkWatch {
 public:
  explicit LinkWatch(const DetectionOptions& d) : d_(d) {}
  // How long unheard counts against the controller's link.
  absl::Duration Suspect() const;
  struct Seen {
    bool hold_silence = false;    // no member is declared silent now
    bool restart_clocks = false;  // most were heard again just now
  };
  // `unheard` of `alive` members were unheard for Suspect() at `now`.
  Seen Observe(int alive, int unheard, absl::Time now);

 private:
  const DetectionOptions& d_;
  std::optional<absl::Time> isolated_since_;
  absl::Time quiet_until_ = absl::InfinitePast();
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_DETECTION_H_
