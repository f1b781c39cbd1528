#include "src/control/controller/detection.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "src/common/logging.h"
#include "src/control/controller/duration_text.h"
#include "src/control/wire/quiet.h"

namespace holdfast::control {
namespace {

// The median of `v` (the upper one of an even count).
int64_t MedianOf(std::vector<int64_t> v) {
  auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

}  // namespace

std::string CheckGradientOutlierFactor(const std::string& text) {
  double v = 0;
  if (absl::SimpleAtod(text, &v) && (v == 0 || (v >= 2 && v <= 1e30))) {
    return "";
  }
  return absl::StrCat("'", text,
                      "' is not 0 (off) or a factor from 2 up (a slot's norm "
                      "against the median of the others')");
}

absl::Duration Lease(const DetectionOptions& d) {
  return d.lease.has_value() ? *d.lease : d.silent_after * 2 / 3;
}

absl::Duration QuietAfter(const DetectionOptions& d) {
  if (d.quiet_after.has_value()) {
    return std::min(std::max(*d.quiet_after, absl::ZeroDuration()),
                    d.silent_after);
  }
  return std::min(DefaultQuietAfter(d.heartbeat_interval), d.silent_after);
}

void StepPace::Note(int64_t step, int64_t step_us) {
  if (step <= last_step_) return;
  last_step_ = step;
  history_us_.push_back(step_us);
  while (history_us_.size() >
         static_cast<size_t>(std::max(1, d_.step_history))) {
    history_us_.pop_front();
  }
}

absl::Duration StepPace::Median() const {
  if (history_us_.empty()) return absl::ZeroDuration();
  return absl::Microseconds(
      MedianOf(std::vector<int64_t>(history_us_.begin(), history_us_.end())));
}

std::optional<absl::Duration> StepPace::StallThreshold() const {
  if (static_cast<int>(history_us_.size()) <
      std::max(1, d_.stall_min_history)) {
    return std::nullopt;
  }
  const int64_t longest =
      *std::max_element(history_us_.begin(), history_us_.end());
  return std::max({d_.stall_floor, d_.stall_factor * Median(),
                   d_.stall_max_factor * absl::Microseconds(longest)});
}

void HealthyPace::Note(int64_t generation, int world, int64_t step,
                       int64_t step_us, int64_t collective_us) {
  if (generation_ != generation) {
    open_.clear();
    generation_ = generation;
  }
  Open& p = open_[step];
  if (p.work_us.size() < kSamples) {
    p.work_us.push_back(OwnWork(step_us, collective_us));
  }
  p.min_collective_us = std::min(p.min_collective_us, collective_us);
  p.step_us = std::max(p.step_us, step_us);
  if (++p.reports >= world) {
    const int64_t healthy = MedianOf(std::move(p.work_us)) +
                            std::max<int64_t>(0, p.min_collective_us);
    const bool slow = static_cast<double>(p.step_us) >
                      d_.straggler_factor * static_cast<double>(healthy);
    step_us_ += p.step_us;
    healthy_us_ += slow ? healthy : p.step_us;
    open_.erase(step);
  }
  while (!open_.empty() && open_.begin()->first < step - kOpenSteps) {
    open_.erase(open_.begin());
  }
}

absl::Duration LinkWatch::Suspect() const {
  return std::max(2 * d_.heartbeat_interval, d_.silent_after / 2);
}

LinkWatch::Seen LinkWatch::Observe(int alive, int unheard, absl::Time now) {
  Seen seen;
  // One member alone has no majority to be compared with.
  if (alive > 1 && 2 * unheard > alive) {
    if (!isolated_since_.has_value()) {
      isolated_since_ = now;
      HOLDFAST_LOG_WARN(
          "controller: {} of {} live members unheard for {}: more likely this "
          "controller's own link; silence verdicts pause until most are "
          "heard again (reported failures are still acted on)",
          unheard, alive, Seconds(Suspect()));
    }
    seen.hold_silence = true;
  } else if (isolated_since_.has_value()) {
    // TCP backs its retransmissions off while a link is down: after an
    // outage of d, a member's queued heartbeats may take up to about d
    // more to arrive. No member is declared silent for that long (the
    // isolation and the threshold before it was noticed).
    const absl::Duration away =
        std::min(now - *isolated_since_ + d_.silent_after, absl::Minutes(1));
    HOLDFAST_LOG_WARN(
        "controller: most members heard again after {}; no member is "
        "declared silent for {}, and every stall clock restarts",
        Seconds(now - *isolated_since_), Seconds(away));
    isolated_since_.reset();
    quiet_until_ = now + away;
    seen.restart_clocks = true;
  }
  if (now < quiet_until_) seen.hold_silence = true;
  return seen;
}

bool Slow(const SlowWindow& w, double factor, int64_t floor_us) {
  return w.steps > 0 && w.slow >= 2 && w.mine >= factor * w.peers &&
         w.mine - w.peers >= 2.0 * static_cast<double>(floor_us);
}

std::vector<int64_t> CountedWork(const std::vector<StepSample>& steps) {
  std::vector<int64_t> out;
  out.reserve(steps.size());
  for (const StepSample& s : steps) out.push_back(s.work_us);
  if (steps.empty() ||
      std::any_of(steps.begin(), steps.end(),
                  [](const StepSample& s) { return s.arrival_us <= 0; })) {
    return out;
  }
  std::vector<int64_t> arrivals;
  arrivals.reserve(steps.size());
  for (const StepSample& s : steps) arrivals.push_back(s.arrival_us);
  const int64_t work = MedianOf(out);
  const int64_t arrival = MedianOf(std::move(arrivals));
  for (size_t i = 0; i < steps.size(); ++i) {
    out[i] = std::max(out[i], work + (steps[i].arrival_us - arrival));
  }
  return out;
}

Stall Laggards(const std::vector<Progress>& stuck, int live_workers) {
  Stall out;
  if (stuck.empty()) return out;
  const Progress lowest = *std::min_element(stuck.begin(), stuck.end());
  bool all_equal = static_cast<int>(stuck.size()) == live_workers;
  for (size_t i = 0; i < stuck.size(); ++i) {
    if (stuck[i] == lowest) {
      out.laggards.push_back(i);
    } else {
      all_equal = false;
    }
  }
  out.job_wide = all_equal && live_workers > 1;
  return out;
}

int StragglerWindow(const DetectionOptions& d, absl::Duration median_step) {
  const int least = d.straggler_window;
  if (median_step <= absl::ZeroDuration() ||
      d.straggler_span <= absl::ZeroDuration()) {
    return least;
  }
  const auto span = static_cast<int>(
      std::ceil(absl::FDivDuration(d.straggler_span, median_step)));
  return std::clamp(span, least, kStragglerWindowGrowth * least);
}

}  // namespace holdfast::control
