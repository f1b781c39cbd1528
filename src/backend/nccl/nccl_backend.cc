// The NCCL backend: see include/holdfast/nccl.h for the contract.
//
// Every NCCL call goes through one mutex (a communicator is not safe for
// concurrent calls) and returns at once (non-blocking communicator); the
// waiting happens outside the mutex, polling the call's state, the
// operation's CUDA event, the abort flag and the deadline. Abort takes the
// mutex, marks the backend aborted and stops the communicator; after that
// no operation touches the communicator handle again.
//
// Stopping (HOLDFAST_NCCL_STOP): "abort" calls ncclCommAbort at once
// (about half a second: it joins NCCL's proxy threads). "revoke" (the
// default), where the loaded NCCL has ncclCommRevoke (2.28.7; else it
// aborts), stops the communicator's kernels, waits until
// its streams are idle, and leaves the rest to the Reaper below: the end
// of the revoke (NCCL's own thread stops the proxy threads, whose poll
// wakes every 500 ms) and the teardown, once a newer communicator of the
// process has done an operation, so that neither the member's sight of
// the failure nor the next communicator's init waits for them (see
// docs/gpu.md for what each measured).
//
// Connecting (HOLDFAST_NCCL_PRECONNECT): NCCL connects a communicator's
// peers for an algorithm at the first call that uses it (its "runtime
// connect"), which would put that cost into the first step of every new
// generation. So a new communicator issues, at once and without waiting,
// an all-reduce and an all-gather of a few scratch words; NCCL connects on
// its own thread while the runtime restores state (over the host side
// communicator), and the first real operation waits only for what is left.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "holdfast/status.h"
#include "src/backend/backend.h"
#include "src/backend/nccl/nccl_backend.h"
#include "src/backend/nccl/util.h"
#include "src/common/config.h"
#include "src/common/logging.h"
#include "src/common/thread_util.h"
#include "src/store/keys.h"

namespace holdfast::backend {
namespace {

std::string NcclError(ncclResult_t r, ncclComm_t comm) {
  std::string out = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') absl::StrAppend(&out, " (", last, ")");
  return out;
}

absl::StatusOr<ncclDataType_t> ToNccl(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kUInt8:
    case DataType::kBool:  // 0 or 1; see ToNccl(ReduceOp, DataType)
      return ncclUint8;
    case DataType::kInt8:
      return ncclInt8;
  }
  return absl::InvalidArgumentError("nccl: unknown dtype");
}

// NCCL has no bool: a bool travels as uint8 (0 or 1), where a maximum is
// the logical or (a sum) and a minimum the logical and (a product).
ncclRedOp_t ToNccl(ReduceOp op, DataType dtype) {
  if (dtype == DataType::kBool) {
    if (op == ReduceOp::kSum) return ncclMax;
    if (op == ReduceOp::kProduct) return ncclMin;
  }
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kAverage:
      return ncclAvg;
  }
  return ncclSum;
}

// A communicator's state: ncclSuccess, ncclInProgress (its last call is
// still being taken) or the error it hit.
ncclResult_t CommState(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
  return r != ncclSuccess ? r : state;
}

bool Failed(ncclResult_t state) {
  return state != ncclSuccess && state != ncclInProgress;
}

// While `comm`'s last call is in progress: nullopt. Then OK, or
// Unavailable naming `what` and the error.
std::optional<absl::Status> CallDone(ncclComm_t comm, absl::string_view what) {
  const ncclResult_t state = CommState(comm);
  if (state == ncclInProgress) return std::nullopt;
  if (state == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("nccl: ", what, ": ", NcclError(state, comm)));
}

// Polls a communicator nobody else uses (being built) until its last call
// has finished. DeadlineExceeded at `deadline`.
absl::Status AwaitReady(ncclComm_t comm, absl::Time deadline,
                        absl::string_view what) {
  return PollUntil(deadline, absl::Microseconds(20), absl::Milliseconds(1),
                   absl::StrCat("nccl: ", what, ": not done by its deadline"),
                   [&] { return CallDone(comm, what); });
}

