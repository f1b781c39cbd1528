// CommunicatorImpl: turns a Backend into a Communicator that never hangs.
//
// Collectives are queued and run in issue order by one worker thread.
// Send/Recv are posted to the transport at once (so point-to-point patterns
// cannot deadlock behind each other) and completed by a second thread. A
// watchdog thread compares every queued or running operation's deadline with
// the clock; the first one missed aborts the communicator. A backend error
// (a lost peer) aborts it too. Aborting fails everything in flight, leaves an
// abort notice in the store (so peers that see this rank's connections close
// learn why), closes the transport, and dumps the trace ring.
//
// Threading: public methods are thread-safe. mu_ guards the queue and the
// abort state; the backend is driven by the worker alone, except Abort().
#ifndef HOLDFAST_SRC_COMM_COMMUNICATOR_IMPL_H_
#define HOLDFAST_SRC_COMM_COMMUNICATOR_IMPL_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "holdfast/clock.h"
#include "holdfast/communicator.h"
#include "src/backend/backend.h"
#include "src/comm/work_impl.h"
#include "src/fault/hooks.h"
#include "src/trace/trace_ring.h"

namespace holdfast::comm {

// The backend's part of a communicator's options.
backend::BackendOptions ToBackendOptions(const CommunicatorOptions& options);

class CommunicatorImpl final : public Communicator, private InlineRunner {
 public:
  // Takes ownership of a connected backend. `store` is where abort notices
  // are written and read. `faults` (may be null): the `fail-op` faults of
  // the runtime that builds this communicator, which count its collectives.
  CommunicatorImpl(const CommunicatorOptions& options,
                   std::shared_ptr<Store> store,
                   std::unique_ptr<backend::Backend> backend,
                   std::shared_ptr<fault::Hooks> faults = nullptr);
  ~CommunicatorImpl() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  int64_t generation() const override { return options_.generation; }
  absl::string_view backend_name() const override { return backend_->name(); }
  MemoryKind memory() const override { return backend_->memory(); }
  // The transport (for backend-specific extensions such as NCCL's shrink).
  backend::Backend* backend() const { return backend_.get(); }

  std::shared_ptr<Work> AllReduce(void* data, size_t count, DataType dtype,
                                  ReduceOp op,
                                  const OpOptions& options) override;
  std::shared_ptr<Work> Broadcast(void* data, size_t count, DataType dtype,
                                  int root, const OpOptions& options) override;
  std::shared_ptr<Work> AllGather(const void* send, void* recv, size_t count,
                                  DataType dtype,
                                  const OpOptions& options) override;
  std::shared_ptr<Work> ReduceScatter(const void* send, void* recv,
                                      size_t count, DataType dtype, ReduceOp op,
                                      const OpOptions& options) override;
  std::shared_ptr<Work> AllToAll(const void* send, void* recv, size_t count,
                                 DataType dtype,
                                 const OpOptions& options) override;
  std::shared_ptr<Work> Barrier(const OpOptions& options) override;
  std::shared_ptr<Work> Send(const void* data, size_t count, DataType dtype,
                             int peer, const OpOptions& options) override;
  std::shared_ptr<Work> Recv(void* data, size_t count, DataType dtype, int peer,
                             const OpOptions& options) override;

  void Abort(absl::string_view reason) override;
  absl::Status health() const override;
  std::string DumpTrace() const override;
  std::vector<TraceRecord> TraceSnapshot() const override;
  std::vector<int64_t> PeerRetransmits() const override {
    return backend_->PeerRetransmits();
  }

 private:
  struct Pending {
    backend::OpSpec spec;
    TraceRecord record;
    std::shared_ptr<WorkImpl> work;
    int64_t deadline_ns = 0;
    absl::Duration timeout;
    // CLOCK_MONOTONIC at issue, for scheduling only (deadlines use clock_).
    int64_t issued_ns = 0;
    // Set when the op's outcome was decided by an abort; wins over whatever
    // the backend returns.
    std::optional<absl::Status> forced;
    // True once the ring holds this op's final state.
    bool traced_final = false;
    // Send/Recv: the posted transport op, or why posting failed.
    std::unique_ptr<backend::PendingP2P> posted;
    absl::Status post_status;
  };

