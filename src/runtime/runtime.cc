#include "holdfast/runtime.h"

#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "holdfast/status.h"
#include "holdfast/store.h"
#include "src/backend/backend.h"
#include "src/checkpoint/bulk.h"
#include "src/checkpoint/peer_memory.h"
#include "src/checkpoint/restore_plan.h"
#include "src/checkpoint/shards.h"
#include "src/checkpoint/state.h"
#include "src/comm/communicator_impl.h"
#include "src/common/config.h"
#include "src/common/logging.h"
#include "src/common/status_util.h"
#include "src/common/thread_util.h"
#include "src/control/auth.h"
#include "src/control/client.h"
#include "src/control/member.h"
#include "src/fault/fault.h"
#include "src/runtime/report.h"
#include "src/store/keys.h"
#include "src/store/store_util.h"

namespace holdfast {
namespace {

using control::JobEnd;
using control::MembershipUpdate;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// What a restore received, for its log line.
std::string Received(const RecoveryRecord& rec) {
  if (rec.from_disk) {
    return absl::StrCat(rec.bytes_received,
                        " bytes received, from the disk tier");
  }
  return absl::StrCat(rec.bytes_received, " bytes received",
                      rec.bytes_read_in_place > 0
                          ? absl::StrCat(", ", rec.bytes_read_in_place,
                                         " of them read in place on this host")
                          : "");
}

// Asks for transparent huge pages under the 2 MiB-aligned part of a large
// buffer not touched yet. Its first write (a snapshot, a received or read
// piece) then takes a page fault per 2 MiB instead of per 4 KiB. A no-op
// where the kernel has them off ("never"); with "always" the kernel does
// this by itself.
void AdviseHugePages(void* p, size_t size) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (size < 2 * kHuge) return;
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t last = (begin + size) & ~(kHuge - 1);
  if (last > first) {
    (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
}

// A random word that is never 0.
uint64_t ProbeWord() {
  std::random_device rd;
  return (uint64_t{rd()} << 32 | rd()) | uint64_t{1} << 63;
}

// Point-to-point transfers of the state go in chunks, so one op stays well
// inside its deadline and the receiver's progress is visible in the trace.
constexpr size_t kChunkBytes = size_t{64} << 20;

// A restore checks the copies a member holds, and reads pieces in place,
// on up to kRestoreThreads threads (no more than the machine has cores),
// a piece at a time each. A piece read in place goes in chunks of
// kReadChunk, each hashed (and copied into the live state, for a piece
// whose copy is kept) while it is in the cache (docs/checkpoint.md).
constexpr size_t kReadChunk = size_t{1} << 20;
constexpr size_t kRestoreThreads = 4;
constexpr uint32_t kRestoreTag = 0x5e570;

// Backups wait for every slot to reach the same snapshot; that may take
// as long as a training step, so their agreement has no deadline of its
// own (a failure aborts the side communicator instead).
constexpr absl::Duration kAgreeTimeout = absl::Hours(24);
// How long a slot that acked a round waits for its commit before the round's
// verdict exchange (AgreeMax; the commit comes first in the usual case, a
// fraction of a millisecond after the last ack). A slot that did not ack
// goes straight to the exchange, so when one found a damaged copy (or did
// not fence its deferred copy) the others learn it this much later, and
// their backup threads start no round meanwhile (one snapshot waits, later
// ones are skipped). It should exceed the ack-to-commit trip (0.2-0.5 ms
// where measured, docs/benchmarks.md); on a host where the trip takes
// longer the exchange merely runs during it.
constexpr absl::Duration kVerdictAfter = absl::Milliseconds(5);
constexpr absl::Duration kSideConnectTimeout = absl::Seconds(15);
// The runtime's ledger, registered as replicated state: int64s of the
// first step's start (unix ms), the productive time (us) and the first
// step's duration (us). Each slot times its own steps.
constexpr int kLedger = 3;

using SnapshotCopy = RunOptions::SnapshotCopy;

using checkpoint::StateBuffer;
using Registry = checkpoint::StateRegistry;
using checkpoint::Segments;

// One slot's piece of one snapshot (its own, a buddy's copy, or one
// received during a restore).
struct Piece {
  int64_t step = -1;
  int64_t layout_generation = 0;  // the generation whose world cut it
  int world = 0;
  int slot = 0;  // whose partition, in that world
  uint64_t checksum = 0;
  bool own = false;
  size_t size = 0;
  std::unique_ptr<uint8_t[]> bytes;
  // A deferred snapshot (copied during the next step, see
  // RunOptions::snapshot_copy): the backup thread copies the bytes in while
  // the next step computes, and the round acks only once the trainer
  // called BeginStateUpdate() after the copy. The flags are guarded by the
  // runtime's bk_mu_.
  bool deferred = false;
  bool copied = false;
  bool validated = false;  // BeginStateUpdate() came after the copy
  bool invalid = false;    // it did not, or a recovery began: never acked
};

class RuntimeImpl final : public Runtime {
 public:
  explicit RuntimeImpl(RuntimeOptions o) : options_(std::move(o)) {}

  ~RuntimeImpl() override {
    Leave(finished_);
    {
      absl::MutexLock lock(&abort_mu_);
      abort_stop_ = true;
    }
    if (aborter_.joinable()) aborter_.join();
    fault::Injector::Global().SetClaim(nullptr);
    fault::Injector::Global().SetRelease(nullptr);
    fault::Injector::Global().SetCommitted(nullptr);
  }

  absl::Status Init() {
    if (options_.recovery_timeout <= absl::ZeroDuration()) {
      options_.recovery_timeout =
          absl::Milliseconds(config::IntParam("HOLDFAST_RECOVERY_TIMEOUT_MS"));
    }
    if (options_.replicas <= 0) {
      options_.replicas = static_cast<int>(
          std::min<int64_t>(config::IntParam("HOLDFAST_REPLICAS"), 64));
    }
    if (options_.verify_backups == VerifyBackups::kDefault) {
      // Validated by the config registry: "arrival" or "restore".
      options_.verify_backups =
          config::StringParam("HOLDFAST_VERIFY_BACKUPS") == "restore"
              ? VerifyBackups::kRestore
              : VerifyBackups::kArrival;
    }
    same_host_restore_ =
        config::StringParam("HOLDFAST_SAME_HOST_RESTORE") == "on";
    if (options_.tp_size <= 0) {
      options_.tp_size = static_cast<int>(config::IntParam("HOLDFAST_TP_SIZE"));
    }
    if (options_.pp_size <= 0) {
      options_.pp_size = static_cast<int>(config::IntParam("HOLDFAST_PP_SIZE"));
    }
    if (options_.checkpoint_dir.empty()) {
      options_.checkpoint_dir = config::StringParam("HOLDFAST_CHECKPOINT_DIR");
    }
    if (options_.checkpoint_every <= 0) {
      options_.checkpoint_every = config::IntParam("HOLDFAST_CHECKPOINT_EVERY");
    }
    if (options_.max_step_retries < 0) {
      options_.max_step_retries = static_cast<int>(std::min<int64_t>(
          config::IntParam("HOLDFAST_MAX_STEP_RETRIES"), INT32_MAX));
    }
    if (options_.preferred_slot < -1) {
      const std::string want = config::StringParam("HOLDFAST_PREFERRED_SLOT");
      if (want == "standby") {
        options_.preferred_slot = -1;
      } else if (!want.empty() &&
                 (!absl::SimpleAtoi(want, &options_.preferred_slot) ||
                  options_.preferred_slot < 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("HOLDFAST_PREFERRED_SLOT='", want,
                         "' is neither a slot number nor 'standby'"));
      }
    }
    if (options_.host.empty()) {
      char name[256] = {};
      gethostname(name, sizeof(name) - 1);
      options_.host = name;
    }
    const std::string faults = options_.faults.empty()
                                   ? config::StringParam("HOLDFAST_FAULTS")
                                   : options_.faults;
    if (!faults.empty()) {
      HOLDFAST_RETURN_IF_ERROR(fault::Injector::Global().Configure(faults));
    }
    control::ClientOptions client;
    client.address = options_.controller;
    client.token = options_.token;
    HOLDFAST_ASSIGN_OR_RETURN(store_,
                              control::ControllerStore::Connect(client));
    control::MemberOptions mo;
    mo.client = client;
    mo.host = options_.host;
    mo.topology_block = options_.topology_block;
    mo.connect_timeout = options_.join_timeout;
    mo.preferred_slot = options_.preferred_slot;
    control::MemberCallbacks cb;
    cb.on_membership = [this](const MembershipUpdate& u) { OnMembership(u); };
    cb.on_abort = [this](const control::AbortOrder& a) {
      QueueAbort(a.generation(), absl::StrCat("controller: ", a.reason()));
    };
    cb.on_committed = [this](int64_t c) { NoteCommitted(c); };
    cb.on_fenced = [this](const absl::Status& s) {
      {
        absl::MutexLock lock(&mu_);
        fenced_ = s;
      }
      AbortComm(INT64_MAX, absl::StrCat("fenced: ", s.message()));
    };
    cb.on_job_end = [this](const JobEnd& e) {
      {
        absl::MutexLock lock(&mu_);
        job_end_ = e;
      }
      if (e.state() != control::JOB_FINISHED) {
        AbortComm(INT64_MAX, absl::StrCat("the job stopped: ", e.reason()));
      }
    };
    HOLDFAST_ASSIGN_OR_RETURN(member_,
                              control::MemberClient::Join(mo, std::move(cb)));
    const control::Assignment a = member_->assignment();
    {
      absl::MutexLock lock(&mu_);
      view_.generation = std::max(view_.generation, a.generation);
      if (view_.generation == a.generation) {
        view_.slot = a.slot;
        view_.world = a.world_size;
        view_.standby = a.standby;
      }
      committed_ = std::max(committed_, a.committed_step);
    }
    HOLDFAST_LOG_INFO(
        "runtime: member {} ({}) joined as {} (generation {}, world {})",
        a.member_id, options_.host,
        a.standby ? std::string("standby") : absl::StrCat("slot ", a.slot),
        a.generation, a.world_size);
    // Each fault fires once per job: the first process to claim it in the
    // controller's store fires it.
    std::shared_ptr<control::ControllerStore> store = store_;
    const uint64_t id = a.member_id;
    fault::Injector::Global().SetClaim([store, id](const fault::FaultSpec& f) {
      auto r = store->CompareAndSet(keys::FaultClaim(f.index), "", true,
                                    absl::StrCat(id));
      return r.ok() && r->first;
    });
    // An injected stall ends once this member has no job to go on with.
    fault::Injector::Global().SetRelease([this] { return !Terminal().ok(); });
    fault::Injector::Global().SetCommitted([this] { return committed_step(); });
    backup_thread_ = std::thread([this] { BackupLoop(); });
    return absl::OkStatus();
  }

  // ---- State ----------------------------------------------------------------

  absl::Status RegisterState(const std::string& name, void* data,
                             size_t bytes) override {
    HOLDFAST_RETURN_IF_ERROR(RegistrationOpen(name));
    return state_.AddReplicated(name, data, bytes);
  }

  absl::StatusOr<ShardView> RegisterShardedState(const std::string& name,
                                                 size_t global_bytes,
                                                 size_t unit_bytes) override {
    HOLDFAST_RETURN_IF_ERROR(RegistrationOpen(name));
    const View v = CurrentView();
    return state_.AddSharded(name, global_bytes, unit_bytes,
                             v.standby ? 0 : v.world, v.slot);
  }

  absl::StatusOr<ShardView> Shard(const std::string& name) override {
    return state_.Shard(name);
  }

  // ---- Views ----------------------------------------------------------------

  bool standby() const override {
    absl::MutexLock lock(&mu_);
    return view_.standby;
  }
  int slot() const override {
    absl::MutexLock lock(&mu_);
    return view_.slot;
  }
  int world_size() const override {
    absl::MutexLock lock(&mu_);
    return view_.world;
  }
  int64_t generation() const override {
    absl::MutexLock lock(&mu_);
    return view_.generation;
  }
  int64_t committed_step() const override {
    absl::MutexLock lock(&mu_);
    return committed_;
  }

  absl::Status AwaitCommit(int64_t step, absl::Duration timeout) override {
    if (AwaitCommitted(step, absl::Now() + timeout)) return absl::OkStatus();
    HOLDFAST_RETURN_IF_ERROR(Terminal());
    const bool moved = GenerationMoved();
    const absl::Status health = CommHealth();
    if (moved || !health.ok()) {
      return absl::AbortedError(absl::StrCat(
          "AwaitCommit: step ", step, " cannot commit in this generation (",
          moved ? "a newer generation opened" : std::string(health.message()),
          "); a recovery rolls the state back first"));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "AwaitCommit: step ", step, " was not committed within ",
        absl::FormatDuration(timeout), " (committed: ", committed_step(), ")"));
  }

  absl::StatusOr<Communicator*> communicator() override {
    {
      absl::MutexLock lock(&mu_);
      if (comm_ != nullptr && comm_generation_ == view_.generation &&
          comm_->health().ok()) {
        return comm_.get();
      }
    }
    HOLDFAST_RETURN_IF_ERROR(BuildComm());
    absl::MutexLock lock(&mu_);
    return comm_.get();
  }

  BackupStats backup_stats() const override {
    absl::MutexLock lock(&bk_mu_);
    BackupStats b;
    b.rounds = backups_;
    b.bytes = backup_bytes_;
    b.transfer_us = transfer_us_;
    b.round_us = backup_us_;
    b.gate_us = gate_us_;
    b.commit_wait_us = commit_wait_us_;
    b.last_acked = last_acked_;
    b.disk_writes = disk_writes_;
    return b;
  }

  // Sends a step report (at each step's end).
  void ReportStep(int64_t step, absl::Duration step_time,
                  const std::map<std::string, double>& metrics) {
    (void)member_->ReportStep(step, step_time, metrics);
  }

  void Leave(bool finished) override {
    if (left_) return;
    left_ = true;
    // Stop the backup thread first. An idle one just exits; one inside a
    // round (peers that stopped snapshotting leave it waiting) is freed by
    // aborting the side communicator.
    bool busy;
    {
      // Under the lock: the thread either sees the stop before it starts a
      // round, or the round is seen here and aborted.
      absl::MutexLock lock(&bk_mu_);
      bk_stop_ = true;
      bk_wake_ = true;
      busy = busy_;
    }
    if (busy) AbortComm(INT64_MAX, "this member left the job");
    if (backup_thread_.joinable()) backup_thread_.join();
    std::shared_ptr<Communicator> comm, side;
    {
      absl::MutexLock lock(&mu_);
      comm = std::move(comm_);
      side = std::move(side_);
    }
    comm.reset();  // quietly: leaving is no failure
    side.reset();
    if (member_ != nullptr) member_->Leave(finished);
  }

  // ---- Snapshots ------------------------------------------------------------

  absl::StatusOr<bool> Snapshot(int64_t step) override {
    return TakeSnapshot(step, /*defer=*/false);
  }

  // Called by the step function before it writes registered state, so the
  // step's own snapshot may be copied during the next step
  // (RunOptions::snapshot_copy). When the snapshot of the previous step is
  // copied in the background, waits for a copy under way (a memcpy, never
  // the network). A copy not yet started, because the backup thread is
  // still acking the round before, is made here instead, as it would have
  // been between the steps: training never waits for a backup, and no
  // snapshot is lost for want of time.
  void BeginStateUpdate() override {
    Piece* p;
    {
      absl::MutexLock lock(&bk_mu_);
      if (early_write_.has_value()) return;  // this step is not fenced
      fence_seen_ = true;
      p = deferred_;
      if (p == nullptr) return;
      if (pending_ != p) {
        // The backup thread took it and copies it; a piece that is
        // dropped meanwhile clears deferred_ (EvictLocked), so p is only
        // read alive.
        auto copied = [this, p]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(bk_mu_) {
          return deferred_ != p || p->copied;
        };
        bk_mu_.Await(absl::Condition(&copied));
        if (deferred_ == p) {
          p->validated = true;
          ++snapshots_overlapped_;
        }
        deferred_ = nullptr;
        return;
      }
      // Not started: taken back while this thread copies it. Only this
      // thread drops a pending piece, and a round evicts other steps than
      // this newest one, so it stays listed.
      pending_ = nullptr;
      deferred_ = nullptr;
    }
    p->deferred = false;
    CopyOut(p);
    absl::MutexLock lock(&bk_mu_);
    pending_ = p;
  }

  // Copies this member's part of the registered state into `p` (on the
  // training thread: between the steps, or at the fence).
  void CopyOut(Piece* p) {
    state_.CopyPiece(p->world, p->slot, p->bytes.get());
  }

  // Snapshot(step); with `defer`, the backup thread copies the bytes in
  // (BeginStateUpdate()).
  absl::StatusOr<bool> TakeSnapshot(int64_t step, bool defer) {
    if (step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Snapshot: step ", step, " is negative"));
    }
    const View v = CurrentView();
    if (v.standby || v.slot < 0) {
      return absl::FailedPreconditionError(
          "Snapshot: a standby has no state to snapshot");
    }
    const int64_t comm_gen = CommGeneration();
    if (comm_gen < 0) {
      return absl::FailedPreconditionError(
          "Snapshot: no communicator yet (call communicator() first)");
    }
    if (comm_gen != v.generation) {
      return absl::AbortedError(absl::StrCat(
          "Snapshot: generation ", v.generation,
          " opened; the state is rolled back by a recovery first"));
    }
    // After a rollback to the disk tier the controller's committed step
    // may be ahead of the loop; those steps cannot commit again.
    const int64_t committed = committed_step();
    if (step <= committed) {
      ++snapshots_skipped_;
      return false;
    }
    {
      absl::MutexLock lock(&bk_mu_);
      // The next snapshot may wait behind a round that moves no bytes any
      // more: one at the gate of its deferred copy (past its transfer; the
      // fence of this step, or its end without one, decided it), one that
      // acked and waits for the commit or the verdict (idle_round_), one
      // whose step committed (only local work left: evicting older copies,
      // the disk tier), and one still in its agreement (idle_round_: it
      // may wait for a slot that skipped a step). Were the snapshot
      // skipped there, this slot would skip a step the others back up,
      // and the rounds after would pair different steps (BackupRound).
      const bool past_transfer = gate_ != nullptr;
      const bool settled = round_step_ <= committed;
      if (pending_ != nullptr || deferred_ != nullptr ||
          (busy_ && !past_transfer && !settled && !idle_round_)) {
        // The previous snapshot is still being backed up: skip this one
        // rather than stall training.
        ++snapshots_skipped_;
        return false;
      }
    }
    auto p = std::make_unique<Piece>();
    p->step = step;
    p->layout_generation = CommGeneration();
    p->world = v.world;
    p->slot = v.slot;
    p->own = true;
    p->size = state_.PieceSize(v.world, v.slot);
    p->bytes = Acquire(p->size);
    p->deferred = defer;
    if (!defer) CopyOut(p.get());
    ++snapshots_;
    absl::MutexLock lock(&bk_mu_);
    pending_ = p.get();
    if (defer) deferred_ = p.get();
    pieces_.push_back(std::move(p));
    return true;
  }

  // The backup thread's copy of a deferred piece, hashed on the way.
  void CopyIn(Piece* p) {
    shards::CopyHasher h;
    state_.CopyPiece(p->world, p->slot, p->bytes.get(), &h);
    p->checksum = h.Digest();
    absl::MutexLock lock(&bk_mu_);
    p->copied = true;
  }

  void ReportEarlyWrite(absl::string_view what) override {
    absl::MutexLock lock(&bk_mu_);
    if (!early_write_.has_value()) early_write_ = std::string(what);
    fence_seen_ = false;
  }

  // Before a step: forgets an earlier BeginStateUpdate() or
  // ReportEarlyWrite(). After it: whether the step called the first, and
  // what it reported with the second (in `early`; empty if nothing).
  bool TakeFenceSeen(std::string* early = nullptr) {
    absl::MutexLock lock(&bk_mu_);
    std::optional<std::string> e = std::exchange(early_write_, std::nullopt);
    if (early != nullptr) *early = e.value_or("");
    return std::exchange(fence_seen_, false);
  }

  // At the end of a step: a deferred snapshot still waiting for
  // BeginStateUpdate() may have been written under; it is dropped. Whether
  // there was one.
  bool DropUnfenced() {
    absl::MutexLock lock(&bk_mu_);
    Piece* p = deferred_;
    if (p == nullptr) return false;
    deferred_ = nullptr;
    p->invalid = true;
    if (pending_ == p) DropLocked(p);  // not taken: nobody else has it
    return true;
  }

  // ---- Recovery -------------------------------------------------------------

  // Full recovery after `cause`; returns the restored step (the loop goes
  // on at restored + 1).
  absl::StatusOr<int64_t> Recover(const absl::Status& cause) {
    RecoveryRecord rec;
    rec.cause = std::string(cause.message());
    rec.seen_ms = NowMs();
    int64_t failed = CommGeneration();
    rec.failed_generation = failed;
    AbortComm(INT64_MAX, absl::StrCat("recovering: ", cause.message()));
    HOLDFAST_RETURN_IF_ERROR(FoundMismatch(failed));
    rec.aborted_ms = NowMs();
    member_->SetPhase(control::PHASE_RECOVERING, 0);
    HOLDFAST_LOG_WARN("runtime: slot {} recovering from generation {}: {}",
                      slot(), failed, std::string(cause.message()));
    const absl::Time deadline = absl::Now() + options_.recovery_timeout;
    ++recoveries_;
    bool fault_point = true;
    std::string last_error = rec.cause;
    // A member that never came to the last rendezvous (alive as far as
    // the controller knows, but stuck): reported instead of a plain
    // communicator failure, which would rebuild the same group around it.
    int absent = AbsentPeer(cause);
    for (;;) {
      HOLDFAST_RETURN_IF_ERROR(Terminal());
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("recovery from generation ", rec.failed_generation,
                         " did not finish within ",
                         absl::FormatDuration(options_.recovery_timeout),
                         "; last error: ", last_error));
      }
      // The controller usually opens the next generation by itself (a
      // crash is seen at once). If it does not, nobody it knows of failed:
      // report the broken communicator, which rebuilds the group.
      if (!AwaitGeneration(failed, absl::Now() + options_.report_grace)) {
        ReportBroken(last_error, absent, failed);
        AwaitGeneration(failed, deadline);
        continue;
      }
      HOLDFAST_RETURN_IF_ERROR(Terminal());
      // A peer may have found it after this member began to recover.
      HOLDFAST_RETURN_IF_ERROR(FoundMismatch(rec.failed_generation));
      if (failed != rec.failed_generation) {
        HOLDFAST_RETURN_IF_ERROR(FoundMismatch(failed));
      }
      rec.agreed_ms = NowMs();
      const View v = CurrentView();
      if (v.standby) {
        return absl::InternalError("runtime: a worker was made a standby");
      }
      if (fault_point) {
        fault_point = false;
        fault::Injector::Global().AtRecovery(v.slot, recoveries_);
      }
      absl::Status s = BuildComm();
      // A communicator that cannot be built by this program at all (an
      // unknown backend, NCCL not linked, no GPU) will not be built by
      // the next generation either: stop instead of cycling.
      if (s.code() == absl::StatusCode::kInvalidArgument ||
          s.code() == absl::StatusCode::kFailedPrecondition) {
        return s;
      }
      if (s.ok()) {
        rec.rebuilt_ms = NowMs();
        absl::StatusOr<int64_t> restored = Restore(&rec);
        if (restored.ok()) {
          rec.restored_ms = NowMs();
          rec.generation = v.generation;
          rec.restored_step = *restored;
          rec.lost_steps = lost_steps_;
          pending_record_ = rec;
          HOLDFAST_LOG_INFO(
              "runtime: slot {} of {} recovered at generation {}: step {} "
              "restored ({}) in {} ms",
              v.slot, v.world, v.generation, *restored, Received(rec),
              rec.restored_ms - rec.seen_ms);
          return *restored;
        }
        s = restored.status();
        if (!IsRecoverable(s) && CommHealthy()) return s;
      }
      last_error = std::string(s.message());
      absent = AbsentPeer(s);
      HOLDFAST_LOG_WARN("runtime: generation {} failed during recovery: {}",
                        v.generation, last_error);
      AbortComm(INT64_MAX, last_error);
      failed = v.generation;
    }
  }