// CUDA streams that live as long as the process. A communicator's stream
// is handed to torch (holdfast.distributed wraps it in an ExternalStream),
// and torch may use it after the communicator has gone: its caching
// allocator records an event on every stream a freed block was used on,
// and a CUDA-aware future's value is recorded on the stream it completed
// on. A destroyed stream's handle is undefined to use, so a communicator
// takes its streams from here and gives them back, and they are never
// destroyed; one given back while work is still queued on it (an aborted
// communicator's kernels) is handed out again only once it is idle.
class StreamPool {
 public:
  // An idle stream of `device` (the current device), or a new one.
  absl::StatusOr<cudaStream_t> Take(int device) {
    {
      absl::MutexLock lock(&mu_);
      for (auto it = given_back_.begin(); it != given_back_.end(); ++it) {
        if (it->first == device && cudaStreamQuery(it->second) == cudaSuccess) {
          cudaStream_t s = it->second;
          given_back_.erase(it);
          return s;
        }
      }
    }
    cudaStream_t s = nullptr;
    const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrCat("nccl: cannot create a stream on device ", device, ": ",
                       CudaError(e)));
    }
    return s;
  }

  void GiveBack(int device, cudaStream_t s) {
    if (s == nullptr) return;
    absl::MutexLock lock(&mu_);
    given_back_.emplace_back(device, s);
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<int, cudaStream_t>> given_back_ ABSL_GUARDED_BY(mu_);
};

StreamPool& Streams() {
  static StreamPool* const pool = new StreamPool;  // never destroyed
  return *pool;
}

// Operations completed by any communicator of the process (the Reaper's
// sign that a newer communicator works).
std::atomic<int64_t> g_ops_done{0};

// Whether Abort revokes (HOLDFAST_NCCL_STOP, and the NCCL loaded has
// ncclCommRevoke) rather than aborting at once.
bool RevokeOnAbort() {
  static const bool revoke = [] {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
    int loaded = 0;
    return config::StringParam("HOLDFAST_NCCL_STOP") == "revoke" &&
           ncclGetVersion(&loaded) == ncclSuccess &&
           loaded >= NCCL_VERSION(2, 28, 7);
#else
    return false;
#endif
  }();
  return revoke;
}

// Whether a new communicator connects its peers at once
// (HOLDFAST_NCCL_PRECONNECT; see the top of this file).
bool PreconnectEnabled() {
  static const bool on = config::StringParam("HOLDFAST_NCCL_PRECONNECT") == "1";
  return on;
}

// Tears revoked communicators down (ncclCommAbort, then the scratch word's
// cudaFree) on a thread of its own, each once its revoke has ended (its
// state is no longer ncclInProgress: NCCL allows management calls only
// then) and an operation of the process completed after it was handed
// over (a newer communicator is up and connected), or 30 s after; at
// process exit, those left at once (each given up to 2 s to end its
// revoke), before CUDA's own teardown (atexit runs in reverse order of
// registration, and CUDA registered first).
class Reaper {
 public:
  static Reaper& Get() {
    static Reaper* const reaper = new Reaper;  // never destroyed
    return *reaper;
  }

  // `revoked_at`: when ncclCommRevoke was called.
  void Add(ncclComm_t comm, void* scratch, int device, absl::Time revoked_at) {
    absl::MutexLock lock(&mu_);
    if (!started_) Start();
    dead_.push_back(Dead{comm, scratch, device, g_ops_done.load(), absl::Now(),
                         revoked_at});
  }

 private:
  struct Dead {
    ncclComm_t comm;
    void* scratch;
    int device;
    int64_t ops_at;  // g_ops_done when handed over
    absl::Time at;
    absl::Time revoked_at;
  };

