// Per-collective state tracing: the record kept for every operation and the
// JSON dump of a rank's ring. Schema: docs/trace-schema.md.
// TraceRecord is a plain value; dumps are produced by Communicator::DumpTrace.
#ifndef HOLDFAST_TRACE_H_
#define HOLDFAST_TRACE_H_

#include <cstdint>
#include "absl/strings/string_view.h"

#include "holdfast/types.h"

namespace holdfast {

enum class OpState : uint8_t {
  kEnqueued = 0,
  kStarted = 1,
  kCompleted = 2,
  kFailed = 3,
  kTimedOut = 4,
  kAborted = 5,
};

absl::string_view OpStateName(OpState state);

// One operation as the issuing rank saw it. Times are nanoseconds on the
// communicator's clock (monotonic); 0 means "not reached".
struct TraceRecord {
  uint64_t seq = 0;        // per-communicator sequence number
  int64_t generation = 0;  // membership generation
  int64_t coll_seq = -1;   // index among collectives (equal on all ranks);
                           // for Send/Recv, the index among the messages
                           // between this rank and `peer`
  OpType op = OpType::kAllReduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce = ReduceOp::kSum;  // meaningful for reductions only
  OpState state = OpState::kEnqueued;
  int32_t peer = -1;   // root (Broadcast) or peer (Send/Recv); else -1
  uint64_t count = 0;  // elements
  uint64_t bytes = 0;  // bytes this rank sends or receives in its buffer
  int64_t enqueued_ns = 0;
  int64_t started_ns = 0;
  int64_t ended_ns = 0;     // completed, failed, timed out or aborted
  int32_t status_code = 0;  // absl::StatusCode of the final status
  uint32_t tag = 0;         // Send/Recv: the caller's tag; else 0
};

}  // namespace holdfast

#endif  // HOLDFAST_TRACE_H_
