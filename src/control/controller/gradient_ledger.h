// The controller's comparison of the slots' local gradient norms (silent
// data corruption in flight, docs/gray-failures.md): every slot reports the
// norm of its own gradients of each step, before the all-reduce mixes them
// (StepReport::local_norms). The slots read different data, so their norms
// differ; a bit flipped in an exponent of one slot's gradients makes its
// norm larger than the others' by orders of magnitude. Once every slot's
// norm of a step is in, a slot whose norm is above `factor` times the
// median of the other slots' is named.
//
// A slot's own data can do the same (a sample of its own far off the
// others'). The ledger only names; AnomalyLedger tells the two apart by
// the replay: a flip is gone when the step is redone, the data is not.
//
// Not thread-safe: Membership's mutex guards it.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_GRADIENT_LEDGER_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_GRADIENT_LEDGER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "src/control/controller/step_collector.h"
#include "src/control/wire/controller.pb.h"

namespace holdfast::control {

class GradientLedger {
 public:
  struct Outlier {
    int64_t step = 0;
    std::vector<int> slots;         // named, ascending
    std::map<int, DataRange> data;  // what each named slot read
    int keep_snapshots = 0;         // the least any slot keeps
    std::string evidence;           // in words
  };

  // Slot `slot`'s norm `n` in a world of `world`. A step whose norms are
  // all in is decided (once): its outliers, if any. `factor` > 1.
  std::optional<Outlier> Note(int slot, const LocalNorm& n, int world,
                              double factor);
  // A new generation restored step `committed`: the steps after it are
  // redone, and the norms held for them are dropped.
  void Restart(int64_t committed);

 private:
  StepCollector<LocalNorm> steps_;
  int64_t decided_ = -1;  // the newest step decided
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_GRADIENT_LEDGER_H_
