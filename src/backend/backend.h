// Backend: one communicator of one generation over a concrete transport
// (Gloo over TCP in src/backend/gloo, NCCL in src/backend/nccl). Created from a
// rendezvous store, rank and size. Backends know nothing of the controller,
// deadlines' policy or tracing: src/comm/ layers those on top.
//
// Threading: Run is called from one thread at a time (the communicator's
// worker); Post and Wait from others, concurrently with Run. Abort may be
// called from any thread at any time.
#ifndef HOLDFAST_SRC_BACKEND_BACKEND_H_
#define HOLDFAST_SRC_BACKEND_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "holdfast/store.h"
#include "holdfast/types.h"

namespace holdfast::backend {

// One operation, already validated by the communicator.
struct OpSpec {
  OpType type = OpType::kBarrier;
  const void* send = nullptr;  // AllGather, ReduceScatter, AllToAll, Send
  void* recv = nullptr;        // everything else, and the in-place ops
  size_t count = 0;            // as in the Communicator call
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce = ReduceOp::kSum;
  int peer = -1;  // Broadcast root, Send/Recv peer
  // Matching tag: derived from the op's signature, so operations that differ
  // across ranks never match each other (they time out instead of
  // exchanging bytes of the wrong size).
  uint32_t tag = 0;
  // Transport-level time limit; a safety net behind the watchdog.
  absl::Duration timeout = absl::Seconds(60);
  // A device backend (NCCL): the cudaEvent_t the op waits for on its
  // stream (may be null), and the call it makes with that stream once the
  // op is queued there (may be null). Host backends ignore both; see
  // OpOptions.
  void* after_event = nullptr;
  std::function<void(void* stream)> on_queued;
};

struct BackendOptions {
  int rank = 0;
  int size = 1;
  int64_t generation = 0;
  std::string bind_address;
  std::string interface;
  absl::Duration connect_timeout = absl::Seconds(60);
  int device = 0;  // CUDA device (NCCL)
  // The key of the Gloo pairs' handshake (CommunicatorOptions::link_secret).
  std::string link_secret;
  // Polled while the rendezvous waits; a reason stops it with Aborted.
  std::function<std::optional<std::string>()> cancelled;
};

// A posted Send or Recv; owned by the caller until Wait returns.
class PendingP2P {
 public:
  virtual ~PendingP2P() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual absl::string_view name() const = 0;
  // Where the buffers of its ops must live.
  virtual MemoryKind memory() const = 0;

  // Runs `op` to completion. Errors: Unavailable when a peer's connection is
  // lost (the peer's rank attached with SetPeer when known), DeadlineExceeded
  // when the transport's own time limit passes, Aborted after Abort(),
  // Internal for a transport bug.
  virtual absl::Status Run(const OpSpec& op) = 0;

  // Posts a Send or Recv without waiting for the peer, so that point-to-point
  // patterns (rings, pipelines) cannot deadlock behind one another. May be
  // called concurrently with Run. Errors as for Run.
  virtual absl::StatusOr<std::unique_ptr<PendingP2P>> Post(
      const OpSpec& op) = 0;
  // Blocks until a posted op completes (or fails, or Abort is called).
  virtual absl::Status Wait(PendingP2P& op) = 0;

  // Returns Unavailable (peer attached with SetPeer) if the connection to a
  // peer has failed, OK otherwise; operations stranded on a failed connection
  // are woken with its error. Thread-safe; cheap enough for every watchdog
  // tick while operations are in flight.
  virtual absl::Status CheckPeers() = 0;

  // The TCP segments this rank has retransmitted to each peer on its
  // connection since the backend was built (indexed by rank; 0 for itself,
  // -1 where unknown). Empty: the backend does not say (NCCL). Thread-safe.
  virtual std::vector<int64_t> PeerRetransmits() { return {}; }

  // Makes a Run in progress return within milliseconds and every later Run
  // fail with Aborted. Closes the connections, so peers blocked on this rank
  // see the loss at once. Idempotent.
  virtual void Abort(absl::string_view reason) = 0;

  // Leaves the group in an orderly way, for an idle backend whose rank is
  // done with it: tells each peer it is going, waiting up to `timeout` for
  // the messages to be sent, then closes as Abort does. A peer told so does
  // not count this rank's going as a failure (CheckPeers) unless one of its
  // own ops needed this rank. The default is Abort.
  virtual void Close(absl::Duration timeout) {
    (void)timeout;
    Abort("communicator closed");
  }
};

// Gloo over TCP. Connects a full mesh through `store` (keys are namespaced
// by generation). DeadlineExceeded if the group does not assemble within
// options.connect_timeout; Unavailable if the transport cannot be set up.
absl::StatusOr<std::unique_ptr<Backend>> CreateGlooBackend(
    std::shared_ptr<Store> store, const BackendOptions& options);

// NCCL over CUDA, when the build has it: the holdfast_nccl library installs
// its factory when it is linked (see src/backend/nccl/nccl_backend.cc).
using BackendFactory = absl::StatusOr<std::unique_ptr<Backend>> (*)(
    std::shared_ptr<Store> store, const BackendOptions& options);
void SetNcclFactory(BackendFactory factory);
BackendFactory NcclFactory();
// What a process does ahead of its first communicator of a backend, so
// that building one later is quick: for NCCL, loading its device code onto
// `device` (about half a second, once per process), which a standby does
// while it waits for a slot. OK, and nothing done, for the other backends.
using BackendWarmer = absl::Status (*)(int device);
void SetNcclWarmer(BackendWarmer warmer);
absl::Status Warm(absl::string_view name, int device);
// Makes `device` the calling thread's current device for backend `name`
// (NCCL: cudaSetDevice), as building a communicator of it does on the
// thread that builds it: a trainer whose communicator was built on
// another thread still finds its device current. OK, and nothing done,
// for the other backends and where NCCL is not linked.
using DeviceBinder = absl::Status (*)(int device);
void SetNcclBinder(DeviceBinder binder);
absl::Status BindDevice(absl::string_view name, int device);
// Whether the buffers of backend `name`'s ops live in host memory: false
// for NCCL, true for Gloo (and for a name no backend has: building one
// refuses it).
bool TakesHostMemory(absl::string_view name);
// Whether backend `name` can be built in this program: FailedPrecondition
// naming the library to link when it is known but not linked ("nccl");
// OK otherwise (an unknown name is refused when a communicator is built).
absl::Status CheckLinked(absl::string_view name);

}  // namespace holdfast::backend

#endif  // HOLDFAST_SRC_BACKEND_BACKEND_H_
