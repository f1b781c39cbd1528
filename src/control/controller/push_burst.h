// PushBurst: while one lives on a thread, a stream that carries several
// members (a host agent's) and is pushed to from that thread holds its
// write, and starts it once when the burst ends. Membership opens one
// around a push to every member, so that the push leaves as one message
// per host rather than a first message with one member's and a second
// with the rest.
//
// Threading: a burst belongs to the thread that opened it; bursts do not
// nest (an inner one is a no-op).
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_PUSH_BURST_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_PUSH_BURST_H_

#include <functional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"

namespace holdfast::control {

class PushBurst {
 public:
  PushBurst() {
    if (current_ == nullptr) current_ = this;
  }
  ~PushBurst() {
    if (current_ != this) return;
    current_ = nullptr;
    for (auto& kick : kicks_) kick();
  }
  PushBurst(const PushBurst&) = delete;
  PushBurst& operator=(const PushBurst&) = delete;

  // With a burst open on this thread: records `kick` to run when it ends
  // (once per `key`) and returns true. Else false: write now.
  static bool Defer(const void* key, std::function<void()> kick) {
    if (current_ == nullptr) return false;
    if (current_->keys_.insert(key).second) {
      current_->kicks_.push_back(std::move(kick));
    }
    return true;
  }

 private:
  static inline thread_local PushBurst* current_ = nullptr;
  absl::flat_hash_set<const void*> keys_;
  std::vector<std::function<void()>> kicks_;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_PUSH_BURST_H_