  // A collective (or Send/Recv) mismatch in generation `gen`, which the
  // communicator of whichever member found it left in the store: a program
  // error that every recovery would run into again (the same steps are
  // redone), so Run ends with it (InvalidArgument) instead of recovering.
  absl::Status FoundMismatch(int64_t gen) {
    absl::StatusOr<std::optional<std::string>> found =
        store_->TryGet(keys::Mismatch(gen));
    if (!found.ok() || !found->has_value()) return absl::OkStatus();
    HOLDFAST_LOG_ERROR(
        "runtime: slot {} does not recover from generation {}: {}", slot(), gen,
        **found);
    return absl::InvalidArgumentError(**found);
  }

  // ---- The loop -------------------------------------------------------------

  absl::StatusOr<RunResult> Run(
      std::function<absl::Status(const StepContext&)> step_fn,
      const RunOptions& options) override {
    absl::StatusOr<RunResult> r;
    try {
      r = RunLoop(std::move(step_fn), options);
    } catch (const std::system_error& e) {
      // A thread that cannot start (a pids limit), where no fallback
      // exists (the side communicator's build, the transport's).
      r = absl::ResourceExhaustedError(
          absl::StrCat("Run: cannot start a thread: ", e.what()));
    }
    const absl::StatusCode code = r.status().code();
    if (!r.ok() && code != absl::StatusCode::kCancelled &&
        code != absl::StatusCode::kFailedPrecondition && store_ != nullptr) {
      // Fenced members and unused standbys are no news; anything else is
      // why the job could not go on.
      nlohmann::json j;
      j["slot"] = slot();
      j["code"] = absl::StatusCodeToString(code);
      j["message"] = std::string(r.status().message());
      (void)store_->CompareAndSet(keys::kError, "", true, j.dump());
    }
    return r;
  }

 private:
  absl::StatusOr<RunResult> RunLoop(
      std::function<absl::Status(const StepContext&)> step_fn,
      const RunOptions& options) {
    if (started_) {
      return absl::FailedPreconditionError("Run: called twice");
    }
    if (options.steps < 0 || options.snapshot_every < 1 || !step_fn) {
      return absl::InvalidArgumentError(
          "Run: steps must be >= 0, snapshot_every >= 1 and step_fn set");
    }
    // The runtime's own ledger travels with the state, so the productive
    // time survives a rollback (and reaches a member that takes over):
    // the first step's start (Unix ms), the productive time of the steps
    // done so far (us), and the first step's duration (us).
    HOLDFAST_RETURN_IF_ERROR(state_.AddReplicated(
        "holdfast/ledger", ledger_, sizeof(ledger_), /*ledger=*/true));
    started_ = true;
    RunResult result;
    HOLDFAST_RETURN_IF_ERROR(AwaitSlot());

    int64_t step = 0;
    // The registered host buffers hold the state of step `restored`: the
    // trainer's hook sees it (device copies are refreshed there) and the
    // loop goes on after it.
    auto resume_at = [&](int64_t restored) -> absl::Status {
      if (options.on_restore) {
        HOLDFAST_RETURN_IF_ERROR(options.on_restore(restored));
      }
      step = restored + 1;
      return absl::OkStatus();
    };
    // Recoveries in a row after which no step past `stuck_at` (the newest
    // step done when the first of them began) completed.
    int64_t stuck_at = -1;
    int stuck = 0;
    auto recover = [&](const absl::Status& cause) -> absl::Status {
      if (high_step_ > stuck_at) {
        stuck_at = high_step_;
        stuck = 0;
      }
      if (options_.max_step_retries > 0 &&
          ++stuck > options_.max_step_retries) {
        HOLDFAST_LOG_ERROR(
            "runtime: slot {} gives up: {} recoveries in a row and no step "
            "after step {} completed; the failure repeats: {}",
            slot(), options_.max_step_retries, stuck_at,
            std::string(cause.message()));
        return absl::Status(
            cause.code(),
            absl::StrCat("no step after step ", stuck_at, " completed in ",
                         options_.max_step_retries,
                         " recoveries in a row (HOLDFAST_MAX_STEP_RETRIES), "
                         "so the failure repeats each time the steps are "
                         "redone; the last one: ",
                         cause.message()));
      }
      absl::StatusOr<int64_t> restored = Recover(cause);
      if (!restored.ok()) return restored.status();
      return resume_at(*restored);
    };
    {
      absl::StatusOr<int64_t> started = Start();
      if (started.ok()) {
        HOLDFAST_RETURN_IF_ERROR(resume_at(*started));
      } else {
        if (!IsRecoverable(started.status()) && CommHealthy()) {
          return started.status();
        }
        HOLDFAST_RETURN_IF_ERROR(recover(started.status()));
      }
    }
    for (;;) {
      while (step <= options.steps) {
        const View v = CurrentView();
        fault::Injector::Global().AtStep(v.slot, step);
        member_->SetPhase(control::PHASE_COMPUTING, 0);
        const absl::Time t0 = absl::Now();
        absl::Status s;
        bool fenced = false;  // the step called BeginStateUpdate()
        Communicator* comm = CurrentComm();
        if (comm == nullptr) {
          s = absl::AbortedError("no communicator");
        } else {
          StepContext ctx;
          ctx.step = step;
          ctx.rank = v.slot;
          ctx.world_size = v.world;
          ctx.generation = v.generation;
          ctx.comm = comm;
          ctx.runtime = this;
          TakeFenceSeen();
          s = step_fn(ctx);
          std::string early;  // what the step wrote before its fence
          fenced = TakeFenceSeen(&early);
          if (DropUnfenced() && s.ok()) {
            const std::string what = absl::StrCat(
                early.empty() ? std::string(" returned without calling")
                              : absl::StrCat(" wrote registered state (", early,
                                             ") before it called"),
                " Runtime::BeginStateUpdate() (Python: "
                "runtime.begin_state_update())");
            if (options.snapshot_copy == SnapshotCopy::kDuringNextStep) {
              return absl::FailedPreconditionError(absl::StrCat(
                  "RunOptions::snapshot_copy is kDuringNextStep and step ",
                  step, what,
                  ", which every step must call before it writes registered "
                  "state; the snapshot of step ",
                  step - 1, " may be torn and was dropped"));
            }
            // kAuto: the step before fenced its writes and this one did
            // not, or too late. Its snapshot was dropped; the next is
            // copied between the steps (fenced is false).
            if (snapshots_unfenced_++ == 0) {
              HOLDFAST_LOG_WARN(
                  "runtime: slot {}: step {}{}; step {} had called it, so "
                  "its snapshot was copied during step {}, may be torn, and "
                  "was dropped (once per run: RunResult::snapshots_unfenced "
                  "counts them); call it in every step before its first "
                  "write to registered state, or set "
                  "RunOptions::snapshot_copy to kBetweenSteps",
                  v.slot, step, what, step - 1, step);
            }
          }
        }
        // A step that finished while its generation was being replaced may
        // not have finished everywhere: it is redone after the rollback.
        if (s.ok()) s = Terminal();
        if (s.ok() && (!CommHealthy() || GenerationMoved())) {
          s = CommHealth();
          if (s.ok()) s = absl::AbortedError("a new generation was opened");
        }
        if (!s.ok()) {
          if (!IsRecoverable(s) && CommHealthy() &&
              s.code() != absl::StatusCode::kFailedPrecondition) {
            return s;
          }
          // A trainer that fences its writes and failed before this
          // step's fence left its state as the last step did.
          if (fenced || !fences_) live_step_ = -1;
          HOLDFAST_RETURN_IF_ERROR(recover(s));
          continue;
        }
        fences_ = fences_ || fenced;
        live_step_ = step;
        const absl::Time t1 = absl::Now();
        if (pending_record_.has_value()) {
          // The first training step after the recovery is done (its
          // snapshot is the loop's usual per-step work).
          pending_record_->first_step_ms = absl::ToUnixMillis(t1);
        }
        if (step == 1) {
          ledger_[0] = absl::ToUnixMillis(t0);
          ledger_[2] = absl::ToInt64Microseconds(t1 - t0);
        }
        ledger_[1] += absl::ToInt64Microseconds(t1 - t0);
        high_step_ = std::max(high_step_, step);
        if (step % options.snapshot_every == 0 || step == options.steps) {
          member_->SetPhase(control::PHASE_CHECKPOINTING, 0);
          if (step == options.steps) {
            // Every slot snapshots the last step, waiting for its previous
            // backup if need be, so the last round is the same everywhere
            // and commits: nobody leaves while a peer waits for it in one.
            AwaitBackupIdle(absl::Now() + options_.commit_wait);
          }
          const bool defer =
              step < options.steps &&
              (options.snapshot_copy == SnapshotCopy::kDuringNextStep ||
               (options.snapshot_copy == SnapshotCopy::kAuto && fenced));
          absl::StatusOr<bool> snapped = TakeSnapshot(step, defer);
          if (!snapped.ok()) {
            if (!IsRecoverable(snapped.status())) return snapped.status();
            HOLDFAST_RETURN_IF_ERROR(recover(snapped.status()));
            continue;
          }
        }
        ReportStep(step, t1 - t0,
                   options.metrics ? options.metrics()
                                   : std::map<std::string, double>{});
        if (pending_record_.has_value()) {
          recovery_records_.push_back(*pending_record_);
          PublishRecovery(*pending_record_);
          pending_record_.reset();
        }
        ++step;
      }
      // Let the last backup round finish (its peers are in it too) before
      // leaving, so nobody sees this member vanish from under a transfer.
      finishing_ = true;
      FinishBackups(options.steps, absl::Now() + std::max(options_.commit_wait,
                                                          absl::Seconds(10)));
      // A generation opened meanwhile (a peer or the side communicator failed
      // during the last steps) includes this member: leaving now would leave
      // the others waiting for it in the rendezvous. Take part, redo what
      // was not committed, and finish with them.
      if (!GenerationMoved() || !Terminal().ok()) break;
      finishing_ = false;
      HOLDFAST_RETURN_IF_ERROR(recover(absl::AbortedError(
          "a new generation was opened while this member was finishing")));
    }
    const View v = CurrentView();
    result.final_step = options.steps;
    result.world_size = v.world;
    result.slot = v.slot;
    result.generation = v.generation;
    result.recoveries = recovery_records_;
    result.snapshots = snapshots_;
    result.snapshots_skipped = snapshots_skipped_;
    result.snapshots_unfenced = snapshots_unfenced_;
    result.productive_ms = ledger_[1] / 1000;
    result.wall_ms =
        options.steps > 0 && ledger_[0] > 0 ? NowMs() - ledger_[0] : 0;
    {
      absl::MutexLock lock(&bk_mu_);
      result.snapshots_overlapped = snapshots_overlapped_;
      result.backups = backups_;
      result.backup_bytes = backup_bytes_;
      result.backup_ms = backup_us_ / 1000;
      result.disk_writes = disk_writes_;
    }
    PublishFinalState(v.slot);
    if (v.slot == 0) PublishFinal(result);
    finished_ = true;
    Leave(true);
    return result;
  }