  void Start() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    started_ = true;
    std::atexit([] { Get().ReapAll(); });
    absl::StatusOr<std::thread> t =
        StartThread("the NCCL reaper", [this] { Loop(); });
    if (t.ok()) t->detach();  // else they are reaped at exit
  }

  void Loop() {
    for (;;) {
      absl::SleepFor(absl::Milliseconds(20));
      absl::MutexLock reaping(&reap_mu_);
      std::optional<Dead> d = Next(/*all=*/false);
      if (d.has_value()) Reap(*d);
    }
  }

  void ReapAll() {
    absl::MutexLock reaping(&reap_mu_);
    for (std::optional<Dead> d; (d = Next(/*all=*/true)).has_value();) {
      Reap(*d);
    }
  }

  // The oldest one due (any, with `all`).
  std::optional<Dead> Next(bool all) {
    absl::MutexLock lock(&mu_);
    if (dead_.empty()) return std::nullopt;
    const Dead& d = dead_.front();
    const bool waited = absl::Now() - d.at >= absl::Seconds(30);
    if (!all && !waited &&
        (g_ops_done.load() <= d.ops_at ||
         CommState(d.comm) == ncclInProgress)) {
      return std::nullopt;
    }
    Dead out = d;
    dead_.pop_front();
    return out;
  }

  static void Reap(const Dead& d) {
    cudaSetDevice(d.device);
    const bool ended =
        PollUntil(absl::Now() + absl::Seconds(2), absl::Microseconds(50),
                  absl::Milliseconds(2), "",
                  [&]() -> std::optional<absl::Status> {
                    if (CommState(d.comm) == ncclInProgress) {
                      return std::nullopt;
                    }
                    return absl::OkStatus();
                  })
            .ok();
    const absl::Time t0 = absl::Now();
    ncclCommAbort(d.comm);
    if (d.scratch != nullptr) cudaFree(d.scratch);
    HOLDFAST_LOG_INFO(
        "nccl: a revoked communicator torn down {} ms after its revoke{} "
        "(ncclCommAbort took {} ms)",
        absl::ToInt64Milliseconds(absl::Now() - d.revoked_at),
        ended ? "" : ", which had not ended",
        absl::ToInt64Milliseconds(absl::Now() - t0));
  }

  absl::Mutex reap_mu_;  // held while one is torn down
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Dead> dead_ ABSL_GUARDED_BY(mu_);
};

class NcclPending final : public PendingP2P {
 public:
  explicit NcclPending(cudaEvent_t done, absl::Time deadline)
      : done_(done), deadline_(deadline) {}
  ~NcclPending() override { cudaEventDestroy(done_); }
  cudaEvent_t done() const { return done_; }
  absl::Time deadline() const { return deadline_; }

 private:
  cudaEvent_t done_;
  absl::Time deadline_;
};

class NcclBackend final : public Backend {
 public:
  NcclBackend(ncclComm_t comm, const BackendOptions& options)
      : comm_(comm), options_(options) {}

