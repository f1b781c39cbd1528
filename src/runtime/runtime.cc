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
#include "src/checkpoint/backup.h"
#include "src/checkpoint/bulk.h"
#include "src/checkpoint/peer_memory.h"
#include "src/checkpoint/restore.h"
#include "src/checkpoint/shards.h"
#include "src/checkpoint/snapshots.h"
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

// A random word that is never 0.
uint64_t ProbeWord() {
  std::random_device rd;
  return (uint64_t{rd()} << 32 | rd()) | uint64_t{1} << 63;
}

constexpr absl::Duration kSideConnectTimeout = absl::Seconds(15);
using SnapshotCopy = RunOptions::SnapshotCopy;

using checkpoint::Piece;
using checkpoint::RoundClock;
using checkpoint::StateBuffer;

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
      snapshots_.EndGeneration(INT64_MAX);
      AbortComm(INT64_MAX, absl::StrCat("fenced: ", s.message()));
    };
    cb.on_job_end = [this](const JobEnd& e) {
      {
        absl::MutexLock lock(&mu_);
        job_end_ = e;
      }
      snapshots_.EndGeneration(INT64_MAX);
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
    backup_hooks_ = NewBackupHooks();
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

  BackupStats backup_stats() const override { return snapshots_.stats(); }

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
    const bool busy = snapshots_.Stop();
    {
      // The waits on mu_ that end when the pipeline stops (AwaitRoundEnd,
      // Abandoned) look again when mu_ is released.
      absl::MutexLock lock(&mu_);
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
  void BeginStateUpdate() override { snapshots_.BeginStateUpdate(); }

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
    if (snapshots_.Busy(committed)) {
      // The previous snapshot is still being backed up: skip this one
      // rather than stall training.
      ++snapshots_skipped_;
      return false;
    }
    ++snapshots_taken_;
    snapshots_.Queue(
        snapshots_.NewPiece(step, comm_gen, v.world, v.slot, /*checksum=*/0),
        defer);
    return true;
  }

  void ReportEarlyWrite(absl::string_view what) override {
    snapshots_.ReportEarlyWrite(what);
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
          rec.lost_steps = progress_.lost_steps;
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
    HOLDFAST_RETURN_IF_ERROR(
        state_.AddReplicated("holdfast/ledger", progress_.ledger,
                             sizeof(progress_.ledger), /*ledger=*/true));
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
      if (progress_.high_step > stuck_at) {
        stuck_at = progress_.high_step;
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
          snapshots_.TakeFenceSeen();
          s = step_fn(ctx);
          std::string early;  // what the step wrote before its fence
          fenced = snapshots_.TakeFenceSeen(&early);
          if (snapshots_.DropUnfenced() && s.ok()) {
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
          if (fenced || !fences_) progress_.live_step = -1;
          HOLDFAST_RETURN_IF_ERROR(recover(s));
          continue;
        }
        fences_ = fences_ || fenced;
        progress_.live_step = step;
        const absl::Time t1 = absl::Now();
        if (pending_record_.has_value()) {
          // The first training step after the recovery is done (its
          // snapshot is the loop's usual per-step work).
          pending_record_->first_step_ms = absl::ToUnixMillis(t1);
        }
        if (step == 1) {
          progress_.ledger[0] = absl::ToUnixMillis(t0);
          progress_.ledger[2] = absl::ToInt64Microseconds(t1 - t0);
        }
        progress_.ledger[1] += absl::ToInt64Microseconds(t1 - t0);
        progress_.high_step = std::max(progress_.high_step, step);
        if (step % options.snapshot_every == 0 || step == options.steps) {
          member_->SetPhase(control::PHASE_CHECKPOINTING, 0);
          if (step == options.steps) {
            // Every slot snapshots the last step, waiting for its previous
            // backup if need be, so the last round is the same everywhere
            // and commits: nobody leaves while a peer waits for it in one.
            snapshots_.AwaitIdle(absl::Now() + options_.commit_wait);
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
    result.snapshots = snapshots_taken_;
    result.snapshots_skipped = snapshots_skipped_;
    result.snapshots_unfenced = snapshots_unfenced_;
    result.productive_ms = progress_.ledger[1] / 1000;
    result.wall_ms = options.steps > 0 && progress_.ledger[0] > 0
                         ? NowMs() - progress_.ledger[0]
                         : 0;
    const BackupStats b = snapshots_.stats();
    result.snapshots_overlapped = snapshots_.overlapped();
    result.backups = b.rounds;
    result.backup_bytes = b.bytes;
    result.backup_ms = b.round_us / 1000;
    result.disk_writes = b.disk_writes;
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
    snapshots_.EndGeneration(u.generation());
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
    if (snapshots_.stopping()) {
      return std::string("the runtime is shutting down");
    }
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
      HOLDFAST_ASSIGN_OR_RETURN(Communicator * host, HostComm());
      HOLDFAST_ASSIGN_OR_RETURN(
          const std::optional<checkpoint::Restored> d,
          NewRestore(host, v).FromDisk(/*required=*/false));
      if (d.has_value()) {
        NoteRestored(*d, nullptr);
        at = d->step;
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
      HOLDFAST_RETURN_IF_ERROR(
          checkpoint::CheckReplicatedEqual(host, v.world, v.slot, state_));
    }
    progress_.high_step = std::max(progress_.high_step, at);
    progress_.live_step = at;
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

  // A restore on `comm` (host buffers) of this generation's view `v`.
  checkpoint::Restore NewRestore(Communicator* comm, const View& v) {
    checkpoint::RestoreOptions o;
    o.replicas = options_.replicas;
    o.checkpoint_dir = options_.checkpoint_dir;
    o.read_in_place = same_host_restore_;
    o.probe_word = &probe_word_;
    checkpoint::RestoreHooks hooks;
    const int slot = v.slot;
    const int restores = restores_;
    hooks.before_transfers = [slot, restores] {
      fault::Injector::Global().AtRestore(slot, restores);
    };
    hooks.damage_first_taken = [slot](int64_t step) {
      return fault::Injector::Global().AtShard(fault::Kind::kCorruptRestore,
                                               slot, step);
    };
    return checkpoint::Restore(comm, v.world, v.slot, &state_, &snapshots_,
                               &progress_, std::move(o), std::move(hooks));
  }

  // Rolls every member back to the newest committed step
  // (checkpoint::Restore::FromMemory). `rec` (optional) gets what was
  // received.
  absl::StatusOr<int64_t> Restore(RecoveryRecord* rec) {
    HOLDFAST_ASSIGN_OR_RETURN(Communicator * comm, HostComm());
    const View v = CurrentView();
    snapshots_.Quiesce();
    ++restores_;
    HOLDFAST_ASSIGN_OR_RETURN(const checkpoint::Restored r,
                              NewRestore(comm, v).FromMemory(committed_step()));
    NoteRestored(r, rec);
    return r.step;
  }

  void NoteRestored(const checkpoint::Restored& r, RecoveryRecord* rec) {
    if (r.from_disk) last_disk_step_ = r.step;
    if (rec == nullptr) return;
    rec->bytes_received = r.bytes_received;
    rec->bytes_read_in_place = r.bytes_read_in_place;
    rec->received_state = r.received_state;
    rec->from_disk = r.from_disk;
  }

  // ---- Backups (the background thread) ------------------------------------

  void BackupLoop() {
    for (;;) {
      const std::optional<int64_t> gen = snapshots_.AwaitQueued();
      if (!gen.has_value()) return;
      absl::StatusOr<SideChannel> side = Side(*gen);
      const checkpoint::Snapshots::Taken taken =
          snapshots_.TakeQueued(*gen, side.ok());
      if (snapshots_.stopping()) return;
      if (!taken.found) continue;  // a restore dropped it
      if (!side.ok()) {            // the piece was dropped
        SideFailed(side.status(), *gen);
        continue;
      }
      Piece* own = taken.piece;
      // (A piece offered again was copied in its first round.)
      if (own->deferred && !own->copied) snapshots_.CopyIn(own);
      checkpoint::RoundResult round;
      round.clock.start = absl::Now();  // the round proper, after any copy
      absl::StatusOr<bool> committed =
          checkpoint::BackupRound(own, side->comm.get(), side->links.get(),
                                  &snapshots_, state_, backup_hooks_, &round);
      snapshots_.EndRound(own, committed.ok() && *committed, round.clock,
                          round.moved, round.transfer_us, round.again);
      if (!committed.ok()) SideFailed(committed.status(), *gen);
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
    // The backup thread reads it between rounds.
    snapshots_.SetPlacement({gen, std::move(pl.buddies), arrival > 0});
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
    if (snapshots_.stopping() || finishing_ || !CommHealthy()) return;
    if (AwaitGeneration(gen, absl::Now() + options_.report_grace)) return;
    if (snapshots_.stopping() || finishing_ || !CommHealthy()) return;
    HOLDFAST_LOG_WARN(
        "runtime: the side communicator of generation {} "
        "failed: {}",
        gen, std::string(why.message()));
    ReportBroken(absl::StrCat("side communicator: ", why.message()), -1, gen);
  }

  // The hooks of this member's backup rounds (on the backup thread).
  checkpoint::BackupHooks NewBackupHooks() {
    checkpoint::BackupHooks h;
    h.ack = [this](int64_t step, int64_t gen) {
      member_->SendCheckpointAck(step, gen);
    };
    h.await_decided = [this](int64_t step, int64_t gen, absl::Time deadline) {
      return AwaitRoundEnd(step, gen, deadline);
    };
    h.committed = [this] { return committed_step(); };
    h.damage_arrival = [this](int64_t step) {
      return fault::Injector::Global().AtShard(fault::Kind::kCorruptBackup,
                                               slot(), step);
    };
    h.after_commit = [this](Piece* own) { AfterCommit(own); };
    return h;
  }

  // This member's piece of a step that committed: a test's damage to it,
  // and the disk tier, which takes the first committed step of every
  // window of checkpoint_every steps (the multiple itself unless its
  // snapshot was skipped).
  void AfterCommit(Piece* own) {
    const int64_t s = own->step;
    if (own->size > 0 && fault::Injector::Global().AtShard(
                             fault::Kind::kCorruptShard, own->slot, s)) {
      own->bytes[own->size / 2] ^= 0x5a;
      HOLDFAST_LOG_WARN(
          "runtime: corrupted slot {}'s own copy of its piece of step {} "
          "(injected)",
          own->slot, s);
    }
    if (!options_.checkpoint_dir.empty() &&
        s / options_.checkpoint_every >
            last_disk_step_ / options_.checkpoint_every) {
      WriteToDisk(*own);
      last_disk_step_ = s;
    }
  }

  // Waits until step `s` of generation `gen` is committed, or cannot be
  // (a newer generation, this member fenced, the job ended, the backup
  // thread stopping), or until `deadline`; whether either came first.
  bool AwaitRoundEnd(int64_t s, int64_t gen, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return committed_ >= s || !GoesOnLocked(gen) || snapshots_.stopping();
    };
    return mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
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
    snapshots_.NoteDiskWrite();
    // Keep the newest three step directories (one may be incomplete).
    if (own.slot == 0) shards::Prune(options_.checkpoint_dir, 3);
  }

  // At the end of Run: waits (bounded) until the last step is committed.
  // A slot whose last round found the others at another step (it had
  // skipped one) snapshots the last step again, so every slot ends in the
  // same committed round and nobody leaves a peer waiting in one.
  void FinishBackups(int64_t last, absl::Time deadline) {
    while (absl::Now() < deadline && committed_step() < last &&
           Terminal().ok() && !GenerationMoved()) {
      const bool idle = snapshots_.AwaitIdle(
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
    if (progress_.ledger[0] > 0) {
      j["first_step_done_unix_ms"] =
          progress_.ledger[0] + progress_.ledger[2] / 1000;
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
  // What the training thread knows of its progress (the restore sets it);
  // its ledger is registered as state.
  checkpoint::Progress progress_;
  bool started_ = false;
  bool finished_ = false;
  bool left_ = false;
  int recoveries_ = 0;
  int restores_ = 0;  // Restore calls, for the restore=N fault point
  // Whether a completed step called BeginStateUpdate(): then a step that
  // fails before it did has not written registered state.
  bool fences_ = false;
  // HOLDFAST_SAME_HOST_RESTORE; and the word a peer on this host reads to
  // find out whether it may read this process's memory (see Restore).
  bool same_host_restore_ = true;
  const uint64_t probe_word_ = ProbeWord();
  int64_t snapshots_taken_ = 0;
  int64_t snapshots_skipped_ = 0;
  int64_t snapshots_unfenced_ = 0;  // copied during a step: no fence
  std::optional<RecoveryRecord> pending_record_;
  std::vector<RecoveryRecord> recovery_records_;

  // The pieces this member holds and the hand-over of its snapshots to
  // the backup thread.
  checkpoint::Snapshots snapshots_{&state_};
  checkpoint::BackupHooks backup_hooks_;  // set before the backup thread
  std::atomic<bool> finishing_{false};
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
