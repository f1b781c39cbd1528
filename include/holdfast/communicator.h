// Communicator: one rank of one group of one generation, with collectives
// that never hang. Every operation has a deadline; a watchdog aborts the
// communicator when one passes, and a lost peer aborts it too. After an
// abort every in-flight and later operation fails fast; a failed communicator
// is never repaired, it is replaced by a new one (a new generation).
//
// Thread safety: all methods may be called from any thread. Operations run
// in the order they are issued, one at a time; every rank must issue the
// same collectives in the same order. Abort() may be called at any time,
// also while other threads wait on a collective.
#ifndef HOLDFAST_COMMUNICATOR_H_
#define HOLDFAST_COMMUNICATOR_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "holdfast/options.h"
#include "holdfast/store.h"
#include "holdfast/trace.h"
#include "holdfast/types.h"
#include "holdfast/work.h"

namespace holdfast {

class Communicator {
 public:
  // Connects this rank to the group through `store` (the rendezvous), using
  // Gloo's TCP transport. Blocks until every rank has arrived or
  // `options.connect_timeout` passes (DeadlineExceeded).
  // InvalidArgument for a rank outside [0, size), size < 1 or a bad option.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(
      std::shared_ptr<Store> store, const CommunicatorOptions& options);

  // Destruction aborts anything still in flight and joins the internal
  // threads; it never waits for a peer to act. A rank with nothing in
  // flight leaves in an orderly way (Gloo: a few bytes written to each
  // peer's connection, for at most 500 ms in all, which only a peer that
  // stopped reading can make it take): its peers' ops that no longer need
  // it go on, where a crashed rank fails every peer's op in flight
  // (Unavailable). A peer's op that does need it fails at once with
  // Unavailable, "rank R ... closed its communicator".
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int64_t generation() const = 0;
  // The transport: "gloo" or "nccl".
  virtual absl::string_view backend_name() const = 0;
  // Where the buffers of its ops must live.
  virtual MemoryKind memory() const = 0;

  // ---- Collectives --------------------------------------------------------
  // Every call returns a non-null Work. Argument errors (null buffer, root
  // out of range, unknown dtype or reduction) give a Work already failed with
  // InvalidArgument. Buffers must stay valid until Work::Wait returns.

  // In place: `data` holds `count` elements on entry and the reduction on
  // return.
  virtual std::shared_ptr<Work> AllReduce(void* data, size_t count,
                                          DataType dtype, ReduceOp op,
                                          const OpOptions& options = {}) = 0;

  // `data` (count elements) is sent by `root` and received by all others.
  virtual std::shared_ptr<Work> Broadcast(void* data, size_t count,
                                          DataType dtype, int root,
                                          const OpOptions& options = {}) = 0;

  // `send` holds `count` elements; `recv` gets size() * count elements, rank
  // r's block at offset r * count.
  virtual std::shared_ptr<Work> AllGather(const void* send, void* recv,
                                          size_t count, DataType dtype,
                                          const OpOptions& options = {}) = 0;

  // `send` holds size() * count elements; `recv` gets `count` elements: the
  // reduction of every rank's block number rank().
  virtual std::shared_ptr<Work> ReduceScatter(
      const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
      const OpOptions& options = {}) = 0;

  // `send` holds size() blocks of `count` elements, block j for rank j;
  // `recv` gets size() blocks, block j from rank j.
  virtual std::shared_ptr<Work> AllToAll(const void* send, void* recv,
                                         size_t count, DataType dtype,
                                         const OpOptions& options = {}) = 0;

  virtual std::shared_ptr<Work> Barrier(const OpOptions& options = {}) = 0;

  // ---- Point to point -----------------------------------------------------
  // A Send matches the Recv on `peer` with the same tag, count and dtype, in
  // issue order. A mismatch never completes: it fails at its deadline.
  virtual std::shared_ptr<Work> Send(const void* data, size_t count,
                                     DataType dtype, int peer,
                                     const OpOptions& options = {}) = 0;
  virtual std::shared_ptr<Work> Recv(void* data, size_t count, DataType dtype,
                                     int peer,
                                     const OpOptions& options = {}) = 0;

  // ---- Failure handling ---------------------------------------------------
  // Aborts the communicator: in-flight and queued operations fail with
  // Aborted (carrying `reason`), and so does every later call. Idempotent;
  // the first reason wins. Returns within milliseconds; threads waiting on
  // this communicator's Work are released within about 100 ms.
  virtual void Abort(absl::string_view reason = "aborted by the caller") = 0;

  // OK while usable; otherwise the status that caused the abort.
  virtual absl::Status health() const = 0;

  // ---- Tracing ------------------------------------------------------------
  // The trace ring as JSON (schema in docs/trace-schema.md), oldest first.
  virtual std::string DumpTrace() const = 0;
  // The ring's records, oldest first.
  virtual std::vector<TraceRecord> TraceSnapshot() const = 0;

  // ---- Link health --------------------------------------------------------
  // The TCP segments this rank has retransmitted to each peer since the
  // communicator was built, by rank (0 for itself, -1 where unknown): a
  // lossy data link shows here before it fails anything. Empty where the
  // backend does not say (NCCL).
  virtual std::vector<int64_t> PeerRetransmits() const { return {}; }
};

}  // namespace holdfast

#endif  // HOLDFAST_COMMUNICATOR_H_