  // Streams, events and the barrier's scratch word.
  absl::Status Init() {
    cudaError_t e = cudaSetDevice(options_.device);
    if (e != cudaSuccess) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "nccl: cannot set up device ", options_.device, ": ", CudaError(e)));
    }
    HOLDFAST_ASSIGN_OR_RETURN(stream_, Streams().Take(options_.device));
    HOLDFAST_ASSIGN_OR_RETURN(p2p_stream_, Streams().Take(options_.device));
    e = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    // The barrier's word, then the preconnect all-gather's send word and
    // its receive buffer (a word per rank).
    if (e == cudaSuccess) {
      e = cudaMalloc(&scratch_, sizeof(float) * (2 + options_.size));
    }
    if (e != cudaSuccess) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "nccl: cannot set up device ", options_.device, ": ", CudaError(e)));
    }
    return absl::OkStatus();
  }

  // Issues the preconnect (see the top of this file) and returns without
  // waiting: the next call waits until NCCL has taken it (AwaitPreconnect).
  // Every rank issues it right after its init, so the group's order of
  // calls is the same everywhere. An error here is left to that call.
  void Preconnect() {
    if (!PreconnectEnabled()) return;
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    cudaSetDevice(options_.device);
    float* words = static_cast<float*>(scratch_);
    preconnect_at_ = absl::Now();
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess) {
      r = ncclAllReduce(words, words, 1, ncclFloat32, ncclSum, comm_, stream_);
    }
    if (r == ncclSuccess || r == ncclInProgress) {
      r = ncclAllGather(words + 1, words + 2, 1, ncclFloat32, comm_, stream_);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = end;
    preconnect_pending_ = r == ncclInProgress;
    if (r != ncclSuccess && r != ncclInProgress) {
      HOLDFAST_LOG_WARN("nccl: rank {}: the preconnect failed: {}",
                        options_.rank, NcclError(r, comm_));
    }
  }

  ~NcclBackend() override {
    Abort("communicator destroyed");
    bool revoked = false;
    absl::Time revoked_at;
    {
      absl::MutexLock lock(&mu_);
      revoked = revoked_;
      revoked_at = revoked_at_;
    }
    if (revoked) {
      Reaper::Get().Add(comm_, scratch_, options_.device, revoked_at);
    } else if (scratch_ != nullptr) {
      cudaFree(scratch_);
    }
    if (done_ != nullptr) cudaEventDestroy(done_);
    Streams().GiveBack(options_.device, p2p_stream_);
    Streams().GiveBack(options_.device, stream_);
  }

  absl::string_view name() const override { return "nccl"; }
  MemoryKind memory() const override { return MemoryKind::kCudaDevice; }

  cudaStream_t stream() const { return stream_; }
  int rank() const { return options_.rank; }
  int size() const { return options_.size; }

  absl::Status Run(const OpSpec& op) override {
    const absl::Time deadline = absl::Now() + op.timeout;
    HOLDFAST_RETURN_IF_ERROR(Enqueue(op, stream_, deadline));
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) return Aborted();
      cudaError_t e = cudaEventRecord(done_, stream_);
      if (e != cudaSuccess) {
        return absl::InternalError(
            absl::StrCat("nccl: cudaEventRecord: ", CudaError(e)));
      }
    }
    HOLDFAST_RETURN_IF_ERROR(AwaitEvent(done_, deadline));
    g_ops_done.fetch_add(1);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<PendingP2P>> Post(const OpSpec& op) override {
    const absl::Time deadline = absl::Now() + op.timeout;
    HOLDFAST_RETURN_IF_ERROR(Enqueue(op, p2p_stream_, deadline));
    absl::MutexLock lock(&mu_);
    if (aborted_) return Aborted();
    cudaEvent_t done = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(done, p2p_stream_);
    if (e != cudaSuccess) {
      if (done != nullptr) cudaEventDestroy(done);
      return absl::InternalError(
          absl::StrCat("nccl: posting a point-to-point op: ", CudaError(e)));
    }
    return std::unique_ptr<PendingP2P>(new NcclPending(done, deadline));
  }

  absl::Status Wait(PendingP2P& op) override {
    auto& pending = static_cast<NcclPending&>(op);
    return AwaitEvent(pending.done(), pending.deadline());
  }

  absl::Status CheckPeers() override {
    absl::MutexLock lock(&mu_);
    if (aborted_) return absl::OkStatus();
    const ncclResult_t state = CommState(comm_);
    if (!Failed(state)) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat("nccl: asynchronous error on rank ", options_.rank, " of ",
                     options_.size, ": ", NcclError(state, comm_)));
  }

  // An idle, healthy communicator leaves in an orderly way:
  // ncclCommFinalize (flushes and waits until the group is quiescent),
  // then ncclCommDestroy, instead of tearing it down under peers that may
  // still be connected. One that has failed, or does not finalize within
  // `timeout`, is aborted.
  void Close(absl::Duration timeout) override {
    // Peers never connected (or connecting failed): aborted, below.
    const bool connected =
        AwaitPreconnect(absl::Now() + timeout, "closing").ok();
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) return;
      bool finalizing = connected && !Failed(CommState(comm_));
      if (finalizing) {
        const ncclResult_t r = ncclCommFinalize(comm_);
        finalizing = r == ncclSuccess || r == ncclInProgress;
      }
      if (!finalizing) {
        aborted_ = true;
        reason_ = "communicator closed";
        ncclCommAbort(comm_);
        return;
      }
    }
    absl::Status done = AwaitCallDone(absl::Now() + timeout,
                                      "nccl: ncclCommFinalize did not finish",
                                      "ncclCommFinalize");
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    aborted_ = true;
    reason_ = "communicator closed";
    if (done.ok()) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  void Abort(absl::string_view reason) override {
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    aborted_ = true;
    reason_ = std::string(reason);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
    // Stops the kernels and returns; the end of the revoke and the
    // teardown are the Reaper's (see the top of this file).
    // Until the streams are idle the kernels may still write the buffers
    // of the ops they ran, which the caller owns again once Abort returns:
    // wait for that, up to kQuiesce, and abort if it does not come.
    if (RevokeOnAbort()) {
      constexpr absl::Duration kQuiesce = absl::Seconds(2);
      revoked_at_ = absl::Now();
      const ncclResult_t r = ncclCommRevoke(comm_, NCCL_REVOKE_DEFAULT);
      revoked_ = (r == ncclSuccess || r == ncclInProgress) &&
                 AwaitKernelsStopped(revoked_at_ + kQuiesce).ok();
      HOLDFAST_LOG_INFO("nccl: rank {}: {} after {} ms", options_.rank,
                        revoked_ ? "revoked, its kernels stopped"
                                 : "revoke did not stop the kernels: aborting",
                        absl::ToInt64Milliseconds(absl::Now() - revoked_at_));
      if (revoked_) return;
    }
#endif
    // Kills the kernels and tears the communicator down (about half a
    // second); nobody touches comm_ after this.
    ncclCommAbort(comm_);
  }

  // After ncclCommRevoke: OK once the communicator's streams are idle.
  // Only its kernels, which run on them, write an op's buffers (holdfast
  // registers no buffer with NCCL, so no proxy thread writes one), and
  // the revoke's abort flag ends them; the rest of the revoke (stopping
  // the proxy threads) touches no buffer of the caller's.
  // DeadlineExceeded at `deadline`.
  absl::Status AwaitKernelsStopped(absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return PollUntil(deadline, absl::Microseconds(20), absl::Milliseconds(1),
                     "nccl: ncclCommRevoke: kernels still running by its "
                     "deadline",
                     [&]() -> std::optional<absl::Status> {
                       if (cudaStreamQuery(stream_) == cudaErrorNotReady ||
                           cudaStreamQuery(p2p_stream_) == cudaErrorNotReady) {
                         return std::nullopt;
                       }
                       return absl::OkStatus();
                     });
  }

  // Shrink (include/holdfast/nccl.h): the new communicator, or an error
  // after which the caller falls back to a fresh init.
  absl::StatusOr<ncclComm_t> ShrinkComm(const std::vector<int>& exclude,
                                        absl::Duration timeout) {
    HOLDFAST_RETURN_IF_ERROR(
        AwaitPreconnect(absl::Now() + timeout, "ncclCommShrink"));
    ncclComm_t fresh = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) {
        return absl::FailedPreconditionError(
            "nccl: the old communicator was aborted; it cannot be shrunk");
      }
      const int flags =
          Failed(CommState(comm_)) ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      std::vector<int> ranks = exclude;
      ncclResult_t r =
          ncclCommShrink(comm_, ranks.data(), static_cast<int>(ranks.size()),
                         &fresh, &config, flags);
      if (r != ncclSuccess && r != ncclInProgress) {
        return absl::UnavailableError(
            absl::StrCat("nccl: ncclCommShrink: ", NcclError(r, comm_)));
      }
    }
    absl::Status s = AwaitReady(fresh, absl::Now() + timeout, "ncclCommShrink");
    if (!s.ok()) {
      ncclCommAbort(fresh);
      return s;
    }
    return fresh;
  }

 private:
  absl::Status Aborted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::AbortedError(absl::StrCat("nccl: aborted: ", reason_));
  }

  // The NCCL call (or group) of `op` on `stream`.
  ncclResult_t IssueLocked(const OpSpec& op, ncclDataType_t dt,
                           cudaStream_t stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (op.type) {
      case OpType::kAllReduce:
        return ncclAllReduce(op.recv, op.recv, op.count, dt,
                             ToNccl(op.reduce, op.dtype), comm_, stream);
      case OpType::kBroadcast:
        return ncclBroadcast(op.recv, op.recv, op.count, dt, op.peer, comm_,
                             stream);
      case OpType::kAllGather:
        return ncclAllGather(op.send, op.recv, op.count, dt, comm_, stream);
      case OpType::kReduceScatter:
        return ncclReduceScatter(op.send, op.recv, op.count, dt,
                                 ToNccl(op.reduce, op.dtype), comm_, stream);
      case OpType::kAllToAll:
        return AllToAllLocked(op, dt, stream);
      case OpType::kBarrier:
        return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_,
                             stream);
      case OpType::kSend:
        return ncclSend(op.send, op.count, dt, op.peer, comm_, stream);
      case OpType::kRecv:
        return ncclRecv(op.recv, op.count, dt, op.peer, comm_, stream);
    }
    return ncclInvalidArgument;
  }

  // An all-to-all: a send and a receive per peer, in one group.
  ncclResult_t AllToAllLocked(const OpSpec& op, ncclDataType_t dt,
                              cudaStream_t stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t block = op.count * DataTypeSize(op.dtype);
    ncclResult_t r = ncclGroupStart();
    // Inside a group a non-blocking call may answer ncclInProgress; the
    // group's end (polled by Enqueue) tells when all are taken.
    for (int peer = 0;
         peer < options_.size && (r == ncclSuccess || r == ncclInProgress);
         ++peer) {
      r = ncclSend(static_cast<const char*>(op.send) + peer * block, op.count,
                   dt, peer, comm_, stream);
      if (r == ncclSuccess || r == ncclInProgress) {
        r = ncclRecv(static_cast<char*>(op.recv) + peer * block, op.count, dt,
                     peer, comm_, stream);
      }
    }
    const ncclResult_t end = ncclGroupEnd();
    return r == ncclSuccess || r == ncclInProgress ? end : r;
  }

  // Until comm_'s last call is done: OK, or its error (naming `what`);
  // Aborted once the backend is; DeadlineExceeded(`late`) at `deadline`.
  // Polls under the mutex per poll, so Abort can slip in.
  absl::Status AwaitCallDone(absl::Time deadline, const std::string& late,
                             absl::string_view what) {
    return PollUntil(deadline, absl::Microseconds(20), absl::Milliseconds(1),
                     late, [&]() -> std::optional<absl::Status> {
                       absl::MutexLock lock(&mu_);
                       if (aborted_) return Aborted();
                       return CallDone(comm_, what);
                     });
  }

  // Until the preconnect has been taken by NCCL (its connections are set
  // up), or `deadline`; then its error, if it failed. Logs how long the
  // connections took and how long the caller waited for them.
  absl::Status AwaitPreconnect(absl::Time deadline, absl::string_view what) {
    {
      absl::MutexLock lock(&mu_);
      if (!preconnect_pending_) return absl::OkStatus();
    }
    const absl::Time t0 = absl::Now();
    absl::Status s = AwaitCallDone(
        deadline,
        absl::StrCat("nccl: ", what,
                     ": the communicator's peers were not connected by its "
                     "deadline"),
        "connecting the peers");
    absl::MutexLock lock(&mu_);
    if (s.ok() || !absl::IsDeadlineExceeded(s)) preconnect_pending_ = false;
    HOLDFAST_LOG_INFO(
        "nccl: rank {} of {} (generation {}): peers connected {} ms after "
        "init{}; the first call waited {} ms for it",
        options_.rank, options_.size, options_.generation,
        absl::ToInt64Milliseconds(absl::Now() - preconnect_at_),
        s.ok() ? "" : absl::StrCat(" (", s.message(), ")"),
        absl::ToInt64Milliseconds(absl::Now() - t0));
    return s;
  }

  // Issues `op` on `stream` and waits until NCCL has taken it (the call of
  // a non-blocking communicator may still be in progress when it returns).
  absl::Status Enqueue(const OpSpec& op, cudaStream_t stream,
                       absl::Time deadline) {
    HOLDFAST_ASSIGN_OR_RETURN(ncclDataType_t dt, ToNccl(op.dtype));
    HOLDFAST_RETURN_IF_ERROR(AwaitPreconnect(deadline, OpTypeName(op.type)));
    ncclResult_t r = ncclSuccess;
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) return Aborted();
      cudaSetDevice(options_.device);
      if (op.after_event != nullptr) {
        const cudaError_t e = cudaStreamWaitEvent(
            stream, static_cast<cudaEvent_t>(op.after_event), 0);
        if (e != cudaSuccess) {
          NoteCudaError(e, "nccl: ordering an op after the caller's stream");
          return absl::InvalidArgumentError(absl::StrCat(
              "nccl: ", OpTypeName(op.type),
              ": cannot wait for the caller's event: ", CudaError(e)));
        }
      }
      r = IssueLocked(op, dt, stream);
      if (r != ncclSuccess && r != ncclInProgress) {
        return absl::UnavailableError(absl::StrCat(
            "nccl: ", OpTypeName(op.type), ": ", NcclError(r, comm_)));
      }
    }
    if (r == ncclInProgress) {
      HOLDFAST_RETURN_IF_ERROR(
          AwaitCallDone(deadline,
                        absl::StrCat("nccl: ", OpTypeName(op.type),
                                     " was not taken by its deadline"),
                        OpTypeName(op.type)));
    }
    // On the stream now: the caller may order its own work after it.
    if (op.on_queued) op.on_queued(stream);
    return absl::OkStatus();
  }

  // Waits for `event`: the operation's completion on the device.
  absl::Status AwaitEvent(cudaEvent_t event, absl::Time deadline) {
    cudaSetDevice(options_.device);  // this thread may not have it yet
    return PollUntil(
        deadline, absl::Microseconds(5), absl::Microseconds(500),
        "nccl: the operation did not complete on the device by its deadline",
        [&]() -> std::optional<absl::Status> {
          absl::MutexLock lock(&mu_);
          if (aborted_) return Aborted();
          const cudaError_t e = cudaEventQuery(event);
          if (e == cudaSuccess) return absl::OkStatus();
          if (e != cudaErrorNotReady) {
            NoteCudaError(e, "nccl: waiting for an operation");
            return absl::InternalError(
                absl::StrCat("nccl: waiting for an operation: ", CudaError(e)));
          }
          const ncclResult_t state = CommState(comm_);
          if (Failed(state)) {
            return absl::UnavailableError(absl::StrCat(
                "nccl: asynchronous error: ", NcclError(state, comm_)));
          }
          return std::nullopt;
        });
  }

  ncclComm_t comm_;
  const BackendOptions options_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t p2p_stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  void* scratch_ = nullptr;
  absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  // Aborted by ncclCommRevoke: comm_ still to be torn down (the Reaper).
  bool revoked_ ABSL_GUARDED_BY(mu_) = false;
  // The preconnect's group call may still be in progress (Preconnect).
  bool preconnect_pending_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time preconnect_at_ ABSL_GUARDED_BY(mu_);
  absl::Time revoked_at_ ABSL_GUARDED_BY(mu_);
  std::string reason_ ABSL_GUARDED_BY(mu_);
};

