// PushMerge: the rule that merges generation pushes (DetectionOptions::
// push_merge). Faults come in clusters; a generation opened within the
// window of the last push waits, and goes with those that follow it in one
// push of the newest generation, carrying every slot change since the last
// push (the latest member of each slot), the slots shrinks took away, and
// the first abort order (of the generation the members were told of last).
// The first generation after a quiet spell goes at once.
//
// Not thread-safe: Membership's mutex guards it.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_PUSH_MERGE_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_PUSH_MERGE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "src/control/wire/controller.pb.h"

namespace holdfast::control {

class PushMerge {
 public:
  // What waits to be pushed as one.
  struct Merged {
    std::map<int, uint64_t> changes;  // slot -> member, the latest
    std::optional<AbortOrder> abort;  // the first
    int removed = 0;                  // slots shrinks took away
    int generations = 0;
  };

  explicit PushMerge(absl::Duration window) : window_(window) {}

  // A generation opened at `now` with these slot changes, `removed` slots
  // taken away and `abort` (may be null). True: push it now (and call
  // Pushed); false: it joined the merged push that waits.
  bool Add(const std::vector<SlotChange>& changes, int removed,
           const AbortOrder* abort, absl::Time now) {
    if (now >= last_push_ + window_ && !waiting_.has_value()) return true;
    if (!waiting_.has_value()) waiting_.emplace();
    for (const SlotChange& c : changes) {
      waiting_->changes[c.slot()] = c.member_id();
    }
    waiting_->removed += removed;
    if (abort != nullptr && !waiting_->abort.has_value()) {
      waiting_->abort = *abort;
    }
    ++waiting_->generations;
    return false;
  }
  // A generation was pushed at `now`.
  void Pushed(absl::Time now) { last_push_ = now; }
  // Whether a merged push waits.
  bool waiting() const { return waiting_.has_value(); }
  // When the merged push is due (InfiniteFuture: none waits).
  absl::Time Due() const {
    return waiting_.has_value() ? last_push_ + window_ : absl::InfiniteFuture();
  }
  // The merged push, once due at `now`; it no longer waits.
  std::optional<Merged> TakeDue(absl::Time now) {
    if (!waiting_.has_value() || now < Due()) return std::nullopt;
    std::optional<Merged> out = std::move(waiting_);
    waiting_.reset();
    return out;
  }

 private:
  const absl::Duration window_;
  std::optional<Merged> waiting_;
  absl::Time last_push_ = absl::InfinitePast();
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_PUSH_MERGE_H_