  // Validates, numbers, traces and queues one operation.
  std::shared_ptr<Work> Submit(backend::OpSpec spec, uint64_t bytes,
                               const OpOptions& options);
  absl::Status Validate(const backend::OpSpec& spec) const;
  // A call refused before it was numbered: `valid`'s error, or the abort.
  std::shared_ptr<Work> RefuseLocked(const TraceRecord& r,
                                     const absl::Status& valid,
                                     const OpOptions& options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The position `spec` matches at: the next collective, or the next
  // Send/Recv with its peer and tag. May turn a collective into an
  // injected mismatch (spec and r change).
  int64_t MatchLocked(backend::OpSpec& spec, TraceRecord& r,
                      const OpOptions& options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts Send/Recv `p` to the transport and hands it to the p2p thread.
  void PostLocked(const std::shared_ptr<Pending>& p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void WorkerLoop();
  // Runs collective `seq` on the calling thread if it is at the head of the
  // queue and nothing is running; otherwise does nothing.
  void RunInline(uint64_t seq) override;
  // Runs `p` (already claimed as running_) through the backend.
  void Execute(const std::shared_ptr<Pending>& p);
  void P2PLoop();
  void WatchdogLoop();
  // One pass of the watchdog: an op past its deadline (a running one is
  // compared with its peers' first), then, with ops in flight, the peers.
  struct WatchdogTick {
    absl::Status cause;
    std::vector<std::shared_ptr<Pending>> finish;
    bool began = false;  // an abort began; CompleteAbort finishes it
    std::shared_ptr<Pending> timed_out;  // to compare with the peers'
  };
  void ExpireLocked(WatchdogTick* tick) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ConfirmTimeout(WatchdogTick* tick);
  void CheckPeersOnce();
  // The op this rank is in, for a failure no op reported: the running
  // collective, else the oldest Send/Recv; null if none.
  Pending* InProgressLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the waiters of ops still inside the transport long after an
  // abort.
  void ReleaseStuckLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the transport's `result` for `p` (aborting the communicator if
  // it failed first here) and finishes its Work.
  void Complete(const std::shared_ptr<Pending>& p, absl::Status result);

  // Decides the outcome of every op in flight: `trigger` (if any) fails with
  // `cause`, everything else with Aborted. Returns false if the communicator
  // was already aborted. Queued ops to finish are appended to `finish`.
  bool BeginAbortLocked(absl::Status cause, Pending* trigger,
                        std::vector<std::shared_ptr<Pending>>* finish)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Both halves, for a caller that holds no lock and whose trigger (if any)
  // it owns: the op it just ran, or none.
  void AbortWith(const absl::Status& cause, Pending* trigger)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The unlocked half: notice, transport abort, trace dump, finishing.
  void CompleteAbort(const absl::Status& cause,
                     std::vector<std::shared_ptr<Pending>> finish);
  // For a backend error naming a peer, the peer's own abort notice (if it
  // left one) explains the loss better than "connection closed". When it
  // names a collective at the position of `running` (the one this rank is
  // in, or its Send/Recv) with another signature, a mismatch (see
  // MismatchWith).
  absl::Status ExplainFailure(const absl::Status& error,
                              const std::optional<TraceRecord>& running);
  // A collective that timed out: this rank leaves a notice naming it, then
  // reads the notices of up to kMismatchPeers peers (for at most
  // kMismatchBudget, and not after a store error); if one of them is in a
  // different collective at the same position, a collective mismatch
  // (InvalidArgument naming both) instead of `cause`. A Send or Recv that
  // timed out: the same with its peer's notice alone.
  absl::Status DiagnoseTimeout(const TraceRecord& mine,
                               const absl::Status& cause);
  // This rank's abort notice: why, and the collective (or the Send/Recv)
  // it was in, if any.
  // The store's error is logged and returned.
  absl::Status WriteNotice(const absl::Status& cause,
                           const std::optional<TraceRecord>& op);
  // Peer `rank`'s abort notice if it left a well-formed one (else nullopt),
  // or the store's error.
  absl::StatusOr<std::optional<nlohmann::json>> ReadNotice(int rank) const;
  // InvalidArgument naming both collectives if `notice` (peer `peer`'s)
  // names another collective at the position of `mine`; for a Send or Recv,
  // naming both sizes if it names the matching Recv or Send (the same tag
  // and position between the two ranks) with another count or type. The
  // message is then published under keys::Mismatch; else OK.
  absl::Status MismatchWith(const TraceRecord& mine, int peer,
                            const nlohmann::json& notice);
  void FinishLocked(Pending* p, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The clock's time; skips the virtual call for the real clock, since
  // every op reads it three times.
  int64_t Now() const {
    return real_clock_ ? MonotonicNanos() : clock_->NowNanos();
  }
  std::string Describe(const TraceRecord& r) const;

  const CommunicatorOptions options_;
  Clock* const clock_;
  const bool real_clock_;
  const std::shared_ptr<Store> store_;
  const std::unique_ptr<backend::Backend> backend_;
  const std::shared_ptr<fault::Hooks> faults_;  // may be null
  trace::TraceRing ring_;
  const std::shared_ptr<RunnerHandle> runner_handle_;

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Pending>> queue_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Pending> running_ ABSL_GUARDED_BY(mu_);
  // Posted Send/Recv ops, completed in order by the p2p thread.
  std::deque<std::shared_ptr<Pending>> p2p_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_coll_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Messages so far per (peer, user tag): a Send and the Recv it matches
  // have the same index.
  std::map<std::pair<int, uint32_t>, int64_t> sends_to_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, uint32_t>, int64_t> recvs_from_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
  // The collective running when the communicator aborted (for the notice).
  std::optional<TraceRecord> abort_op_ ABSL_GUARDED_BY(mu_);
  int64_t abort_mono_ns_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  std::thread worker_;
  std::thread p2p_thread_;
  std::thread watchdog_;
};

}  // namespace holdfast::comm

#endif  // HOLDFAST_SRC_COMM_COMMUNICATOR_IMPL_H_