absl::Status CheckDevice(int device) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "nccl: no CUDA device is usable here (cudaGetDeviceCount: ",
        e == cudaSuccess ? "0 devices" : CudaError(e),
        "); use backend 'gloo' on machines without a GPU"));
  }
  if (device < 0 || device >= n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl: device ", device, " does not exist (this process sees ", n,
        " CUDA device", n == 1 ? "" : "s", ")"));
  }
  return absl::OkStatus();
}

// Why the rendezvous of `options` is abandoned (BackendOptions::cancelled),
// polled at most every 5 ms; nullopt while it goes on.
class CancelPoll {
 public:
  explicit CancelPoll(const BackendOptions& options) : options_(options) {}
  std::optional<std::string> operator()() {
    const absl::Time now = absl::Now();
    if (options_.cancelled == nullptr || now < next_) return std::nullopt;
    next_ = now + absl::Milliseconds(5);
    return options_.cancelled();
  }

 private:
  const BackendOptions& options_;
  absl::Time next_ = absl::InfinitePast();
};

// The unique id rank 0 put under `key`, waited for until `deadline` or
// until the rendezvous is abandoned (Aborted).
absl::StatusOr<std::string> AwaitUniqueId(Store& store, const std::string& key,
                                          absl::Time deadline,
                                          const BackendOptions& options) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    absl::StatusOr<std::string> bytes = store.Get(
        key, std::clamp(left, absl::Milliseconds(1), absl::Milliseconds(100)));
    if (bytes.ok() || !absl::IsDeadlineExceeded(bytes.status()) ||
        left <= absl::Milliseconds(100)) {
      return bytes;
    }
    if (options.cancelled != nullptr) {
      if (std::optional<std::string> why = options.cancelled()) {
        return absl::AbortedError(absl::StrCat("nccl: ", *why));
      }
    }
  }
}

