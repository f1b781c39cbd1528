// The straggler rule's state: each slot's own work over its last steps
// (detection.h's StepSample), whether the rule holds for it and since
// when, whether it was reported in this generation, and the job's budget
// of replacements.
//
// The rules (the comparison of one step across the workers is
// detection.h's CountedWork, Slow and StragglerWindow):
//   - only the steps every slot reported in the current generation count;
//     a new generation, or steps redone after a rollback, start a slot's
//     steps over;
//   - a slot is a straggler once the rule has held for it over the window
//     (StragglerWindow at the job's median step) and then for a window
//     more: a burst passes, a slowdown stays. Needs 3 slots or more;
//   - it is reported once a generation; a replacement is due once it was
//     reported, the rule went on holding for `replace_after` steps more,
//     and held over that longer window too;
//   - at most `budget` replacements a job, shared with the lossy-link
//     rule (RecoveryPolicy::straggler_budget).
//
// Within a generation a slot names one member: a replacement or a shrink
// opens a new one. Not thread-safe: Membership's mutex guards it.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_STRAGGLER_WATCH_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_STRAGGLER_WATCH_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/time/time.h"
#include "src/control/controller/detection.h"

namespace holdfast::control {

class StragglerWatch {
 public:
  StragglerWatch(const DetectionOptions& detection, int replace_after,
                 int budget);

  // A step end of slot `slot` in `generation`.
  void NoteStepEnd(int slot, int64_t generation, const StepSample& sample);
  // Whether a step end came since the last call (only those can change
  // the answer of Scan).
  bool TakeStepEnds();

  struct Finding {
    int slot = -1;
    SlowWindow window;  // over the rule's window
    bool replace_due = false;
  };
  // The slots of a world of `world` slots in `generation` that are
  // stragglers now, in slot order. None until every slot has steps of
  // this generation.
  std::vector<Finding> Scan(int world, int64_t generation,
                            absl::Duration median_step);

  bool reported(int slot, int64_t generation) const;
  void MarkReported(int slot, int64_t generation);

  // Whether `n` more replacements fit in the budget.
  bool CanReplace(int n) const { return replaced_ + n <= budget_; }
  // Spends one; returns how many were spent.
  int SpendReplacement() { return ++replaced_; }
  int budget() const { return budget_; }

 private:
  struct Slot {
    std::deque<StepSample> work;  // oldest first
    int64_t work_generation = -1;
    int64_t reported_generation = -1;
    // The newest complete step when the rule began to hold, in
    // slow_generation (-1: it does not hold now).
    int64_t slow_since = -1;
    int64_t slow_generation = -1;
  };
  Slot& At(int slot);

  const DetectionOptions detection_;
  const int replace_after_;
  const int budget_;
  std::vector<Slot> slots_;
  bool step_ends_ = false;
  int replaced_ = 0;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_STRAGGLER_WATCH_H_
