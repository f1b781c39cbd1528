#include "src/control/controller/straggler_watch.h"

#include <algorithm>
#include <cstddef>
#include <map>

namespace holdfast::control {

namespace {

// The steps every worker reported, newest first: each one's work by
// worker, and the same values sorted (for the median of a worker's peers
// in O(log n): the median of the others is the sorted list's, one place
// further when the worker's own value sits at or below it).
struct CompleteSteps {
  std::vector<std::vector<int64_t>> work;
  std::vector<std::vector<int64_t>> sorted;
  int64_t newest = -1;  // the newest step's number
};

CompleteSteps Complete(const std::vector<const std::deque<StepSample>*>& work) {
  const size_t n = work.size();
  std::map<int64_t, std::vector<StepSample>> by_step;
  for (size_t i = 0; i < n; ++i) {
    for (const StepSample& s : *work[i]) {
      std::vector<StepSample>& v = by_step[s.step];
      v.resize(n, StepSample{-1, -1, 0});
      v[i] = s;
    }
  }
  CompleteSteps out;
  for (auto it = by_step.rbegin(); it != by_step.rend(); ++it) {
    if (std::none_of(it->second.begin(), it->second.end(),
                     [](const StepSample& s) { return s.work_us < 0; })) {
      if (out.newest < 0) out.newest = it->first;
      out.work.push_back(CountedWork(it->second));
      out.sorted.push_back(out.work.back());
      std::sort(out.sorted.back().begin(), out.sorted.back().end());
    }
  }
  return out;
}

// Worker i over the newest `window` complete steps: its own work and its
// peers' median summed over them, and the steps on which it alone was
// slow (at least `factor` times its peers' median, and `floor_us` more).
SlowWindow SlowWindowOf(const CompleteSteps& steps, size_t i, size_t window,
                        double factor, int64_t floor_us) {
  const size_t mid = (steps.work[0].size() - 1) / 2;  // among n - 1 others
  SlowWindow r;
  r.steps = static_cast<int>(std::min(window, steps.work.size()));
  for (size_t k = 0; k < static_cast<size_t>(r.steps); ++k) {
    const std::vector<int64_t>& all = steps.sorted[k];
    const int64_t own = steps.work[k][i];
    const size_t at = static_cast<size_t>(
        std::lower_bound(all.begin(), all.end(), own) - all.begin());
    const int64_t median = at <= mid ? all[mid + 1] : all[mid];
    r.mine += static_cast<double>(own);
    r.peers += static_cast<double>(median);
    r.slow +=
        static_cast<double>(own) >= factor * static_cast<double>(median) &&
        own - median >= floor_us;
  }
  return r;
}

}  // namespace

StragglerWatch::StragglerWatch(const DetectionOptions& detection,
                               int replace_after, int budget)
    : detection_(detection), replace_after_(replace_after), budget_(budget) {}

StragglerWatch::Slot& StragglerWatch::At(int slot) {
  if (static_cast<size_t>(slot) >= slots_.size()) {
    slots_.resize(static_cast<size_t>(slot) + 1);
  }
  return slots_[static_cast<size_t>(slot)];
}

void StragglerWatch::NoteStepEnd(int slot, int64_t generation,
                                 const StepSample& sample) {
  if (detection_.straggler_window <= 0) return;
  Slot& s = At(slot);
  if (s.work_generation != generation ||
      (!s.work.empty() && s.work.back().step >= sample.step)) {
    // A new generation, or steps redone after a rollback.
    s.work.clear();
    s.work_generation = generation;
  }
  step_ends_ = true;
  s.work.push_back(sample);
  const auto keep = static_cast<size_t>(std::max(
      kStragglerWindowGrowth * detection_.straggler_window, replace_after_));
  while (s.work.size() > keep) s.work.pop_front();
}

bool StragglerWatch::TakeStepEnds() {
  const bool any = step_ends_;
  step_ends_ = false;
  return any;
}

std::vector<StragglerWatch::Finding> StragglerWatch::Scan(
    int world, int64_t generation, absl::Duration median_step) {
  std::vector<Finding> out;
  if (detection_.straggler_window <= 0 || world < 3) return out;
  std::vector<const std::deque<StepSample>*> work;
  for (int slot = 0; slot < world; ++slot) {
    const Slot& s = At(slot);
    if (s.work_generation != generation) return out;  // none yet
    work.push_back(&s.work);
  }
  const CompleteSteps steps = Complete(work);
  const int span = StragglerWindow(detection_, median_step);
  if (steps.work.size() < static_cast<size_t>(span)) return out;
  const double factor = detection_.straggler_factor;
  const int64_t floor_us =
      absl::ToInt64Microseconds(detection_.straggler_floor);
  const size_t replace_window =
      static_cast<size_t>(std::max(span, replace_after_));
  for (int slot = 0; slot < world; ++slot) {
    Slot& s = At(slot);
    const auto i = static_cast<size_t>(slot);
    const SlowWindow w =
        SlowWindowOf(steps, i, static_cast<size_t>(span), factor, floor_us);
    if (!Slow(w, factor, floor_us)) {
      s.slow_since = -1;
      continue;
    }
    if (s.slow_since < 0 || s.slow_generation != generation) {
      s.slow_since = steps.newest;
      s.slow_generation = generation;
    }
    const int64_t held = steps.newest - s.slow_since;
    if (held < span) continue;
    const bool replace_due =
        s.reported_generation == generation && held >= span + replace_after_ &&
        steps.work.size() >= replace_window &&
        Slow(SlowWindowOf(steps, i, replace_window, factor, floor_us), factor,
             floor_us);
    out.push_back(Finding{slot, w, replace_due});
  }
  return out;
}

bool StragglerWatch::reported(int slot, int64_t generation) const {
  return static_cast<size_t>(slot) < slots_.size() &&
         slots_[static_cast<size_t>(slot)].reported_generation == generation;
}

void StragglerWatch::MarkReported(int slot, int64_t generation) {
  At(slot).reported_generation = generation;
}

}  // namespace holdfast::control