// A fresh communicator of options.size ranks: the unique id goes through
// `store` under the generation's key. A rendezvous abandoned meanwhile
// (BackendOptions::cancelled: a newer generation opened) ends it with
// Aborted, the half-built communicator aborted.
absl::StatusOr<ncclComm_t> InitComm(Store& store,
                                    const BackendOptions& options) {
  HOLDFAST_RETURN_IF_ERROR(CheckDevice(options.device));
  HOLDFAST_RETURN_IF_ERROR(BrokenContext());
  cudaError_t ce = cudaSetDevice(options.device);
  if (ce != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "nccl: cudaSetDevice(", options.device, "): ", CudaError(ce)));
  }
  const std::string key = keys::NcclUniqueId(options.generation);
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  ncclUniqueId id;
  if (options.rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      return absl::UnavailableError(
          absl::StrCat("nccl: ncclGetUniqueId: ", ncclGetErrorString(r)));
    }
    HOLDFAST_RETURN_IF_ERROR(store.Set(
        key,
        absl::string_view(reinterpret_cast<const char*>(&id), sizeof(id))));
  } else {
    HOLDFAST_ASSIGN_OR_RETURN(std::string bytes,
                              AwaitUniqueId(store, key, deadline, options));
    if (bytes.size() != sizeof(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl: the unique id under '", key, "' has ",
                       bytes.size(), " bytes, ", sizeof(id), " expected"));
    }
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r =
      ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    HOLDFAST_RETURN_IF_ERROR(BrokenContext());
    return absl::UnavailableError(
        absl::StrCat("nccl: ncclCommInitRankConfig: ", ncclGetErrorString(r)));
  }
  CancelPoll cancelled(options);
  absl::Status s =
      PollUntil(deadline, absl::Microseconds(20), absl::Milliseconds(1),
                "nccl: init: not done by its deadline",
                [&]() -> std::optional<absl::Status> {
                  if (std::optional<std::string> why = cancelled()) {
                    return absl::AbortedError(absl::StrCat("nccl: ", *why));
                  }
                  return CallDone(comm, "init");
                });
  if (!s.ok()) {
    ncclCommAbort(comm);
    HOLDFAST_RETURN_IF_ERROR(BrokenContext());
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "nccl: rank ", options.rank, " of ", options.size, " (generation ",
          options.generation, "): the group did not assemble within ",
          absl::FormatDuration(options.connect_timeout),
          "; the half-built communicator was aborted"));
    }
    return s;
  }
  return comm;
}

