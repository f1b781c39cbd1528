// Fixed-size ring of TraceRecords, one per operation, indexed by sequence
// number. Recording never allocates and never takes a lock.
//
// Threading: Begin/Transition may be called from several threads as long as
// calls for the same seq are ordered (the communicator serialises them).
// Snapshot may run concurrently with writers from any thread: each slot is a
// seqlock over relaxed atomics, so a reader retries a slot caught mid-write.
#ifndef HOLDFAST_SRC_TRACE_TRACE_RING_H_
#define HOLDFAST_SRC_TRACE_TRACE_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "holdfast/trace.h"

namespace holdfast::trace {

class TraceRing {
 public:
  // REQUIRES: capacity >= 1.
  explicit TraceRing(size_t capacity);

  TraceRing(const TraceRing&) = delete;
  TraceRing& operator=(const TraceRing&) = delete;

  size_t capacity() const { return capacity_; }

  // Writes `record` (state kEnqueued) into slot record.seq % capacity,
  // replacing whatever was there.
  void Begin(const TraceRecord& record);

  // Moves record `seq` to `state` at `now_ns`. kStarted sets started_ns; a
  // final state sets ended_ns and status_code. No-op if the slot has since
  // been reused by a newer operation.
  void Transition(uint64_t seq, OpState state, int64_t now_ns,
                  int32_t status_code = 0);

  // A consistent copy of every record still in the ring, oldest first.
  std::vector<TraceRecord> Snapshot() const;

 private:
  struct Slot {
    std::atomic<uint64_t> version{0};  // odd while a write is in progress
    std::atomic<uint64_t> seq{0};
    std::atomic<int64_t> generation{0};
    std::atomic<int64_t> coll_seq{-1};
    std::atomic<uint64_t> packed{0};  // op, dtype, reduce, state, peer
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> bytes{0};
    std::atomic<int64_t> enqueued_ns{0};
    std::atomic<int64_t> started_ns{0};
    std::atomic<int64_t> ended_ns{0};
    std::atomic<int32_t> status_code{0};
    std::atomic<uint32_t> tag{0};
    std::atomic<bool> used{false};
  };

  const size_t capacity_;
  std::unique_ptr<Slot[]> slots_;
};

// JSON for `records` (schema in docs/trace-schema.md). `clock_offset_ns` is
// added to monotonic times to give Unix-epoch times in "wall_ns" fields.
std::string ToJson(const std::vector<TraceRecord>& records, int rank, int size,
                   int64_t generation, int64_t now_mono_ns, int64_t now_unix_ns,
                   const std::string& abort_reason);

}  // namespace holdfast::trace

#endif  // HOLDFAST_SRC_TRACE_TRACE_RING_H_