  struct View {
    int64_t generation = 0;
    int slot = -1;
    int world = 0;
    bool standby = true;
  };

  View CurrentView() const {
    absl::MutexLock lock(&mu_);
    return view_;
  }
  int64_t CommGeneration() const {
    absl::MutexLock lock(&mu_);
    return comm_generation_;
  }
  bool GenerationMoved() const {
    absl::MutexLock lock(&mu_);
    return view_.generation > comm_generation_;
  }
  absl::Status CommHealth() const {
    absl::MutexLock lock(&mu_);
    return comm_ != nullptr ? comm_->health()
                            : absl::AbortedError("no communicator");
  }
  bool CommHealthy() const { return CommHealth().ok(); }

  // Registration ends when Run starts.
  absl::Status RegistrationOpen(const std::string& name) const {
    if (started_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "RegisterState('", name, "'): state is registered before Run"));
    }
    return absl::OkStatus();
  }

  // ---- Pieces ---------------------------------------------------------------

  // The training communicator of the current generation (null before the
  // first one is built).
  Communicator* CurrentComm() {
    absl::MutexLock lock(&mu_);
    return comm_.get();
  }
  // The communicator for the runtime's own exchanges (the restore's
  // agreements and transfers, the check of replicated state), whose
  // buffers are in host memory: the training communicator, unless its
  // backend takes device memory only (NCCL). Then it is the side
  // communicator that BuildComm built with it for the same generation, on
  // the same ranks; the backups that also use it are quiesced or not yet
  // started while these run. Aborted when there is none.
  absl::StatusOr<Communicator*> HostComm() {
    absl::MutexLock lock(&mu_);
    Communicator* c = comm_.get();
    if (c != nullptr && c->memory() != MemoryKind::kHost) {
      c = side_generation_ == comm_generation_ ? side_.get() : nullptr;
    }
    if (c == nullptr) {
      return absl::AbortedError(
          "runtime: no communicator of this generation for the runtime's own "
          "exchanges");
    }
    return c;
  }
  // Posts the chunked sends of a piece's bytes to `peer`.
  static void PostSends(Communicator* c, const uint8_t* data, size_t size,
                        int peer, const OpOptions& oo,
                        std::vector<std::shared_ptr<Work>>* works,
                        size_t chunk = kChunkBytes) {
    for (size_t off = 0; off < size; off += chunk) {
      works->push_back(c->Send(data + off, std::min(chunk, size - off),
                               DataType::kUInt8, peer, oo));
    }
  }

  // A new piece (its checksum as its owner computed it), its bytes not yet
  // filled in.
  std::unique_ptr<Piece> NewPiece(int64_t step, int64_t generation, int world,
                                  int slot, uint64_t checksum) {
    auto p = std::make_unique<Piece>();
    p->step = step;
    p->layout_generation = generation;
    p->world = world;
    p->slot = slot;
    p->checksum = checksum;
    p->size = state_.PieceSize(world, slot);
    p->bytes = Acquire(p->size);
    return p;
  }

  // A new piece (its checksum as its owner computed it), with the chunked
  // receives of its bytes from `peer` posted.
  std::unique_ptr<Piece> PostReceive(Communicator* c, int64_t step,
                                     int64_t generation, int world, int slot,
                                     uint64_t checksum, int peer,
                                     const OpOptions& oo,
                                     std::vector<std::shared_ptr<Work>>* works,
                                     size_t chunk = kChunkBytes) {
    std::unique_ptr<Piece> p =
        NewPiece(step, generation, world, slot, checksum);
    for (size_t off = 0; off < p->size; off += chunk) {
      works->push_back(c->Recv(p->bytes.get() + off,
                               std::min(chunk, p->size - off), DataType::kUInt8,
                               peer, oo));
    }
    return p;
  }

  static absl::Status LayoutMismatch(int r, uint64_t theirs, int me,
                                     uint64_t mine) {
    return absl::InvalidArgumentError(absl::StrCat(
        "registered state differs between slots: slot ", r, " has layout hash ",
        theirs, ", slot ", me, " has ", mine,
        "; every slot must register the same names, kinds and sizes in the "
        "same order"));
  }

  // At a fresh start: registered (replicated) state must hold the same
  // bytes on every slot, since a restore assembles each slot's copy from
  // pieces of all slots. Hashes each such buffer (SampleHash: whole up to
  // 1 MiB, which covers per-slot values such as an RNG state, else 256
  // blocks spread over it, so a start costs no pass over a large state)
  // and warns, naming the first buffer that differs; a layout that
  // differs is an error, as at a restore.
  absl::Status CheckReplicatedEqual(Communicator* comm, const View& v) {
    std::vector<int64_t> hashes;
    for (const StateBuffer& b : state_.buffers()) {
      if (b.sharded || b.ledger) {
        hashes.push_back(0);  // the ledger times each slot's own steps
        continue;
      }
      hashes.push_back(static_cast<int64_t>(SampleHash(b.data, b.global)));
    }
    const uint64_t layout = state_.LayoutHash();
    const int64_t mine[2] = {
        static_cast<int64_t>(layout),
        static_cast<int64_t>(XXH3_64bits(hashes.data(), hashes.size() * 8))};
    std::vector<int64_t> all(static_cast<size_t>(v.world) * 2);
    HOLDFAST_RETURN_IF_ERROR(
        comm->AllGather(mine, all.data(), 2, DataType::kInt64)->Wait());
    bool equal = true;
    for (int r = 0; r < v.world; ++r) {
      const int64_t* e = &all[static_cast<size_t>(r) * 2];
      if (e[0] != mine[0]) {
        return LayoutMismatch(r, static_cast<uint64_t>(e[0]), v.slot, layout);
      }
      equal = equal && e[1] == mine[1];
    }
    if (equal) return absl::OkStatus();
    // Same layout, so the same count everywhere: which buffer, which slots.
    std::vector<int64_t> every(hashes.size() * static_cast<size_t>(v.world));
    HOLDFAST_RETURN_IF_ERROR(comm->AllGather(hashes.data(), every.data(),
                                             hashes.size(), DataType::kInt64)
                                 ->Wait());
    for (size_t i = 0; i < hashes.size() && v.slot == 0; ++i) {
      for (int r = 1; r < v.world; ++r) {
        if (every[static_cast<size_t>(r) * hashes.size() + i] != every[i]) {
          HOLDFAST_LOG_WARN(
              "runtime: registered state '{}' differs between slots at the "
              "start (slot 0 and slot {} hold different bytes). Registered "
              "state is replicated: a restore rebuilds every slot's copy from "
              "pieces of all slots, so per-slot values would be mixed. Keep "
              "per-slot values (an RNG seeded by rank, a data position) out of "
              "registered state or derive them from the step",
              state_.buffers()[i].name, r);
          return absl::OkStatus();
        }
      }
    }
    return absl::OkStatus();
  }

  static uint64_t SampleHash(const uint8_t* data, size_t size) {
    constexpr size_t kWhole = size_t{1} << 20, kBlock = 4096, kBlocks = 256;
    if (size <= kWhole) return XXH3_64bits(data, size);
    uint64_t h = size;
    for (size_t i = 0; i < kBlocks; ++i) {
      const size_t at = i * (size - kBlock) / (kBlocks - 1);
      h = XXH3_64bits_withSeed(data + at, kBlock, h);
    }
    return h;
  }

  std::unique_ptr<uint8_t[]> Acquire(size_t size) {
    {
      absl::MutexLock lock(&bk_mu_);
      auto it = pool_.find(size);
      if (it != pool_.end()) {
        std::unique_ptr<uint8_t[]> b = std::move(it->second);
        pool_.erase(it);
        return b;
      }
    }
    std::unique_ptr<uint8_t[]> b(new uint8_t[std::max<size_t>(1, size)]);
    AdviseHugePages(b.get(), size);
    return b;
  }

  // Removes pieces matching `drop` from the store (their memory goes back
  // to the pool, which keeps a few buffers of each size).
  template <typename Pred>
  void EvictLocked(Pred drop) ABSL_EXCLUSIVE_LOCKS_REQUIRED(bk_mu_) {
    for (auto it = pieces_.begin(); it != pieces_.end();) {
      if (drop(**it)) {
        if (pool_.count((*it)->size) < 4) {
          pool_.emplace((*it)->size, std::move((*it)->bytes));
        }
        if (pending_ == it->get()) pending_ = nullptr;
        if (deferred_ == it->get()) deferred_ = nullptr;
        if (gate_ == it->get()) gate_ = nullptr;
        it = pieces_.erase(it);
      } else {
        ++it;
      }
    }
  }
  template <typename Pred>
  void Evict(Pred drop) {
    absl::MutexLock lock(&bk_mu_);
    EvictLocked(drop);
  }
  void DropLocked(const Piece* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(bk_mu_) {
    EvictLocked([p](const Piece& q) { return &q == p; });
  }
  void Drop(const Piece* p) {
    absl::MutexLock lock(&bk_mu_);
    DropLocked(p);
  }

  // ---- Membership events
  // ------------------------------------------------------

  void OnMembership(const MembershipUpdate& u) {
    {
      absl::MutexLock lock(&mu_);
      if (u.generation() < view_.generation) return;
      view_.generation = u.generation();
      view_.slot = u.slot();
      view_.world = u.world_size();
      view_.standby = u.role() == control::ROLE_STANDBY;
      committed_ = std::max(committed_, u.committed_step());
    }
    AbortComm(u.generation() - 1,
              absl::StrCat("generation ", u.generation(), " opened"));
  }

  void NoteCommitted(int64_t c) {
    absl::MutexLock lock(&mu_);
    committed_ = std::max(committed_, c);
  }

  // Aborts the training and side communicators of generations <= `upto`.
  void AbortComm(int64_t upto, absl::string_view reason) {
    std::shared_ptr<Communicator> comm, side;
    std::shared_ptr<bulk::Links> links;
    {
      absl::MutexLock lock(&mu_);
      if (comm_generation_ <= upto) comm = comm_;
      if (side_generation_ <= upto) {
        side = side_;
        links = links_;
      }
    }
    // Outside mu_: a communicator's abort leaves a notice in the store (a
    // round trip to the controller, tens of ms while every member is
    // recovering), and the training thread reads the generation under
    // mu_ on its way into Recover.
    if (comm != nullptr) comm->Abort(reason);
    if (side != nullptr) side->Abort(reason);
    if (links != nullptr) links->Abort(reason);
  }

  // An abort ordered by the controller runs on a thread of its own, not
  // the member client's: the client delivers the next generation right
  // after the order, and the abort (a notice to the store for each
  // communicator) held that up by 20-50 ms with 8 members recovering.
  void QueueAbort(int64_t upto, std::string reason) {
    {
      absl::MutexLock lock(&abort_mu_);
      if (abort_stop_) return;
      if (aborter_.joinable()) {
        aborts_.emplace_back(upto, std::move(reason));
        return;
      }
      absl::StatusOr<std::thread> t =
          StartThread("the abort thread", [this] { AbortLoop(); });
      if (t.ok()) {
        aborter_ = std::move(*t);
        aborts_.emplace_back(upto, std::move(reason));
        return;
      }
      // No thread (a pids limit): the abort runs here, on the client's
      // thread, below; slower to hand over the next generation, but it
      // happens.
    }
    AbortComm(upto, reason);
  }

  void AbortLoop() {
    for (;;) {
      std::pair<int64_t, std::string> next;
      {
        absl::MutexLock lock(&abort_mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(abort_mu_) {
          return !aborts_.empty() || abort_stop_;
        };
        abort_mu_.Await(absl::Condition(&ready));
        if (aborts_.empty()) return;
        next = std::move(aborts_.front());
        aborts_.pop_front();
      }
      AbortComm(next.first, next.second);
    }
  }

  // The slot to blame for a rendezvous that timed out, or -1.
  int AbsentPeer(const absl::Status& s) const {
    if (s.code() != absl::StatusCode::kDeadlineExceeded) return -1;
    const int r = GetAbsent(s).value_or(-1);
    return r == slot() ? -1 : r;
  }

  // Reports the failure of generation `gen`'s communicator, which nobody
  // explained; the controller opens a generation with the same members
  // (gen < 0, no communicator built yet: the current generation). With a
  // `peer` (>= 0), the slot that never came to the rendezvous is reported
  // instead: the controller declares it failed, and its slot goes to a
  // standby or the world shrinks.
  void ReportBroken(const std::string& why, int peer, int64_t gen) {
    if (gen < 0) gen = CurrentView().generation;
    absl::StatusOr<bool> r = member_->ReportFailure(peer, why, gen);
    if (!r.ok() && r.status().code() != absl::StatusCode::kFailedPrecondition) {
      HOLDFAST_LOG_WARN("runtime: reporting the failure: {}",
                        std::string(r.status().message()));
    }
  }

  // OK, or why the job cannot go on for this member.
  absl::Status Terminal() const {
    absl::MutexLock lock(&mu_);
    if (!fenced_.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("this member was declared dead and is fenced; it must "
                       "not rejoin with its state (",
                       fenced_.message(), ")"));
    }
    if (job_end_.has_value()) {
      return absl::AbortedError(
          absl::StrCat("the job ",
                       job_end_->state() == control::JOB_STOPPED
                           ? "stopped: "
                           : "ended without this member: ",
                       job_end_->reason()));
    }
    return absl::OkStatus();
  }

  // Waits until `step` is committed; false on timeout or when the
  // communicator fails or the generation moves meanwhile.
  bool AwaitCommitted(int64_t step, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return committed_ >= step || !GoesOnLocked(comm_generation_) ||
             (comm_ != nullptr && !comm_->health().ok());
    };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    return committed_ >= step;
  }

  // Waits until a generation newer than `failed` is known, or a terminal
  // event; false on timeout.
  bool AwaitGeneration(int64_t failed, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !GoesOnLocked(failed);
    };
    return mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  }

  // A standby parks here until it is given a slot.
  absl::Status AwaitSlot() {
    {
      absl::MutexLock lock(&mu_);
      if (view_.standby) {
        HOLDFAST_LOG_INFO("runtime: standby, waiting for a slot");
      }
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !view_.standby || !MayGoOnLocked();
      };
      mu_.Await(absl::Condition(&ready));
      if (!view_.standby) return absl::OkStatus();
      if (job_end_.has_value() && job_end_->state() == control::JOB_FINISHED) {
        return absl::CancelledError(
            absl::StrCat("the job finished without needing this standby (",
                         job_end_->reason(), ")"));
      }
    }
    return Terminal();
  }

  // Why a rendezvous of generation `gen` is pointless now, if it is.
  std::optional<std::string> Abandoned(int64_t gen) const {
    absl::MutexLock lock(&mu_);
    if (view_.generation > gen) {
      return absl::StrCat("rendezvous of generation ", gen,
                          " abandoned: generation ", view_.generation,
                          " opened");
    }
    if (!fenced_.ok()) return std::string("fenced");
    if (job_end_.has_value()) return std::string("the job ended");
    if (bk_stop_) return std::string("the runtime is shutting down");
    return std::nullopt;
  }

  // The one question every wait on the controller asks: may this member
  // still take part in the job (not fenced, the job not over)?
  bool MayGoOnLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return fenced_.ok() && !job_end_.has_value();
  }
  // ... and in generation `gen` (no newer one opened).
  bool GoesOnLocked(int64_t gen) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return view_.generation <= gen && MayGoOnLocked();
  }

  // A communicator of generation `gen` on `store` (rendezvous keys are
  // namespaced by generation); Aborted naming why when the rendezvous was
  // abandoned (a newer generation, fencing, the job's end).
  // `cancelled`, if given, replaces Abandoned(gen).
  absl::StatusOr<std::shared_ptr<Communicator>> CreateComm(
      std::shared_ptr<Store> store, int64_t gen, int world, int slot,
      absl::Duration connect_timeout, bool side = false,
      bulk::Cancelled cancelled = nullptr) {
    if (cancelled == nullptr) {
      cancelled = [this, gen] { return Abandoned(gen); };
    }
    CommunicatorOptions o = options_.comm;
    // The side communicator moves host snapshots: always Gloo.
    if (side) {
      o.backend = "gloo";
      o.inject_faults = false;
    }
    o.rank = slot;
    o.size = world;
    o.generation = gen;
    o.connect_timeout = std::min(o.connect_timeout, connect_timeout);
    o.rendezvous_cancelled = cancelled;
    absl::StatusOr<std::unique_ptr<Communicator>> c =
        Communicator::Create(std::move(store), o);
    if (!c.ok()) {
      if (auto why = cancelled()) return absl::AbortedError(*why);
      return c.status();
    }
    return std::shared_ptr<Communicator>(std::move(*c));
  }

  // Builds the communicator of the current generation.
  absl::Status BuildComm() {
    const View v = CurrentView();
    if (v.standby || v.slot < 0) {
      return absl::FailedPreconditionError("runtime: this member has no slot");
    }
    std::shared_ptr<Communicator> old;
    {
      absl::MutexLock lock(&mu_);
      old = std::move(comm_);
      comm_generation_ = v.generation;
    }
    old.reset();  // joins its threads; never blocks on a peer
    const int64_t gen = v.generation;
    member_->AtRendezvous(gen);
    // The side communicator for backups is built here too, at the same
    // time on a thread of its own, while every member is in the same
    // protocol step: Gloo's connect phase cannot be cancelled, so building
    // it later, while peers train (and may die), could hold a member for
    // Gloo's own timeout. It gives up if the training one fails.
    std::atomic<bool> comm_failed{false};
    bulk::Cancelled side_cancelled =
        [this, gen, &comm_failed]() -> std::optional<std::string> {
      if (comm_failed.load()) {
        return std::string("the training communicator failed");
      }
      return Abandoned(gen);
    };
    absl::Status side_status;
    std::thread side(
        [&] { side_status = BuildSide(gen, v.world, v.slot, side_cancelled); });
    absl::StatusOr<std::shared_ptr<Communicator>> built =
        CreateComm(store_, gen, v.world, v.slot, options_.comm.connect_timeout);
    if (!built.ok()) comm_failed = true;
    side.join();
    if (!built.ok()) return built.status();
    std::shared_ptr<Communicator> comm = *std::move(built);
    {
      absl::MutexLock lock(&mu_);
      comm_ = comm;
      comm_generation_ = gen;
      // An order that arrived while building applies now.
      if (view_.generation > gen) comm_->Abort("a newer generation opened");
    }
    return side_status;
  }

  // The start of Run for a member with a slot: a worker of a fresh job
  // starts from its registered state, or from the disk tier when it holds
  // a checkpoint; a member joining a running job (a standby taking a slot)
  // restores the committed step. Then the starting state is snapshotted and
  // backed up before the first step, so every step after it can be
  // recovered. Returns the step the state is at.
  absl::StatusOr<int64_t> Start() {
    const View v = CurrentView();
    if (v.generation > 0) {
      // Joining a running job is a recovery: the controller does not hold
      // this member's step 0 against it while the state comes in, and it
      // is this member's first recovery for fault injection.
      member_->SetPhase(control::PHASE_RECOVERING, 0);
      fault::Injector::Global().AtRecovery(v.slot, ++recoveries_);
    }
    HOLDFAST_RETURN_IF_ERROR(BuildComm());
    int64_t at = 0;
    if (v.generation > 0 || committed_step() >= 0) {
      const absl::Time t0 = absl::Now();
      RecoveryRecord rec;
      HOLDFAST_ASSIGN_OR_RETURN(at, Restore(&rec));
      HOLDFAST_LOG_INFO(
          "runtime: slot {} of {} joined at generation {}: step {} restored "
          "({}) in {} ms",
          v.slot, v.world, v.generation, at, Received(rec),
          absl::ToInt64Milliseconds(absl::Now() - t0));
      return at;
    }
    if (!options_.checkpoint_dir.empty()) {
      RecoveryRecord rec;
      HOLDFAST_ASSIGN_OR_RETURN(std::optional<int64_t> d,
                                RestoreFromDisk(&rec, /*required=*/false));
      if (d.has_value()) {
        at = *d;
        HOLDFAST_LOG_INFO(
            "runtime: slot {} resumes from the disk tier at "
            "step {}",
            v.slot, at);
        if (v.slot == 0) {
          nlohmann::json j = {{"step", at}, {"dir", options_.checkpoint_dir}};
          (void)store_->Set(keys::kResumed, j.dump());
        }
      }
    }
    state_.RepartitionAll(v.world, v.slot);  // a no-op after a disk restore
    if (at == 0) {
      HOLDFAST_ASSIGN_OR_RETURN(Communicator * host, HostComm());
      HOLDFAST_RETURN_IF_ERROR(CheckReplicatedEqual(host, v));
    }
    high_step_ = std::max(high_step_, at);
    live_step_ = at;
    HOLDFAST_ASSIGN_OR_RETURN(bool taken, Snapshot(at));
    if (!taken ||
        !AwaitCommitted(at, absl::Now() + options_.recovery_timeout)) {
      HOLDFAST_RETURN_IF_ERROR(Terminal());
      absl::Status s = CommHealth();
      return s.ok()
                 ? absl::AbortedError(absl::StrCat("the starting state (step ",
                                                   at, ") was not committed"))
                 : s;
    }
    return at;
  }

  // ---- Restore
  // ----------------------------------------------------------------

  // Waits until the backup thread is out of any round (the caller aborted
  // its communicator) and drops a snapshot it has not started on.
  void QuiesceBackups() {
    {
      absl::MutexLock lock(&bk_mu_);
      if (pending_ != nullptr) DropLocked(pending_);
      // One the backup thread took is never acked now.
      if (deferred_ != nullptr) deferred_->invalid = true;
      deferred_ = nullptr;
    }
    // Only this (the training) thread queues snapshots.
    AwaitBackupIdle(absl::InfiniteFuture());
  }

  // Per member, a set of the pieces of the restore's target (those it
  // holds live, those whose received copy failed): piece p is bit p of the
  // member's words. Each member fills its own (Mine, Add) and Exchange
  // all-gathers them. Empty: nobody has any.
  struct PieceSets {
    size_t words = 0;           // per member
    std::vector<int64_t> bits;  // member m's at [m * words]
    static std::vector<int64_t> Mine(int pieces) {
      return std::vector<int64_t>((static_cast<size_t>(pieces) + 63) / 64, 0);
    }
    static void Add(std::vector<int64_t>* mine, int p) {
      (*mine)[static_cast<size_t>(p) / 64] |=
          static_cast<int64_t>(uint64_t{1} << (p % 64));
    }
    static absl::StatusOr<PieceSets> Exchange(Communicator* comm, int world,
                                              std::vector<int64_t> mine) {
      PieceSets sets;
      sets.words = mine.size();
      sets.bits.resize(sets.words * static_cast<size_t>(world));
      HOLDFAST_RETURN_IF_ERROR(comm->AllGather(mine.data(), sets.bits.data(),
                                               sets.words, DataType::kInt64)
                                   ->Wait());
      return sets;
    }
    bool Has(int m, int p) const {
      if (bits.empty()) return false;
      const uint64_t w = static_cast<uint64_t>(
          bits[static_cast<size_t>(m) * words + static_cast<size_t>(p) / 64]);
      return ((w >> (p % 64)) & 1) != 0;
    }
  };

  // The words each member contributes to a restore's first all-gather.
  enum RestoreWord {
    kCommitted,
    kHigh,
    kLayout,
    kHeld,
    kHostKey,  // 0: this member offers no reads in place
    kPid,
    kProbeAddress,  // of probe_word_, 0 with kHostKey
    kProbeValue,
    kRestoreWords
  };

  // Who may read whose memory in place during a restore (bit r of member
  // m's words: m reads member r's), and every member's pid.
  struct InPlace {
    PieceSets reach;
    std::vector<int64_t> pids;
  };

  // Rolls every member back to the newest committed step. Each member says
  // which pieces of that step it holds (after checking their checksums);
  // the pieces of the newest world cut that is complete are used, each
  // member receiving the ones it needs and lacks from the lowest member
  // holding a good copy (one damaged in transit comes again from the
  // next, see ApplyTarget). With a piece lost everywhere, the disk tier,
  // else DataLoss naming it. `rec` (optional) gets what was received.
  absl::StatusOr<int64_t> Restore(RecoveryRecord* rec) {
    HOLDFAST_ASSIGN_OR_RETURN(Communicator * comm, HostComm());
    const View v = CurrentView();
    QuiesceBackups();
    ++restores_;
    const uint64_t layout = state_.LayoutHash();
    int64_t held;
    {
      absl::MutexLock lock(&bk_mu_);
      held = static_cast<int64_t>(pieces_.size());
    }
    // With this member's host key, pid and probe word (zeros when reads in
    // place are off), for InPlaceReach.
    const bool offer = same_host_restore_ && peer_memory::HostKey() != 0;
    int64_t mine[kRestoreWords];
    mine[kCommitted] = committed_step();
    mine[kHigh] = high_step_;
    mine[kLayout] = static_cast<int64_t>(layout);
    mine[kHeld] = held;
    mine[kHostKey] = offer ? static_cast<int64_t>(peer_memory::HostKey()) : 0;
    mine[kPid] = static_cast<int64_t>(getpid());
    mine[kProbeAddress] =
        offer ? static_cast<int64_t>(reinterpret_cast<uintptr_t>(&probe_word_))
              : 0;
    mine[kProbeValue] = static_cast<int64_t>(probe_word_);
    std::vector<int64_t> all(static_cast<size_t>(v.world) * kRestoreWords);
    HOLDFAST_RETURN_IF_ERROR(
        comm->AllGather(mine, all.data(), kRestoreWords, DataType::kInt64)
            ->Wait());
    HOLDFAST_ASSIGN_OR_RETURN(InPlace in_place, InPlaceReach(comm, v, all));
    int64_t kmax = 1;
    std::vector<int64_t> highs(static_cast<size_t>(v.world));
    std::vector<checkpoint::MemberState> states(static_cast<size_t>(v.world));
    for (int r = 0; r < v.world; ++r) {
      const int64_t* e = &all[static_cast<size_t>(r) * kRestoreWords];
      highs[static_cast<size_t>(r)] = e[kHigh];
      if (e[kLayout] != mine[kLayout]) {
        return LayoutMismatch(r, static_cast<uint64_t>(e[kLayout]), v.slot,
                              layout);
      }
      states[static_cast<size_t>(r)] = {e[kCommitted], e[kHigh]};
      kmax = std::max(kmax, e[kHeld]);
    }
    const checkpoint::Target chosen = checkpoint::ChooseTarget(states);
    const int64_t target = chosen.step;
    lost_steps_ = chosen.lost;
    // Snapshots past the target belong to a timeline that was abandoned.
    Evict([target](const Piece& p) { return p.step > target; });

    // What this member holds of the target: [layout generation, world,
    // slot, checksum, good, address], padded with world = 0.
    constexpr int kFields = 6;
    std::vector<int64_t> entries(static_cast<size_t>(kmax) * kFields, 0);
    std::vector<Piece*> at;
    {
      absl::MutexLock lock(&bk_mu_);
      for (auto& p : pieces_) {
        if (p->step == target) at.push_back(p.get());
      }
    }
    std::vector<bool> good_at(at.size());
    const size_t offered = std::min(at.size(), static_cast<size_t>(kmax));
    std::vector<uint64_t> sums(offered);
    ForEachOnThreads(offered, kRestoreThreads, [&](size_t i) {
      sums[i] = shards::Checksum(at[i]->bytes.get(), at[i]->size);
    });
    for (size_t i = 0; i < offered; ++i) {
      const Piece& p = *at[i];
      const bool good = sums[i] == p.checksum;
      good_at[i] = good;
      if (!good) {
        HOLDFAST_LOG_ERROR(
            "runtime: slot {}'s copy of the piece of slot {} (world {}, step "
            "{}) failed its checksum; it is not used",
            v.slot, p.slot, p.world, p.step);
      }
      int64_t* e = &entries[i * kFields];
      e[0] = p.layout_generation;
      e[1] = p.world;
      e[2] = p.slot;
      e[3] = static_cast<int64_t>(p.checksum);
      e[4] = good ? 1 : 0;
      e[5] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p.bytes.get()));
    }
    std::vector<int64_t> every(entries.size() * static_cast<size_t>(v.world));
    HOLDFAST_RETURN_IF_ERROR(comm->AllGather(entries.data(), every.data(),
                                             entries.size(), DataType::kInt64)
                                 ->Wait());
    std::vector<std::vector<checkpoint::OfferedCopy>> offers(
        static_cast<size_t>(v.world));
    for (int m = 0; m < v.world; ++m) {
      for (int64_t i = 0; i < kmax; ++i) {
        const int64_t* e =
            &every[(static_cast<size_t>(m) * static_cast<size_t>(kmax) +
                    static_cast<size_t>(i)) *
                   kFields];
        offers[static_cast<size_t>(m)].push_back(
            {e[0], static_cast<int>(e[1]), static_cast<int>(e[2]),
             static_cast<uint64_t>(e[3]), e[4] != 0,
             static_cast<uint64_t>(e[5])});
      }
    }
    const checkpoint::CutChoice choice = checkpoint::ChooseCut(offers);
    const std::string& missing = choice.missing;
    if (!choice.cut.has_value()) {
      const std::string why = absl::StrCat(
          "step ", target,
          " cannot be restored from memory: no live member "
          "holds a good copy of ",
          missing.empty() ? std::string("any piece") : missing,
          " (with replicas=", options_.replicas, " every piece has ",
          options_.replicas + 1,
          " copies; all of them are gone or failed their checksum)");
      HOLDFAST_ASSIGN_OR_RETURN(std::optional<int64_t> from_live,
                                RestoreFromLive(comm, v, why, rec));
      if (from_live.has_value()) return *from_live;
      live_step_ = -1;  // the disk tier writes the live state
      if (options_.checkpoint_dir.empty()) {
        return absl::DataLossError(absl::StrCat(
            why, "; no disk tier is configured (HOLDFAST_CHECKPOINT_DIR)"));
      }
      HOLDFAST_LOG_WARN("runtime: {}; falling back to the disk tier", why);
      RecoveryRecord ignored;
      absl::StatusOr<std::optional<int64_t>> d =
          RestoreFromDisk(rec != nullptr ? rec : &ignored, /*required=*/true);
      if (!d.ok()) {
        return absl::Status(d.status().code(),
                            absl::StrCat(why, "; ", d.status().message()));
      }
      return **d;
    }

    const checkpoint::Holders& use = choice.cut->holders;
    const int64_t use_gen = choice.cut->layout_generation;
    const int old_world = choice.cut->world;

    // Transfers, in one order every member follows.
    state_.RepartitionAll(v.world, v.slot);
    std::map<int, const Piece*> local;
    for (size_t i = 0; i < at.size(); ++i) {
      const Piece* p = at[i];
      if (good_at[i] && p->layout_generation == use_gen &&
          p->world == old_world) {
        local.emplace(p->slot, p);
      }
    }
    HOLDFAST_ASSIGN_OR_RETURN(
        PieceSets live,
        LivePieces(comm, v, target, highs, old_world, use.checksum, local));
    std::map<int, std::unique_ptr<Piece>> received;
    int64_t bytes_received = 0, bytes_in_place = 0;
    live_step_ = -1;  // until the target is in the live state
    HOLDFAST_RETURN_IF_ERROR(ApplyTarget(comm, v, target, use_gen, old_world,
                                         use, local, live, in_place, &received,
                                         &bytes_received, &bytes_in_place));
    {
      // The received copies ApplyTarget kept stay: they cover a second
      // fault before the next commit.
      absl::MutexLock lock(&bk_mu_);
      for (auto& [p, piece] : received) pieces_.push_back(std::move(piece));
    }
    if (rec != nullptr) {
      rec->bytes_received = bytes_received;
      rec->bytes_read_in_place = bytes_in_place;
      rec->received_state = bytes_received > 0;
    }
    high_step_ = std::max(high_step_, target);
    live_step_ = target;
    return target;
  }

  // Restore's fallback when a piece of the committed step has no good copy
  // left and all state is replicated: the members whose live state is
  // known to be a completed step (`live_step_`) offer it, the newest such
  // step is taken when every member holding it has the same hash, and the
  // lowest of them broadcasts it to the others, who check it against that
  // hash. nullopt when no member can offer (sharded state, or no member
  // knows its live step); DataLoss when the holders disagree or a copy
  // arrives damaged. `why`: why the pieces could not be used.
  absl::StatusOr<std::optional<int64_t>> RestoreFromLive(Communicator* comm,
                                                         const View& v,
                                                         const std::string& why,
                                                         RecoveryRecord* rec) {
    if (!state_.ReplicatedOnly()) return std::nullopt;  // alike on every member
    int64_t mine[2] = {live_step_, 0};
    if (live_step_ >= 0) mine[1] = static_cast<int64_t>(state_.LiveHash());
    std::vector<int64_t> all(static_cast<size_t>(v.world) * 2);
    HOLDFAST_RETURN_IF_ERROR(
        comm->AllGather(mine, all.data(), 2, DataType::kInt64)->Wait());
    int64_t step = -1;
    for (int r = 0; r < v.world; ++r) step = std::max(step, all[2 * r]);
    if (step < 0) return std::nullopt;
    int source = -1;
    std::vector<int> holders;
    for (int r = 0; r < v.world; ++r) {
      if (all[2 * r] != step) continue;
      holders.push_back(r);
      if (source < 0) source = r;
      if (all[2 * r + 1] != all[2 * source + 1]) {
        return absl::DataLossError(absl::StrCat(
            why, "; the live state of step ", step,
            " cannot stand in for it: slot ", source, " and slot ", r,
            " hold it with different hashes (", absl::Hex(all[2 * source + 1]),
            ", ", absl::Hex(all[2 * r + 1]), ")"));
      }
    }
    const uint64_t want = static_cast<uint64_t>(all[2 * source + 1]);
    const bool receive = v.slot != source && live_step_ != step;
    live_step_ = -1;  // until the broadcast has landed and checked
    int64_t bytes = 0;
    for (const StateBuffer& b : state_.buffers()) {
      if (b.ledger || b.global == 0) continue;
      HOLDFAST_RETURN_IF_ERROR(
          comm->Broadcast(b.data, b.global, DataType::kUInt8, source)->Wait());
      bytes += static_cast<int64_t>(b.global);
    }
    // A member that never stepped has no timings of its own: it goes on
    // with the source's (the slots step together).
    int64_t ledger[kLedger];
    std::memcpy(ledger, ledger_, sizeof(ledger));
    HOLDFAST_RETURN_IF_ERROR(
        comm->Broadcast(ledger, kLedger, DataType::kInt64, source)->Wait());
    if (ledger_[0] == 0) std::memcpy(ledger_, ledger, sizeof(ledger));
    if (state_.LiveHash() != want) {
      return absl::DataLossError(absl::StrCat(
          why, "; the live state of step ", step, " broadcast by slot ", source,
          " arrived at slot ", v.slot, " with another hash"));
    }
    HOLDFAST_LOG_WARN(
        "runtime: slot {}: {}; restored step {} from the live state of slot "
        "{} instead (slots {} hold it, with one hash)",
        v.slot, why, step, source, absl::StrJoin(holders, ", "));
    if (rec != nullptr) {
      rec->bytes_received = receive ? bytes : 0;
      rec->received_state = receive;
    }
    lost_steps_ = std::max<int64_t>(0, high_step_ - step);
    high_step_ = std::max(high_step_, step);
    live_step_ = step;
    return std::optional<int64_t>(step);
  }

  // Which members may read which members' memory in place in this
  // restore, from the first all-gather's entries (RestoreWord: the host
  // key, the pid, the probe word's address and value). Each member reads
  // the probe word of every other member with its own host key (one small
  // process_vm_readv each) and the results are all-gathered, when any two
  // members share a host key at all (every member knows whether they do,
  // so all take part or none).
  absl::StatusOr<InPlace> InPlaceReach(Communicator* comm, const View& v,
                                       const std::vector<int64_t>& all) {
    InPlace in_place;
    auto at = [&](int r, RestoreWord word) {
      return all[static_cast<size_t>(r) * kRestoreWords + word];
    };
    std::set<int64_t> keys;
    bool shared = false;
    for (int r = 0; r < v.world; ++r) {
      in_place.pids.push_back(at(r, kPid));
      if (at(r, kHostKey) != 0) shared |= !keys.insert(at(r, kHostKey)).second;
    }
    if (!shared) return in_place;
    const int64_t key = at(v.slot, kHostKey);
    std::vector<int64_t> mine = PieceSets::Mine(v.world);
    for (int r = 0; r < v.world; ++r) {
      if (r != v.slot && key != 0 && at(r, kHostKey) == key &&
          peer_memory::Probe(at(r, kPid),
                             static_cast<uint64_t>(at(r, kProbeAddress)),
                             static_cast<uint64_t>(at(r, kProbeValue)))) {
        PieceSets::Add(&mine, r);
      }
    }
    HOLDFAST_ASSIGN_OR_RETURN(in_place.reach,
                              PieceSets::Exchange(comm, v.world, mine));
    return in_place;
  }

  // The end of a restore: copies the target's pieces this member needs
  // into its live buffers, from its own copies or received ones. Every
  // piece some member needs and neither holds nor has live moves, in an
  // order every member follows, from its first holder: read in place from
  // the holder's memory where `in_place` says the member may (the holder
  // sends nothing), else over the communicator. A piece read in place
  // whose copy is not kept (see `keep`) is read straight into the live
  // buffers and checked there; any other received piece is checked as it
  // is copied into them (one pass over its bytes); one that fails
  // (damaged in transit) is received again from its next holder, in a
  // round every member takes part in: after each round with transfers the
  // members exchange which pieces failed (one all-gather). DataLoss, naming
  // the piece, when it failed from every holder; the live state it was
  // partly copied into is then not used (the member does not go on).
  absl::Status ApplyTarget(Communicator* comm, const View& v, int64_t target,
                           int64_t use_gen, int old_world,
                           const checkpoint::Holders& use,
                           const std::map<int, const Piece*>& local,
                           const PieceSets& live, const InPlace& in_place,
                           std::map<int, std::unique_ptr<Piece>>* received,
                           int64_t* bytes_received, int64_t* bytes_in_place) {
    // Every member knows where the others' copies lie now.
    fault::Injector::Global().AtRestore(v.slot, restores_);
    std::vector<std::pair<int, int>> todo;  // (piece, member)
    for (int p = 0; p < old_world; ++p) {
      const std::vector<int>& hs = use.by_slot[static_cast<size_t>(p)];
      if (state_.PieceSize(old_world, p) == 0) continue;
      for (int m = 0; m < v.world; ++m) {
        if (std::find(hs.begin(), hs.end(), m) == hs.end() && !live.Has(m, p) &&
            state_.Needs(v.world, m, old_world, p)) {
          todo.emplace_back(p, m);
        }
      }
      auto l = local.find(p);
      if (l != local.end() && state_.Needs(v.world, v.slot, old_world, p) &&
          !live.Has(v.slot, p)) {
        state_.Apply(l->second->bytes.get(), old_world, p, v.world, v.slot);
      }
    }
    // A received copy is kept (it covers a second fault before the next
    // commit) where the piece has fewer holders than a commit leaves it
    // (replicas + 1): by its first receivers, as many as are missing. A
    // piece read in place and not kept goes straight into the live state.
    std::set<int> keep;
    {
      std::vector<int> missing(static_cast<size_t>(old_world));
      for (int p = 0; p < old_world; ++p) {
        missing[static_cast<size_t>(p)] =
            options_.replicas + 1 -
            static_cast<int>(use.by_slot[static_cast<size_t>(p)].size());
      }
      for (const auto& [p, m] : todo) {
        if (missing[static_cast<size_t>(p)]-- > 0 && m == v.slot) {
          keep.insert(p);
        }
      }
    }
    std::set<int> arrived;  // received pieces that passed their check
    OpOptions oo;
    oo.tag = kRestoreTag;
    // Whether piece p has a holder after the one of `round`.
    auto has_next = [&use](int p, size_t round) {
      return use.by_slot[static_cast<size_t>(p)].size() > round + 1;
    };
    absl::Status lost;
    for (size_t round = 0; !todo.empty(); ++round) {
      std::vector<std::shared_ptr<Work>> works;
      std::map<int, int> sender;  // piece -> who sends it to this member
      std::vector<int> reads;     // pieces this member reads in place
      // Where each piece this member takes lands: its live buffers (the
      // pieces in `into_live`, read in place) or a piece buffer in
      // `received`.
      std::map<int, Segments> lands;
      std::set<int> into_live;
      // Kept pieces read in place whose bytes all go into the live state:
      // where, each chunk copied there from the cache as it lands.
      std::map<int, Segments> also_live;
      for (const auto& [p, m] : todo) {
        const int from = use.by_slot[static_cast<size_t>(p)][round];
        const size_t size = state_.PieceSize(old_world, p);
        const uint64_t checksum = use.checksum[static_cast<size_t>(p)];
        const bool direct = in_place.reach.Has(m, from);
        if (v.slot == from && !direct) {
          PostSends(comm, local.at(p)->bytes.get(), size, m, oo, &works);
        } else if (v.slot == m) {
          sender[p] = from;
          if (direct) reads.push_back(p);
          Segments live_at = direct
                                 ? state_.Landing(old_world, p, v.world, v.slot)
                                 : Segments{};
          if (!live_at.empty() && keep.count(p) == 0) {
            into_live.insert(p);
            lands[p] = std::move(live_at);
            received->erase(p);  // a copy that failed in an earlier round
            continue;
          }
          std::unique_ptr<Piece>& piece = (*received)[p];
          piece = direct ? NewPiece(target, use_gen, old_world, p, checksum)
                         : PostReceive(comm, target, use_gen, old_world, p,
                                       checksum, from, oo, &works);
          lands[p] = {{piece->bytes.get(), piece->size}};
          if (!live_at.empty()) also_live[p] = std::move(live_at);
        }
      }
      // An injected `corrupt-restore` damages the first piece this member
      // takes, in the middle of its first landing segment: for a piece
      // read in place and hashed as it lands, in its chunk before the
      // chunk is hashed; else once every piece is in.
      const int hit =
          !sender.empty() && fault::Injector::Global().AtShard(
                                 fault::Kind::kCorruptRestore, v.slot, target)
              ? sender.begin()->first
              : -1;
      uint8_t* const damage_at = hit >= 0 ? lands.at(hit).front().first +
                                                lands.at(hit).front().second / 2
                                          : nullptr;
      auto damage = [&] {
        *damage_at ^= 0x5a;
        HOLDFAST_LOG_WARN(
            "runtime: corrupted the piece of slot {} that slot {} received "
            "for step {}{} (injected)",
            hit, v.slot, target,
            into_live.count(hit) > 0 ? ", read into its live state" : "");
      };
      // The holders stay in this round (its all-gather below) until every
      // reader is done, so the pieces read are there; their checksums are
      // checked below all the same: a piece read into the live state, or
      // copied there as it lands, chunk by chunk, each hashed while it is
      // in the cache (`live_hashes`).
      // The works of the communicator go on meanwhile, and are waited for
      // before any error is returned (their buffers are `received`'s).
      std::map<int, shards::CopyHasher> live_hashes;
      for (int p : reads) {
        if (into_live.count(p) > 0 || also_live.count(p) > 0) live_hashes[p];
      }
      auto read_piece = [&](int p) -> absl::Status {
        const int from = sender.at(p);
        const int64_t pid = in_place.pids[static_cast<size_t>(from)];
        uint64_t address = use.address_by_slot[static_cast<size_t>(p)][round];
        auto hashed = live_hashes.find(p);
        shards::CopyHasher* h =
            hashed != live_hashes.end() ? &hashed->second : nullptr;
        auto copied = also_live.find(p);
        const Segments* out =
            copied != also_live.end() ? &copied->second : nullptr;
        absl::Status s;
        size_t done = 0;  // of the piece's bytes
        for (const auto& [dst, bytes] : lands.at(p)) {
          for (size_t off = 0; s.ok() && off < bytes; off += kReadChunk) {
            const size_t n = std::min(kReadChunk, bytes - off);
            s = peer_memory::Read(pid, address + off, dst + off, n);
            if (h == nullptr || !s.ok()) continue;
            if (damage_at >= dst + off && damage_at < dst + off + n) damage();
            if (out != nullptr) {
              checkpoint::CopyInto(*out, done + off, dst + off, n, h);
            } else {
              h->Update(dst + off, n);
            }
          }
          if (!s.ok()) break;
          address += bytes;
          done += bytes;
        }
        if (!s.ok()) {
          return absl::UnavailableError(absl::StrCat(
              "restore: the piece of slot ", p, " could not be read from slot ",
              from, " on this host: ", s.message()));
        }
        return absl::OkStatus();
      };
      std::vector<absl::Status> read_out(reads.size());
      ForEachOnThreads(reads.size(), kRestoreThreads,
                       [&](size_t i) { read_out[i] = read_piece(reads[i]); });
      absl::Status read_status;
      for (size_t i = 0; i < reads.size(); ++i) {
        if (!read_out[i].ok()) {
          read_status = read_out[i];
          break;
        }
        *bytes_in_place +=
            static_cast<int64_t>(state_.PieceSize(old_world, reads[i]));
      }
      for (auto& w : works) HOLDFAST_RETURN_IF_ERROR(w->Wait());
      HOLDFAST_RETURN_IF_ERROR(read_status);
      if (hit >= 0 && live_hashes.count(hit) == 0) damage();
      std::vector<int64_t> bad = PieceSets::Mine(old_world);
      for (const auto& [p, from] : sender) {
        *bytes_received += static_cast<int64_t>(state_.PieceSize(old_world, p));
        uint64_t digest;
        if (live_hashes.count(p) > 0) {
          digest = live_hashes.at(p).Digest();
        } else {
          shards::CopyHasher h;
          state_.Apply(received->at(p)->bytes.get(), old_world, p, v.world,
                       v.slot, &h);
          digest = h.Digest();
        }
        if (digest == use.checksum[static_cast<size_t>(p)]) {
          arrived.insert(p);
          continue;
        }
        PieceSets::Add(&bad, p);
        const bool more = has_next(p, round);
        const std::string why = absl::StrCat(
            "the piece of slot ", p, " (world ", old_world, ", step ", target,
            ") received from slot ", from, " failed its checksum");
        HOLDFAST_LOG_ERROR("runtime: slot {}: {}{}", v.slot, why,
                           more ? "; receiving it from its next holder"
                                : "; no other member holds a good copy");
        if (!more && lost.ok()) lost = absl::DataLossError(why);
      }
      HOLDFAST_ASSIGN_OR_RETURN(
          PieceSets failed, PieceSets::Exchange(comm, v.world, std::move(bad)));
      std::vector<std::pair<int, int>> again;
      for (const auto& [p, m] : todo) {
        if (failed.Has(m, p) && has_next(p, round)) again.emplace_back(p, m);
      }
      todo = std::move(again);
    }
    if (!lost.ok()) return lost;
    for (int p = 0; p < old_world; ++p) {
      if (state_.PieceSize(old_world, p) > 0 &&
          state_.Needs(v.world, v.slot, old_world, p) && !live.Has(v.slot, p) &&
          local.count(p) == 0 && arrived.count(p) == 0) {
        return absl::InternalError(
            absl::StrCat("restore: the piece of slot ", p, " never arrived"));
      }
    }
    return absl::OkStatus();
  }

  // The pieces of step `target` (cut for `old_world`) that members need
  // and need not receive: with replicated state only, a member that
  // finished no step after the target (`highs`, every member's newest
  // step) hashes the live bytes of each piece it needs and does not hold;
  // one that equals the piece's checksum is the target's already (a step
  // that failed half-way may have changed some bytes: those pieces are
  // received as usual). When commits keep up with the steps, survivors of
  // a fault then receive nothing. When no member is at the target nothing
  // is hashed or exchanged.
  //
  // The runtime's ledger is the one registered buffer that differs
  // between slots (each times its own steps): piece p carries slot p's
  // part of slot p's ledger. No live ledger holds those bytes (a
  // replacement's is new), so they are taken from the target's copies:
  // each member contributes the ledger parts of the pieces it holds
  // (TargetLedger). They are copied into this member's ledger when the
  // piece matches, as a received piece would have been.
  absl::StatusOr<PieceSets> LivePieces(
      Communicator* comm, const View& v, int64_t target,
      const std::vector<int64_t>& highs, int old_world,
      const std::vector<uint64_t>& checksums,
      const std::map<int, const Piece*>& local) {
    PieceSets live;
    if (!state_.ReplicatedOnly() ||
        std::find(highs.begin(), highs.end(), target) == highs.end()) {
      return live;
    }
    HOLDFAST_ASSIGN_OR_RETURN(LedgerImage image,
                              TargetLedger(comm, v, old_world, local));
    const auto* target_ledger = reinterpret_cast<const uint8_t*>(image.bytes);
    std::vector<int64_t> mine = PieceSets::Mine(old_world);
    int count = 0;
    if (high_step_ == target) {
      for (int p = 0; p < old_world; ++p) {
        if (local.count(p) > 0 || state_.PieceSize(old_world, p) == 0 ||
            !state_.Needs(v.world, v.slot, old_world, p)) {
          continue;
        }
        shards::CopyHasher h;
        bool comparable = true;
        shards::Range ledger_part{0, 0};  // of the ledger, in piece p
        for (const StateBuffer& b : state_.buffers()) {
          const shards::Range r = Registry::Part(b, old_world, p);
          if (r.bytes == 0) continue;
          if (!b.ledger) {
            h.Update(b.data + r.offset, r.bytes);
          } else if (image.Covers(r)) {
            h.Update(target_ledger + r.offset, r.bytes);
            ledger_part = r;
          } else {
            comparable = false;  // no member holds it (never so in a restore)
            break;
          }
        }
        if (comparable && h.Digest() == checksums[static_cast<size_t>(p)]) {
          PieceSets::Add(&mine, p);
          ++count;
          std::memcpy(reinterpret_cast<uint8_t*>(ledger_) + ledger_part.offset,
                      target_ledger + ledger_part.offset, ledger_part.bytes);
        }
      }
    }
    HOLDFAST_ASSIGN_OR_RETURN(
        live, PieceSets::Exchange(comm, v.world, std::move(mine)));
    if (count > 0) {
      HOLDFAST_LOG_INFO(
          "runtime: slot {} already holds {} piece(s) of step {} live; they "
          "are not received",
          v.slot, count, target);
    }
    return live;
  }

  // The runtime's ledger as a restore of the target assembles it: the
  // part of piece p is slot p's. `known` has bit i set where byte i is.
  struct LedgerImage {
    int64_t bytes[kLedger] = {0, 0, 0};
    int64_t known = 0;
    bool Covers(const shards::Range& r) const {
      for (size_t i = r.offset; i < r.offset + r.bytes; ++i) {
        if (((known >> i) & 1) == 0) return false;
      }
      return true;
    }
  };

  // Gathers the ledger parts of the target's pieces from the members
  // holding copies of them (`local`, this member's: slot -> copy).
  absl::StatusOr<LedgerImage> TargetLedger(
      Communicator* comm, const View& v, int old_world,
      const std::map<int, const Piece*>& local) {
    static_assert(sizeof(LedgerImage::bytes) <= 64, "one bit a byte");
    LedgerImage mine;
    auto* out = reinterpret_cast<uint8_t*>(mine.bytes);
    for (const auto& [p, piece] : local) {
      size_t at = 0;  // where the ledger's part lies in the piece
      for (const StateBuffer& b : state_.buffers()) {
        const shards::Range r = Registry::Part(b, old_world, p);
        if (b.ledger) {
          std::memcpy(out + r.offset, piece->bytes.get() + at, r.bytes);
          for (size_t i = r.offset; i < r.offset + r.bytes; ++i) {
            mine.known |= int64_t{1} << i;
          }
          break;
        }
        at += r.bytes;
      }
    }
    constexpr size_t kWords = kLedger + 1;
    static_assert(sizeof(LedgerImage) == kWords * sizeof(int64_t));
    std::vector<LedgerImage> all(static_cast<size_t>(v.world));
    HOLDFAST_RETURN_IF_ERROR(
        comm->AllGather(&mine, all.data(), kWords, DataType::kInt64)->Wait());
    LedgerImage image;
    auto* in = reinterpret_cast<uint8_t*>(image.bytes);
    for (const LedgerImage& m : all) {
      const auto* from = reinterpret_cast<const uint8_t*>(m.bytes);
      for (size_t i = 0; i < sizeof(image.bytes); ++i) {
        if (((m.known >> i) & 1) != 0) in[i] = from[i];
      }
      image.known |= m.known;
    }
    return image;
  }

  // Restores from the disk tier's newest complete checkpoint. nullopt when
  // there is none and it is not `required` (else DataLoss).
  absl::StatusOr<std::optional<int64_t>> RestoreFromDisk(RecoveryRecord* rec,
                                                         bool required) {
    HOLDFAST_ASSIGN_OR_RETURN(Communicator * comm, HostComm());
    const View v = CurrentView();
    const std::string& dir = options_.checkpoint_dir;
    const uint64_t layout = state_.LayoutHash();
    absl::StatusOr<std::optional<shards::DiskStep>> found =
        shards::FindNewest(dir, layout);
    int64_t mine[2] = {-1, 0};
    if (found.ok() && found->has_value()) {
      mine[0] = (*found)->step;
      mine[1] = (*found)->world;
    } else if (!found.ok()) {
      mine[0] = -2;
    }
    std::vector<int64_t> all(static_cast<size_t>(v.world) * 2);
    HOLDFAST_RETURN_IF_ERROR(
        comm->AllGather(mine, all.data(), 2, DataType::kInt64)->Wait());
    int64_t step = -1;
    int world = 0;
    bool refused = false;
    for (int r = 0; r < v.world; ++r) {
      refused |= all[static_cast<size_t>(r) * 2] == -2;
      if (all[static_cast<size_t>(r) * 2] > step) {
        step = all[static_cast<size_t>(r) * 2];
        world = static_cast<int>(all[static_cast<size_t>(r) * 2 + 1]);
      }
    }
    if (!found.ok()) return found.status();
    if (refused) {
      return absl::InvalidArgumentError(
          "another slot refused the disk checkpoint (see its log)");
    }
    if (step < 0) {
      if (!required) return std::optional<int64_t>();
      return absl::DataLossError(absl::StrCat("the disk tier in ", dir,
                                              " holds no complete checkpoint"));
    }
    state_.RepartitionAll(v.world, v.slot);
    absl::Status s;
    std::vector<uint8_t> data;
    for (int p = 0; p < world && s.ok(); ++p) {
      if (!state_.Needs(v.world, v.slot, world, p)) continue;
      shards::PieceHeader h;
      s = shards::ReadPiece(shards::PiecePath(dir, step, world, p), layout, &h,
                            &data);
      if (s.ok() && data.size() != state_.PieceSize(world, p)) {
        s = absl::DataLossError(absl::StrCat(
            "checkpoint piece ", shards::PiecePath(dir, step, world, p),
            " holds ", data.size(), " bytes; ", state_.PieceSize(world, p),
            " expected"));
      }
      if (s.ok()) state_.Apply(data.data(), world, p, v.world, v.slot);
    }
    const int64_t ok = s.ok() ? 1 : 0;
    std::vector<int64_t> oks(static_cast<size_t>(v.world));
    HOLDFAST_RETURN_IF_ERROR(
        comm->AllGather(&ok, oks.data(), 1, DataType::kInt64)->Wait());
    if (!s.ok()) return s;
    for (int r = 0; r < v.world; ++r) {
      if (oks[static_cast<size_t>(r)] == 0) {
        return absl::DataLossError(absl::StrCat(
            "slot ", r, " could not read the disk checkpoint of step ", step,
            " in ", dir, " (see its log)"));
      }
    }
    lost_steps_ = std::max<int64_t>(0, high_step_ - step);
    last_disk_step_ = step;
    rec->from_disk = true;
    HOLDFAST_LOG_WARN("runtime: slot {} restored step {} from the disk tier",
                      v.slot, step);
    return std::optional<int64_t>(step);
  }

  // ---- Backups (the background thread) ------------------------------------

  void BackupLoop() {
    for (;;) {
      int64_t gen;
      {
        absl::MutexLock lock(&bk_mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(bk_mu_) {
          return bk_wake_ || pending_ != nullptr;
        };
        bk_mu_.Await(absl::Condition(&ready));
        if (bk_stop_) return;
        bk_wake_ = false;
        if (pending_ == nullptr) continue;
        gen = pending_->layout_generation;
      }
      absl::StatusOr<SideChannel> side = Side(gen);
      Piece* own;
      {
        absl::MutexLock lock(&bk_mu_);
        if (bk_stop_) return;
        if (pending_ == nullptr || pending_->layout_generation != gen) {
          continue;  // a restore dropped it
        }
        own = pending_;
        pending_ = nullptr;
        if (!side.ok()) {
          DropLocked(own);
        } else {
          busy_ = true;
          round_step_ = own->step;
        }
      }
      // (A piece offered again was copied in its first round.)
      if (side.ok() && own->deferred && !own->copied) CopyIn(own);
      const absl::Time t0 = absl::Now();  // the round proper, after any copy
      RoundClock clock;
      bool again = false;  // the newest step offered: offer it again
      absl::StatusOr<bool> committed =
          side.ok() ? BackupRound(own, side->comm.get(), side->links.get(),
                                  &clock, &again)
                    : side.status();
      {
        absl::MutexLock lock(&bk_mu_);
        busy_ = false;
        idle_round_ = false;
        gate_ = nullptr;
        if (committed.ok() && *committed) {
          ++backups_;
          backup_us_ += absl::ToInt64Microseconds(clock.seen - t0);
          gate_us_ += absl::ToInt64Microseconds(clock.gated);
          commit_wait_us_ +=
              absl::ToInt64Microseconds(clock.seen - clock.acked);
          last_acked_ = clock.acked;
        }
        // Offered again (unless a restore or an unfenced step dropped it
        // meanwhile) before a snapshot taken during the agreement: the
        // other slots offer this step next, and that one is dropped.
        if (again && std::any_of(pieces_.begin(), pieces_.end(),
                                 [own](const std::unique_ptr<Piece>& p) {
                                   return p.get() == own;
                                 })) {
          if (pending_ != nullptr) DropLocked(pending_);
          pending_ = own;
        }
      }
      if (!committed.ok()) SideFailed(committed.status(), gen);
    }
  }

  // The side communicator of generation `gen` and its backup links, for
  // the backup thread. It holds references for its round, so a rebuild on
  // the training thread never destroys them under a transfer.
  struct SideChannel {
    std::shared_ptr<Communicator> comm;
    std::shared_ptr<bulk::Links> links;
  };
  absl::StatusOr<SideChannel> Side(int64_t gen) {
    absl::MutexLock lock(&mu_);
    if (side_generation_ != gen || side_ == nullptr || links_ == nullptr) {
      return absl::AbortedError(
          absl::StrCat("no side communicator of generation ", gen));
    }
    HOLDFAST_RETURN_IF_ERROR(side_->health());
    return SideChannel{side_, links_};
  }

  // Builds the side communicator of generation `gen` and places the
  // buddies of every slot in it.
  absl::Status BuildSide(int64_t gen, int world, int slot,
                         const bulk::Cancelled& cancelled) {
    std::shared_ptr<Communicator> old;
    std::shared_ptr<bulk::Links> old_links;
    {
      absl::MutexLock lock(&mu_);
      old = std::move(side_);
      old_links = std::move(links_);
      side_generation_ = gen;
    }
    old.reset();
    old_links.reset();
    std::shared_ptr<Store> store = NewPrefixStore(
        keys::kSidePrefix, NewCancellableStore(store_, cancelled));
    // The backup links' listener; its address is published before this
    // member arrives, so every member that saw it arrive can connect.
    HOLDFAST_ASSIGN_OR_RETURN(std::unique_ptr<bulk::Listener> listener,
                              bulk::Listener::Open(options_.comm.bind_address,
                                                   options_.comm.interface));
    const std::string bulk_key = absl::StrCat("g", gen, "/bulk/");
    HOLDFAST_RETURN_IF_ERROR(
        store->Set(absl::StrCat(bulk_key, slot), listener->address()));
    // Everyone arrives first. The training communicator of this
    // generation is being built at the same time, so every member is in
    // the same protocol step: one that does not come within the connect
    // timeout is stuck, and is named as absent (reported like a rendezvous
    // no-show). A new generation, leaving, or the failure of the training
    // communicator cancels the wait.
    const std::string arrived = absl::StrCat("g", gen, "/arrived/");
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) keys.push_back(absl::StrCat(arrived, r));
    absl::Status here = store->Set(absl::StrCat(arrived, slot), "1");
    if (here.ok()) here = store->Wait(keys, options_.comm.connect_timeout);
    if (!here.ok()) {
      if (auto why = cancelled()) return absl::AbortedError(*why);
      std::vector<size_t> missing;
      if (here.code() == absl::StatusCode::kDeadlineExceeded) {
        missing = MissingKeys(*store, keys);  // not this slot's: set above
      }
      if (!missing.empty()) {
        const int r = static_cast<int>(missing.front());
        here = absl::DeadlineExceededError(
            absl::StrCat("side communicator of generation ", gen, ": slot ", r,
                         " did not arrive within ",
                         absl::FormatDuration(options_.comm.connect_timeout),
                         " (", here.message(), ")"));
        SetAbsent(&here, r);
      }
      return here;
    }
    HOLDFAST_ASSIGN_OR_RETURN(
        std::shared_ptr<Communicator> side,
        CreateComm(store, gen, world, slot, kSideConnectTimeout,
                   /*side=*/true, cancelled));
    {
      absl::MutexLock lock(&mu_);
      side_ = side;
      if (view_.generation > gen) side_->Abort("a newer generation opened");
    }
    // Failure domains: each member's own labels, exchanged here, and
    // whether it checks backups on arrival (every member must run the same
    // round: if their settings differ, the stricter one is used).
    const int64_t labels[3] = {
        static_cast<int64_t>(
            XXH3_64bits(options_.host.data(), options_.host.size())),
        options_.topology_block.empty()
            ? 0
            : static_cast<int64_t>(XXH3_64bits(options_.topology_block.data(),
                                               options_.topology_block.size())),
        options_.verify_backups == VerifyBackups::kArrival ? 1 : 0};
    std::vector<int64_t> all(static_cast<size_t>(world) * 3);
    HOLDFAST_RETURN_IF_ERROR(
        side->AllGather(labels, all.data(), 3, DataType::kInt64)->Wait());
    shards::PlacementInput in;
    int arrival = 0;
    for (int r = 0; r < world; ++r) {
      const size_t at = static_cast<size_t>(r) * 3;
      in.domain.push_back(static_cast<uint64_t>(all[at]));
      in.block.push_back(static_cast<uint64_t>(all[at + 1]));
      arrival += all[at + 2] != 0 ? 1 : 0;
    }
    if (arrival > 0 && arrival < world && slot == 0) {
      HOLDFAST_LOG_WARN(
          "runtime: verify_backups differs between members ({} of {} check "
          "on arrival); all of them check on arrival",
          arrival, world);
    }
    in.replicas = options_.replicas;
    in.tp = options_.tp_size;
    in.pp = options_.pp_size;
    shards::Placement pl = shards::Place(in);
    HOLDFAST_RETURN_IF_ERROR(ConnectLinks(*store, *listener, bulk_key, gen,
                                          slot, pl.buddies, cancelled));
    {
      // The backup thread reads them between rounds.
      absl::MutexLock lock(&bk_mu_);
      buddies_ = std::move(pl.buddies);
      buddies_generation_ = gen;
      verify_on_arrival_ = arrival > 0;
    }
    if (slot == 0 && !pl.warnings.empty()) {
      HOLDFAST_LOG_WARN(
          "runtime: placement of generation {}: {} of {} piece copies could "
          "not be placed as wanted, e.g. {} (label each machine with "
          "HOLDFAST_HOST, and racks with HOLDFAST_TOPOLOGY_BLOCK)",
          gen, pl.warnings.size(),
          world * std::min(options_.replicas, world - 1), pl.warnings[0]);
    }
    return absl::OkStatus();
  }

  // Opens this member's backup links of generation `gen`: to each of its
  // buddies (at the address each published under `key`) and from each
  // owner it is a buddy of.
  absl::Status ConnectLinks(Store& store, const bulk::Listener& listener,
                            const std::string& key, int64_t gen, int slot,
                            const std::vector<std::vector<int>>& buddies,
                            const bulk::Cancelled& cancelled) {
    auto links = std::make_shared<bulk::Links>(
        gen, slot, XXH3_64bits(options_.token.data(), options_.token.size()),
        options_.comm.timeout);
    {
      absl::MutexLock lock(&mu_);
      if (view_.generation > gen) {
        return absl::AbortedError("a newer generation opened");
      }
      links_ = links;  // AbortComm() reaches it from here on
    }
    const absl::Time deadline = absl::Now() + kSideConnectTimeout;
    for (int b : buddies[static_cast<size_t>(slot)]) {
      HOLDFAST_ASSIGN_OR_RETURN(
          std::string address,
          store.Get(absl::StrCat(key, b), deadline - absl::Now()));
      HOLDFAST_RETURN_IF_ERROR(links->ConnectTo(b, address, deadline));
    }
    std::vector<int> owners;
    for (size_t o = 0; o < buddies.size(); ++o) {
      const std::vector<int>& bs = buddies[o];
      if (std::find(bs.begin(), bs.end(), slot) != bs.end()) {
        owners.push_back(static_cast<int>(o));
      }
    }
    return links->AcceptFrom(listener, owners, deadline, cancelled);
  }

  // A side communicator failed while the training one did not: the group
  // is broken all the same (backups can no longer commit), so it is
  // rebuilt unless something else already explains it.
  void SideFailed(const absl::Status& why, int64_t gen) {
    // At the end of the run peers leave as they finish: no failure.
    if (bk_stop_ || finishing_ || !CommHealthy()) return;
    if (AwaitGeneration(gen, absl::Now() + options_.report_grace)) return;
    if (bk_stop_ || finishing_ || !CommHealthy()) return;
    HOLDFAST_LOG_WARN(
        "runtime: the side communicator of generation {} "
        "failed: {}",
        gen, std::string(why.message()));
    ReportBroken(absl::StrCat("side communicator: ", why.message()), -1, gen);
  }

  // Sets v[0..n) to its element-wise maximum over the members of `c` (the
  // side communicator; a small all-reduce is one exchange in the Gloo
  // backend).
  static absl::Status AgreeMax(Communicator* c, int64_t* v, size_t n,
                               const OpOptions& options) {
    return c->AllReduce(v, n, DataType::kInt64, ReduceOp::kMax, options)
        ->Wait();
  }

  // Runs `jobs` at once, a thread each (the calling thread takes the
  // last); the first error in their order. If a thread cannot start (a
  // pids limit), `end_started` is given the reason (it must end the jobs
  // that did start: they may wait for a peer's part of the round), and the
  // result is ResourceExhausted.
  static absl::Status RunJobs(
      const std::vector<std::function<absl::Status()>>& jobs,
      const std::function<void(absl::string_view)>& end_started) {
    if (jobs.empty()) return absl::OkStatus();
    std::vector<absl::Status> out(jobs.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i + 1 < jobs.size(); ++i) {
      absl::StatusOr<std::thread> t = StartThread(
          "a thread for the backup round", [&, i] { out[i] = jobs[i](); });
      if (!t.ok()) {
        end_started(t.status().message());
        for (std::thread& started : threads) started.join();
        return t.status();
      }
      threads.push_back(std::move(*t));
    }
    out.back() = jobs.back()();
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : out) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Calls `fn(i)` for every i < count, on up to `most` threads (no more
  // than the machine's cores; the calling thread is one of them), each
  // taking the next i as it finishes one. Where a thread cannot start (a
  // pids limit), the others do its part.
  static void ForEachOnThreads(size_t count, size_t most,
                               const std::function<void(size_t)>& fn) {
    std::atomic<size_t> next{0};
    auto worker = [&] {
      for (size_t i; (i = next.fetch_add(1)) < count;) fn(i);
    };
    const size_t n = std::min<size_t>(
        {count, most, std::max(1u, std::thread::hardware_concurrency())});
    std::vector<std::thread> threads;
    for (size_t t = 1; t < n; ++t) {
      absl::StatusOr<std::thread> started = StartThread("a worker", worker);
      if (!started.ok()) break;  // the others do its part
      threads.push_back(std::move(*started));
    }
    worker();
    for (std::thread& t : threads) t.join();
  }

  // When a backup round's milestones came, for BackupStats.
  struct RoundClock {
    absl::Time acked = absl::InfinitePast();  // this member acked the step
    absl::Time seen = absl::InfinitePast();   // it first saw the commit (the
                                              // verdict and the work after
                                              // the commit come after it)
    absl::Duration gated;  // waiting for the fence of a piece copied during
                           // a step
  };

  // Backs up one snapshot: every slot agrees on the step, sends its piece
  // to its buddies and receives the pieces it is a buddy for, checks them,
  // and acks the step if its own part succeeded (the controller commits a
  // step every slot acked); with checks on arrival, or when any slot's
  // piece was copied during a step, the slots then share their verdicts, so
  // none waits for a commit that a damaged or unfenced copy elsewhere
  // stopped. True once it commits, with `*clock` filled in. When the slots
  // offered different steps nothing moves, and `*again` says this slot's
  // step was the newest: its piece is kept, to be offered again (the
  // others drop theirs and offer the snapshot of that step next). An
  // error is a failure of the side communicator.
  absl::StatusOr<bool> BackupRound(Piece* own, Communicator* c,
                                   bulk::Links* links, RoundClock* clock,
                                   bool* again) {
    const int64_t s = own->step;
    const int64_t gen = own->layout_generation;
    const int world = own->world;
    const int me = own->slot;
    std::vector<std::vector<int>> buddies;
    bool verify;  // on arrival (else a restore checks the copies)
    {
      absl::MutexLock lock(&bk_mu_);
      if (buddies_generation_ != gen) {
        return absl::AbortedError("the placement is of another generation");
      }
      buddies = buddies_;
      verify = verify_on_arrival_;
    }
    // Until it is acked (and may commit), a piece whose round failed is
    // dropped: no step can commit without it.
    bool may_commit = false;
    absl::Cleanup drop_unless_may_commit = [&] {
      if (!may_commit && !*again) Drop(own);
    };
    OpOptions agree;
    agree.timeout = kAgreeTimeout;
    // Each slot's step, and whether its piece is copied during a step
    // (then it acks only if the trainer fenced the copy, so every slot
    // needs the verdicts below even without checks on arrival): the
    // maximum of {step, -step, deferred} over the slots gives the newest
    // and the oldest step offered and whether any piece was deferred.
    int64_t agreed[3] = {s, -s, own->deferred ? 1 : 0};
    SetIdleRound(true);
    absl::Status st = AgreeMax(c, agreed, 3, agree);
    SetIdleRound(false);
    if (!st.ok()) return st;
    const bool verdicts = verify || agreed[2] != 0;
    const int64_t newest = agreed[0];
    const int64_t oldest = -agreed[1];
    if (newest != oldest) {
      // Some slot snapshotted another step (its previous backup was still
      // running when one of them was offered): nobody backs this round
      // up. The slots that offered the newest step offer it again and the
      // others drop theirs, so the next round pairs the same step. (Were
      // every piece dropped, a slot that always reaches its snapshot after
      // the others end the round would offer the step before theirs in
      // every round from then on.)
      *again = newest == s;
      HOLDFAST_LOG_DEBUG(
          "runtime: slot {} offered step {} to a backup round where the "
          "slots offered steps {} to {}: nothing is backed up; {}",
          me, s, oldest, newest,
          *again ? "step offered again" : "piece dropped");
      return false;
    }
    // The bytes go first, on the backup links, a thread per link (this one
    // takes the last). The owner hashes each chunk of its piece just
    // before writing it (a deferred piece was hashed as it was copied) and
    // sends the checksum right after them, on the same thread; each
    // receiver hashes the chunks as they land and, on its thread, reads
    // the checksum and compares (with verify_backups "arrival"; else a
    // restore does). So a link's check does not wait for the others'
    // bytes.
    struct Incoming {
      std::unique_ptr<Piece> piece;
      shards::CopyHasher hasher;
      bool damaged = false;  // arrived with another checksum than sent
    };
    std::vector<std::unique_ptr<Incoming>> got;
    std::vector<int> own_buddies;
    const absl::Time transfer_start = absl::Now();
    int64_t moved = 0;
    for (int o = 0; o < world; ++o) {
      for (int b : buddies[static_cast<size_t>(o)]) {
        const size_t size = state_.PieceSize(world, o);
        if (size == 0) continue;
        if (me == o) {
          own_buddies.push_back(b);
        } else if (me == b) {
          auto in = std::make_unique<Incoming>();
          in->piece = NewPiece(s, gen, world, o, 0);
          got.push_back(std::move(in));
        } else {
          continue;
        }
        moved += static_cast<int64_t>(size);
      }
    }
    shards::CopyHasher own_hasher;
    const bool hash_own = !own->deferred && !own_buddies.empty();
    std::vector<std::function<absl::Status()>> jobs;
    // The first link hashes the piece; the others wait for its digest.
    absl::Notification digested;
    bool digest_ok = false;  // written before `digested` is notified
    for (size_t i = 0; i < own_buddies.size(); ++i) {
      jobs.push_back([&, i]() -> absl::Status {
        if (i == 0 && hash_own) {
          absl::Cleanup notify = [&digested] { digested.Notify(); };
          HOLDFAST_RETURN_IF_ERROR(links->SendPiece(
              own_buddies[i], s, own->bytes.get(), own->size, &own_hasher));
          own->checksum = own_hasher.Digest();
          digest_ok = true;
        } else {
          HOLDFAST_RETURN_IF_ERROR(links->SendPiece(
              own_buddies[i], s, own->bytes.get(), own->size, nullptr));
          if (hash_own) {
            digested.WaitForNotification();
            if (!digest_ok) {
              return absl::AbortedError(absl::StrCat(
                  "the checksum of slot ", me, "'s piece of step ", s,
                  " was not computed: its first backup link failed"));
            }
          }
        }
        return links->SendChecksum(own_buddies[i], own->checksum);
      });
    }
    // An injected `corrupt-backup` damages the copy from the lowest owner
    // (decided here: the receiving threads race).
    const Incoming* damaged =
        !got.empty() && fault::Injector::Global().AtShard(
                            fault::Kind::kCorruptBackup, me, s)
            ? got.front().get()
            : nullptr;
    for (auto& in : got) {
      jobs.push_back([&, p = in.get()]() -> absl::Status {
        Piece& piece = *p->piece;
        HOLDFAST_RETURN_IF_ERROR(links->RecvPiece(
            piece.slot, s, piece.bytes.get(), piece.size,
            [&](size_t off, size_t n) {
              if (off == 0 && p == damaged) {
                piece.bytes[0] ^= 0x5a;
                HOLDFAST_LOG_WARN(
                    "runtime: corrupted slot {}'s backup of slot {}'s piece "
                    "of step {} on arrival (injected)",
                    me, piece.slot, s);
              }
              if (verify) p->hasher.Update(piece.bytes.get() + off, n);
            }));
        absl::StatusOr<uint64_t> sent = links->RecvChecksum(piece.slot);
        if (!sent.ok()) return sent.status();
        piece.checksum = *sent;
        p->damaged = verify && p->hasher.Digest() != *sent;
        return absl::OkStatus();
      });
    }
    st = RunJobs(jobs, [links](absl::string_view why) { links->Abort(why); });
    if (!own->deferred && !hash_own) {
      own->checksum = shards::Checksum(own->bytes.get(), own->size);
    }
    int64_t good = 1;
    for (auto& in : got) {
      if (!st.ok() || !in->damaged) continue;
      HOLDFAST_LOG_ERROR(
          "runtime: the backup of slot {}'s piece of step {} arrived "
          "corrupt; the step is not committed",
          in->piece->slot, s);
      good = 0;
    }
    const int64_t transfer_us =
        absl::ToInt64Microseconds(absl::Now() - transfer_start);
    if (!st.ok()) return st;
    // A deferred piece is acked only if the trainer fenced its copy.
    if (good == 1 && own->deferred) {
      const absl::Time gate_start = absl::Now();
      if (!AwaitValidated(own, gen)) good = 0;
      clock->gated = absl::Now() - gate_start;
    }
    if (good == 1) {
      // This slot holds its piece and good copies of its owners' pieces:
      // it acks now, and the verdict below travels while the ack does.
      // The copies are kept first: once every slot acked, the step can
      // commit even if this round fails from here on.
      {
        absl::MutexLock lock(&bk_mu_);
        for (auto& in : got) pieces_.push_back(std::move(in->piece));
      }
      may_commit = true;
      clock->acked = absl::Now();
      member_->SendCheckpointAck(s, gen);
      SetIdleRound(true);
    }
    if (verdicts) {
      // A slot that found a damaged copy (or whose deferred copy was not
      // fenced) did not ack, so the step never commits: everyone learns
      // it here and drops the step, instead of waiting for that commit.
      // Unchecked copies of pieces copied between the steps have no
      // verdict to share. A slot that acked first waits (bounded) for the
      // commit, which then comes before this exchange rather than during
      // it: the exchange's wake-ups no longer compete with the commit's on
      // a busy host (see kVerdictAfter).
      if (good == 1 && AwaitRoundEnd(s, gen, absl::Now() + kVerdictAfter) &&
          committed_step() >= s) {
        clock->seen = absl::Now();
      }
      int64_t bad = good == 1 ? 0 : 1;  // on any slot: the step is dropped
      st = AgreeMax(c, &bad, 1, agree);
      if (!st.ok()) return st;
      if (bad != 0) {
        // The copies of this round, if kept (the cleanup drops own).
        may_commit = false;
        Evict([s, gen, own](const Piece& p) {
          return p.step == s && p.layout_generation == gen && &p != own;
        });
        return false;
      }
    } else if (good == 0) {
      return false;
    }
    {
      absl::MutexLock lock(&bk_mu_);
      backup_bytes_ += moved;
      transfer_us_ += transfer_us;
    }
    // bk_stop_ is set under bk_mu_, which does not wake a wait on mu_:
    // the wait looks again every 100 ms.
    while (!AwaitRoundEnd(s, gen, absl::Now() + absl::Milliseconds(100))) {
    }
    if (committed_step() < s) return false;
    if (clock->seen == absl::InfinitePast()) clock->seen = absl::Now();
    // Older steps are superseded everywhere.
    Evict([s](const Piece& p) { return p.step < s; });
    if (own->size > 0 &&
        fault::Injector::Global().AtShard(fault::Kind::kCorruptShard, me, s)) {
      own->bytes[own->size / 2] ^= 0x5a;
      HOLDFAST_LOG_WARN(
          "runtime: corrupted slot {}'s own copy of its piece "
          "of step {} (injected)",
          me, s);
    }
    // The first committed step of every window of checkpoint_every steps
    // (the multiple itself unless its snapshot was skipped).
    if (!options_.checkpoint_dir.empty() &&
        s / options_.checkpoint_every >
            last_disk_step_ / options_.checkpoint_every) {
      WriteToDisk(*own);
      last_disk_step_ = s;
    }
    return true;
  }

  void SetIdleRound(bool on) {
    absl::MutexLock lock(&bk_mu_);
    idle_round_ = on;
  }

  // Waits until step `s` of generation `gen` is committed, or cannot be
  // (a newer generation, this member fenced, the job ended, the backup
  // thread stopping), or until `deadline`; whether either came first.
  bool AwaitRoundEnd(int64_t s, int64_t gen, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return committed_ >= s || !GoesOnLocked(gen) || bk_stop_;
    };
    return mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  }

  // Waits at the gate of a deferred round for BeginStateUpdate() (or the
  // loop's end-of-step check); true if the copy was validated.
  bool AwaitValidated(Piece* own, int64_t gen) {
    for (;;) {
      {
        absl::MutexLock lock(&bk_mu_);
        gate_ = own;
        auto decided = [own, this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(bk_mu_) {
          return own->validated || own->invalid || bk_stop_;
        };
        if (bk_mu_.AwaitWithTimeout(absl::Condition(&decided),
                                    absl::Milliseconds(100))) {
          return own->validated && !own->invalid;
        }
      }
      absl::MutexLock lock(&mu_);
      if (!GoesOnLocked(gen)) return false;
    }
  }

  void WriteToDisk(const Piece& own) {
    shards::PieceHeader h;
    h.step = own.step;
    h.layout_generation = own.layout_generation;
    h.world = own.world;
    h.slot = own.slot;
    h.layout_hash = state_.LayoutHash();
    h.bytes = own.size;
    h.checksum = own.checksum;
    absl::Status s =
        shards::WritePiece(options_.checkpoint_dir, h, own.bytes.get());
    if (!s.ok()) {
      HOLDFAST_LOG_ERROR("runtime: disk tier: {}", std::string(s.message()));
      return;
    }
    {
      absl::MutexLock lock(&bk_mu_);
      ++disk_writes_;
    }
    // Keep the newest three step directories (one may be incomplete).
    if (own.slot == 0) shards::Prune(options_.checkpoint_dir, 3);
  }

  // Waits (bounded) until no snapshot is waiting for the backup thread and
  // no round is under way; whether that is so.
  bool AwaitBackupIdle(absl::Time deadline) {
    absl::MutexLock lock(&bk_mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(bk_mu_) {
      return pending_ == nullptr && !busy_;
    };
    return bk_mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  }

  // At the end of Run: waits (bounded) until the last step is committed.
  // A slot whose last round found the others at another step (it had
  // skipped one) snapshots the last step again, so every slot ends in the
  // same committed round and nobody leaves a peer waiting in one.
  void FinishBackups(int64_t last, absl::Time deadline) {
    while (absl::Now() < deadline && committed_step() < last &&
           Terminal().ok() && !GenerationMoved()) {
      const bool idle = AwaitBackupIdle(
          std::min(deadline, absl::Now() + absl::Milliseconds(50)));
      if (committed_step() >= last) return;
      if (idle && !Snapshot(last).ok()) return;
    }
  }

  void PublishRecovery(const RecoveryRecord& r) {
    // Every member that recovered offers its record; the first one kept
    // (they differ by a few milliseconds) speaks for the generation.
    nlohmann::json j = ToJson(r);
    (void)store_->CompareAndSet(keys::Recovery(r.generation), "", true,
                                j.dump());
  }

  void PublishFinalState(int slot) {
    nlohmann::json j = {
        {"replicated", absl::StrFormat("%016x", state_.LiveHash())},
        {"sharded", absl::StrFormat("%016x", state_.ShardedHash())}};
    (void)store_->Set(keys::FinalState(slot), j.dump());
  }

  void PublishFinal(const RunResult& r) {
    nlohmann::json j;
    j["final_step"] = r.final_step;
    j["world_size"] = r.world_size;
    j["generation"] = r.generation;
    j["productive_ms"] = r.productive_ms;
    j["wall_ms"] = r.wall_ms;
    j["snapshots"] = r.snapshots;
    j["snapshots_skipped"] = r.snapshots_skipped;
    j["backups"] = r.backups;
    j["backup_bytes"] = r.backup_bytes;
    j["backup_ms"] = r.backup_ms;
    j["disk_writes"] = r.disk_writes;
    if (ledger_[0] > 0) {
      j["first_step_done_unix_ms"] = ledger_[0] + ledger_[2] / 1000;
    }
    (void)store_->Set(keys::kFinal, j.dump());
  }

  RuntimeOptions options_;
  std::shared_ptr<control::ControllerStore> store_;
  std::unique_ptr<control::MemberClient> member_;

  mutable absl::Mutex mu_;
  View view_ ABSL_GUARDED_BY(mu_);
  int64_t committed_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Status fenced_ ABSL_GUARDED_BY(mu_);
  std::optional<JobEnd> job_end_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Communicator> comm_ ABSL_GUARDED_BY(mu_);
  int64_t comm_generation_ ABSL_GUARDED_BY(mu_) = -1;
  std::shared_ptr<Communicator> side_ ABSL_GUARDED_BY(mu_);
  // The backup links of the side communicator's generation (bulk.h).
  std::shared_ptr<bulk::Links> links_ ABSL_GUARDED_BY(mu_);
  int64_t side_generation_ ABSL_GUARDED_BY(mu_) = -1;

  // Aborts ordered by the controller (QueueAbort).
  absl::Mutex abort_mu_;
  std::deque<std::pair<int64_t, std::string>> aborts_
      ABSL_GUARDED_BY(abort_mu_);
  bool abort_stop_ ABSL_GUARDED_BY(abort_mu_) = false;
  std::thread aborter_;

  // The training thread's own.
  checkpoint::StateRegistry state_;
  int64_t ledger_[kLedger] = {0, 0, 0};
  bool started_ = false;
  bool finished_ = false;
  bool left_ = false;
  int recoveries_ = 0;
  int restores_ = 0;  // Restore calls, for the restore=N fault point
  int64_t high_step_ = 0;
  // The completed step the live registered state is at, or -1 when that is
  // not known (a step failed after its fence, a restore was cut short, a
  // standby that never trained).
  int64_t live_step_ = -1;
  // Whether a completed step called BeginStateUpdate(): then a step that
  // fails before it did has not written registered state.
  bool fences_ = false;
  int64_t lost_steps_ = 0;
  // HOLDFAST_SAME_HOST_RESTORE; and the word a peer on this host reads to
  // find out whether it may read this process's memory (see Restore).
  bool same_host_restore_ = true;
  const uint64_t probe_word_ = ProbeWord();
  int64_t snapshots_ = 0;
  int64_t snapshots_skipped_ = 0;
  int64_t snapshots_unfenced_ = 0;  // copied during a step: no fence
  std::optional<RecoveryRecord> pending_record_;
  std::vector<RecoveryRecord> recovery_records_;

  // Pieces and the backup thread. A piece's bytes are touched without the
  // lock by one thread at a time: the training thread while it creates it
  // (before listing it) and during Restore (the backup thread is idle), the
  // backup thread during a round (the training thread only lists and
  // skips).
  mutable absl::Mutex bk_mu_;
  std::vector<std::unique_ptr<Piece>> pieces_ ABSL_GUARDED_BY(bk_mu_);
  std::multimap<size_t, std::unique_ptr<uint8_t[]>> pool_
      ABSL_GUARDED_BY(bk_mu_);
  Piece* pending_ ABSL_GUARDED_BY(bk_mu_) = nullptr;
  // The deferred snapshot awaiting BeginStateUpdate(), and the one whose
  // round waits at its gate for it (see Piece::deferred).
  Piece* deferred_ ABSL_GUARDED_BY(bk_mu_) = nullptr;
  Piece* gate_ ABSL_GUARDED_BY(bk_mu_) = nullptr;
  // BeginStateUpdate() was called (in the step under way).
  bool fence_seen_ ABSL_GUARDED_BY(bk_mu_) = false;
  // ReportEarlyWrite() in this step: what was written before the fence.
  std::optional<std::string> early_write_ ABSL_GUARDED_BY(bk_mu_);
  // Snapshots copied during the next step, and fenced.
  int64_t snapshots_overlapped_ ABSL_GUARDED_BY(bk_mu_) = 0;
  bool busy_ ABSL_GUARDED_BY(bk_mu_) = false;
  // The round under way moves no bytes now: it waits in its agreement
  // (for the slots still to snapshot), or it acked and waits for the
  // commit (or the verdict). A snapshot may wait behind it (TakeSnapshot).
  bool idle_round_ ABSL_GUARDED_BY(bk_mu_) = false;
  // The step of the round under way (while busy_).
  int64_t round_step_ ABSL_GUARDED_BY(bk_mu_) = -1;
  bool bk_wake_ ABSL_GUARDED_BY(bk_mu_) = false;
  int64_t backups_ ABSL_GUARDED_BY(bk_mu_) = 0;
  int64_t backup_bytes_ ABSL_GUARDED_BY(bk_mu_) = 0;
  int64_t backup_us_ ABSL_GUARDED_BY(bk_mu_) = 0;
  int64_t gate_us_ ABSL_GUARDED_BY(bk_mu_) = 0;
  int64_t commit_wait_us_ ABSL_GUARDED_BY(bk_mu_) = 0;
  absl::Time last_acked_ ABSL_GUARDED_BY(bk_mu_) = absl::InfinitePast();
  int64_t transfer_us_ ABSL_GUARDED_BY(bk_mu_) = 0;
  int64_t disk_writes_ ABSL_GUARDED_BY(bk_mu_) = 0;
  std::atomic<bool> bk_stop_{false};
  std::atomic<bool> finishing_{false};
  std::vector<std::vector<int>> buddies_ ABSL_GUARDED_BY(bk_mu_);
  int64_t buddies_generation_ ABSL_GUARDED_BY(bk_mu_) = -1;
  // Agreed in BuildSide: buddies check copies on arrival.
  bool verify_on_arrival_ ABSL_GUARDED_BY(bk_mu_) = true;
  std::atomic<int64_t> last_disk_step_{0};
  std::thread backup_thread_;
};

}  // namespace

