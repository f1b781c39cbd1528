// A handle on one issued operation. Work objects are returned by every
// Communicator call and are safe to use from any thread.
#ifndef HOLDFAST_WORK_H_
#define HOLDFAST_WORK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace holdfast {

class Work {
 public:
  virtual ~Work() = default;

  // True once the operation has finished, successfully or not.
  virtual bool IsCompleted() const = 0;

  // Blocks until the operation finishes or `timeout` passes, whichever is
  // first. Returns the operation's final status. If `timeout` passes first it
  // returns DeadlineExceeded and the operation stays in flight: its own
  // deadline (OpOptions::timeout) still bounds it.
  // The buffers an operation was given may be reused once Wait has returned
  // its final status: the transport no longer touches them.
  virtual absl::Status Wait(
      absl::Duration timeout = absl::InfiniteDuration()) = 0;

  // The operation's sequence number in its communicator (0, 1, 2, ...).
  virtual uint64_t seq() const = 0;
};

}  // namespace holdfast

#endif  // HOLDFAST_WORK_H_