// A one-rank communicator built and destroyed: NCCL loads its device code
// for `device` at a process's first init (the "kernels" part of NCCL's init
// timings, about 0.5 s on an H100), once.
absl::Status WarmNccl(int device) {
  HOLDFAST_RETURN_IF_ERROR(CheckDevice(device));
  HOLDFAST_RETURN_IF_ERROR(BrokenContext());
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitAll(&comm, 1, &device);
  if (r != ncclSuccess) {
    if (comm != nullptr) ncclCommAbort(comm);
    return absl::UnavailableError(absl::StrCat(
        "nccl: warming up device ", device, ": ", ncclGetErrorString(r)));
  }
  ncclCommDestroy(comm);
  return absl::OkStatus();
}

// Makes `device` the calling thread's current device (BindDevice).
absl::Status BindNcclDevice(int device) {
  HOLDFAST_RETURN_IF_ERROR(CheckDevice(device));
  const cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl: cudaSetDevice(", device, "): ", CudaError(e)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend>> Wrap(ncclComm_t comm,
                                              const BackendOptions& options) {
  auto backend = std::make_unique<NcclBackend>(comm, options);
  HOLDFAST_RETURN_IF_ERROR(backend->Init());
  backend->Preconnect();
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateNcclBackend(
    std::shared_ptr<Store> store, const BackendOptions& options) {
  HOLDFAST_ASSIGN_OR_RETURN(ncclComm_t comm, InitComm(*store, options));
  return Wrap(comm, options);
}

bool IsNccl(Backend* b) { return dynamic_cast<NcclBackend*>(b) != nullptr; }

void* NcclStream(Backend* b) {
  auto* nccl = dynamic_cast<NcclBackend*>(b);
  return nccl == nullptr ? nullptr : static_cast<void*>(nccl->stream());
}

absl::StatusOr<std::unique_ptr<Backend>> ShrinkNccl(
    Backend* old, const std::vector<int>& exclude, Store& store,
    const BackendOptions& options) {
  auto* b = dynamic_cast<NcclBackend*>(old);
  if (b == nullptr) {
    return absl::InvalidArgumentError(
        "nccl::Shrink: the communicator is not an NCCL one");
  }
  absl::StatusOr<ncclComm_t> shrunk =
      b->ShrinkComm(exclude, options.connect_timeout);
  if (shrunk.ok()) return Wrap(*shrunk, options);
  // The old communicator cannot be shrunk: a fresh init of the survivors.
  HOLDFAST_ASSIGN_OR_RETURN(ncclComm_t comm, InitComm(store, options));
  return Wrap(comm, options);
}

int NcclLoadedVersion() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : -1;
}

int NcclBuiltVersion() { return NCCL_VERSION_CODE; }

int NcclDeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

namespace {
void Install() {
  SetNcclFactory(&CreateNcclBackend);
  SetNcclWarmer(&WarmNccl);
  SetNcclBinder(&BindNcclDevice);
}

// Installs the factory when holdfast_nccl is linked (CMake forces this
// object in with --undefined=holdfast_nccl_anchor).
const bool kRegistered = [] {
  Install();
  return true;
}();
}  // namespace

void RegisterNccl() {
  (void)kRegistered;
  Install();
}

}  // namespace holdfast::backend

extern "C" {
// Referenced by the link option of holdfast_nccl; see kRegistered.
int holdfast_nccl_anchor = 0;
}
