// The NCCL backend (target holdfast_nccl, built when CMake finds CUDA and
// NCCL): communicators on CUDA device memory with the same contract as the
// Gloo ones: deadlines that never hang, abort from any thread, rendezvous
// keyed by generation through the store (the NCCL unique id travels
// through the controller's key-value store).
//
// Select it with CommunicatorOptions::backend = "nccl" (or
// HOLDFAST_BACKEND=nccl); CommunicatorOptions::device (HOLDFAST_DEVICE,
// else LOCAL_RANK) picks the GPU. Linking holdfast_nccl installs it.
//
// How it keeps the contract (docs/gpu.md):
//   - non-blocking communicators (config.blocking = 0): init, every call and
//     abort return at once; the backend polls ncclCommGetAsyncError until
//     the call is done, the deadline passes, or the communicator is aborted.
//   - each operation records a CUDA event on the communicator's stream; the
//     operation is complete when the event is, and the watchdog's deadline
//     aborts (ncclCommAbort) one that never completes.
//   - an asynchronous NCCL error (a peer gone, a broken link) fails the
//     operation with Unavailable and aborts the communicator.
//
// Thread safety: as for Communicator. DeviceSnapshot: one thread at a time.
#ifndef HOLDFAST_NCCL_H_
#define HOLDFAST_NCCL_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "holdfast/communicator.h"
#include "holdfast/store.h"

namespace holdfast::nccl {

// CUDA devices this process can use (0 without a GPU or driver).
int DeviceCount();

// The NCCL this process runs (ncclGetVersion of the library loaded, e.g.
// 22809 for 2.28.9; -1 if the call fails) and the one holdfast was
// compiled against (NCCL_VERSION_CODE). A process holds one libnccl.so.2
// (in a torch program, torch's); holdfast uses the fault-tolerance calls
// of the version it runs.
int LoadedVersion();
int BuiltVersion();

// Makes Communicator::Create accept backend "nccl". Linking holdfast_nccl
// already does it; idempotent.
void Register();

// The survivors' communicator after the loss of the ranks in `exclude`
// (ranks of `old`): ncclCommShrink while `old` is still usable (its
// in-flight work is aborted first if it has failed), else a fresh init
// through `store` under options.generation. Every survivor calls it with
// the same `exclude`; options.rank and options.size are ignored (the new
// rank is the survivor's position among the survivors). InvalidArgument if
// `old` is not an NCCL communicator or `exclude` is bad.
absl::StatusOr<std::unique_ptr<Communicator>> Shrink(
    Communicator& old, const std::vector<int>& exclude,
    std::shared_ptr<Store> store, const CommunicatorOptions& options);

// The cudaStream_t the communicator's operations run on (as void*), so a
// trainer can order its kernels against them; null for another backend.
// The stream stays valid for the process's life (torch's allocator may
// record events on it after the communicator is gone); a later
// communicator may reuse it once it is idle.
void* Stream(Communicator& comm);

// Waits until the CUDA event `event` (a cudaEvent_t, on the current
// device's context) has completed, polling: OK; DeadlineExceeded after
// `timeout`; Internal naming a CUDA error (a broken context).
absl::Status AwaitEvent(void* event, absl::Duration timeout);

// A snapshot of device memory in pinned host memory: the copy runs
// asynchronously on a side stream, after the work already queued on the
// stream it is told to follow, so training kernels are not stalled by it.
// The host buffer is what a trainer registers with the Runtime.
class DeviceSnapshot {
 public:
  // Pinned host memory of `bytes` on `device`. FailedPrecondition without a
  // device, ResourceExhausted if pinned memory runs out.
  static absl::StatusOr<std::unique_ptr<DeviceSnapshot>> Create(size_t bytes,
                                                                int device);
  virtual ~DeviceSnapshot() = default;

  // Starts copying `bytes` (<= capacity) from device address `src` after the
  // work queued so far on `after_stream` (a cudaStream_t; null: the legacy
  // default stream).
  virtual absl::Status Start(const void* src, size_t bytes,
                             void* after_stream) = 0;
  // Waits for the copy started last. DeadlineExceeded after `timeout`.
  virtual absl::Status Wait(absl::Duration timeout) = 0;
  // Copies the host bytes back to device address `dst` (after a restore);
  // synchronous.
  virtual absl::Status CopyToDevice(void* dst, size_t bytes) = 0;

  virtual void* host() = 0;
  virtual size_t capacity() const = 0;
};

}  // namespace holdfast::nccl

#endif  // HOLDFAST_NCCL_H_
