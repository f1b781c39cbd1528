// What the controller's per-step checks share: each slot's value of a
// step (a hash of its replicated state, the norm of its local gradients),
// held until every slot's is in. Those of a step that never completes (a
// slot that never reports it) go once more than kMaxPendingSteps steps are
// held, so the map is bounded.
//
// Not thread-safe: Membership's mutex guards it.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_STEP_COLLECTOR_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_STEP_COLLECTOR_H_

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>

namespace holdfast::control {

template <typename Value>
class StepCollector {
 public:
  struct Step {
    int64_t step = 0;
    std::map<int, Value> values;  // by slot
    int keep = INT_MAX;           // the least keep_snapshots reported
  };

  // Slot `slot`'s value of `step`, in a world of `world`: the step once
  // every slot's is in (then it, and every older step, is dropped).
  // Steps at or before `floor` and slots outside the world are ignored.
  std::optional<Step> Note(int slot, int64_t step, Value value,
                           int keep_snapshots, int world, int64_t floor) {
    if (step <= floor || slot < 0 || slot >= world) return std::nullopt;
    Step& s = steps_[step];
    s.step = step;
    s.values[slot] = std::move(value);
    s.keep = std::min(s.keep, keep_snapshots);
    if (static_cast<int>(s.values.size()) < world) {
      if (steps_.size() > kMaxPendingSteps) steps_.erase(steps_.begin());
      return std::nullopt;
    }
    Step done = std::move(s);
    steps_.erase(steps_.begin(), steps_.upper_bound(step));
    return done;
  }
  // A new generation: what was held is redone, or never comes.
  void Clear() { steps_.clear(); }

 private:
  static constexpr size_t kMaxPendingSteps = 64;
  std::map<int64_t, Step> steps_;  // undecided, by step
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_STEP_COLLECTOR_H_