bool IsRecoverable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kAborted;
}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(
    RuntimeOptions options) {
  HOLDFAST_RETURN_IF_ERROR(config::Validate());
  config::ApplyMutexMode();
  if (options.controller.empty()) {
    options.controller = config::StringParam("HOLDFAST_CONTROLLER");
  }
  if (options.controller.empty()) {
    return absl::InvalidArgumentError(
        "Runtime: no controller address: set HOLDFAST_CONTROLLER=host:port "
        "(holdfast-run sets it) or RuntimeOptions::controller");
  }
  if (options.token.empty()) {
    HOLDFAST_ASSIGN_OR_RETURN(options.token,
                              control::LoadToken(options.token_file));
  }
  if (options.host.empty()) options.host = config::StringParam("HOLDFAST_HOST");
  if (options.topology_block.empty()) {
    options.topology_block = config::StringParam("HOLDFAST_TOPOLOGY_BLOCK");
  }
  if (absl::Status linked = backend::CheckLinked(options.comm.backend);
      !linked.ok()) {
    return absl::Status(
        linked.code(),
        absl::StrCat("Runtime: ", linked.message(), " (HOLDFAST_BACKEND)"));
  }
  if (options.join_timeout <= absl::ZeroDuration() ||
      options.report_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "Runtime: join_timeout must be > 0 and report_grace >= 0");
  }
  auto rt = std::make_unique<RuntimeImpl>(std::move(options));
  try {
    HOLDFAST_RETURN_IF_ERROR(rt->Init());
  } catch (const std::system_error& e) {
    // A thread that cannot start (a pids limit); `rt`'s destructor joins
    // the ones that did.
    return absl::ResourceExhaustedError(
        absl::StrCat("Runtime::Create: cannot start a thread: ", e.what()));
  }
  return std::unique_ptr<Runtime>(std::move(rt));
}

}  // namespace holdfast
