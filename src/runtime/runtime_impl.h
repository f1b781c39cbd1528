// RuntimeImpl (include/holdfast/runtime.h's Runtime): the step loop and
// recovery, composed of objects that own their state and their locks:
//   GenerationView   (generation_view.h) the generations, the committed
//                    step, the job's state, the communicators, and the
//                    waits on them
//   AbortQueue       (abort_queue.h) the aborts the controller orders, on
//                    the abort thread
//   BackupPipeline   (backup_pipeline.h) the backup thread and the disk tier
//   NumericGuard     (numeric_guard.h) the numeric checks of a step
//   checkpoint::Snapshots, StateRegistry, Restore (src/checkpoint)
// and RuntimeImpl's own files:
//   runtime.cc        the facade: options, registration, snapshots
//   generation.cc     membership events, the abort thread, reports of
//                     failures to the controller, the lease
//   CommSet          (comm_set.h) building a generation's communicators
//   Recovery         (recovery.h) how a member recovers after its
//                    generation failed
//   step_loop.cc      Run: the start, the steps, and when to recover
//   checkpoints.cc    the restore, as this member runs it
//   numerics.cc       anomaly reports and the data position
//   StepReporter     (step_reporter.h) what heartbeats say of each step
//   PauseClock       (pause_clock.h) when the process was not running
//   report.cc         what a member publishes in the controller's store
//
// Threads: the training thread (Run and the API), the backup thread
// (BackupPipeline), the abort thread (AbortQueue), the member client's
// thread (the membership callbacks), and the process' pause clock.
#ifndef HOLDFAST_SRC_RUNTIME_RUNTIME_IMPL_H_
#define HOLDFAST_SRC_RUNTIME_RUNTIME_IMPL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "holdfast/runtime.h"
#include "holdfast/store.h"
#include "src/checkpoint/backup.h"
#include "src/checkpoint/bulk.h"
#include "src/checkpoint/restore.h"
#include "src/checkpoint/snapshots.h"
#include "src/checkpoint/state.h"
#include "src/control/member/client.h"
#include "src/control/member/member.h"
#include "src/fault/fault.h"
#include "src/fault/hooks.h"
#include "src/runtime/abort_queue.h"
#include "src/runtime/backup_pipeline.h"
#include "src/runtime/comm_set.h"
#include "src/runtime/fault_io.h"
#include "src/runtime/generation_view.h"
#include "src/runtime/numeric_guard.h"
#include "src/runtime/recovery.h"
#include "src/runtime/step_reporter.h"

namespace holdfast {

using checkpoint::Piece;
using control::JobEnd;
using control::MembershipUpdate;
using SnapshotCopy = RunOptions::SnapshotCopy;

// A random word that is never 0.
inline uint64_t ProbeWord() {
  std::random_device rd;
  return (uint64_t{rd()} << 32 | rd()) | uint64_t{1} << 63;
}

class RuntimeImpl final : public Runtime,
                          private BackupPipeline::Member,
                          private Recovery::Member {
 public:
  explicit RuntimeImpl(RuntimeOptions o) : options_(std::move(o)) {}
  ~RuntimeImpl() override;

  // ---- runtime.cc: the facade ----------------------------------------------

  // Resolves the options left to the environment, joins the controller
  // and starts the backup thread.
  absl::Status Init();

  absl::Status RegisterState(const std::string& name, void* data,
                             size_t bytes) override;
  absl::StatusOr<ShardView> RegisterShardedState(const std::string& name,
                                                 size_t global_bytes,
                                                 size_t unit_bytes) override;
  absl::StatusOr<ShardView> Shard(const std::string& name) override;
  absl::Status RegisterDataPosition(const std::string& name,
                                    int64_t* position) override;
  bool CheckFinite(absl::string_view what, float* data, size_t count) override;
  void ReportNonFinite(absl::string_view what) override;
  void ReportLocalSquares(double sum_of_squares) override;
  // Whether the injected fault nan: fires for this slot at this step (see
  // src/runtime/fault_points.h).
  bool InjectNanNow();
  // The bit the injected fault gradflip: flips in this slot's values at
  // this step, or -1.
  int GradientFlipBitNow();

  bool standby() const override;
  int slot() const override;
  int world_size() const override;
  int64_t generation() const override;
  int64_t committed_step() const override;
  absl::Status AwaitCommit(int64_t step, absl::Duration timeout) override;
  absl::StatusOr<Communicator*> communicator() override;
  testing::BackupStats backup_stats() const { return snapshots_.stats(); }
  void Leave(bool finished) override;

  absl::StatusOr<bool> Snapshot(int64_t step) override;
  // Called by the step function before it writes registered state, so the
  // step's own snapshot may be copied during the next step
  // (RunOptions::snapshot_copy); see Snapshots::BeginStateUpdate.
  void BeginStateUpdate() override { snapshots_.BeginStateUpdate(); }
  void ReportEarlyWrite(absl::string_view what) override;

  // ---- step_loop.cc --------------------------------------------------------

  absl::StatusOr<RunResult> Run(
      std::function<absl::Status(const StepContext&)> step_fn,
      const RunOptions& options) override;

 private:
  using View = GenerationView::View;

  // ---- runtime.cc ----------------------------------------------------------

  // Snapshot(step); with `defer`, its bytes are copied during the next
  // step (Snapshots::Queue).
  absl::StatusOr<bool> TakeSnapshot(int64_t step, bool defer);
  // Registration ends when Run starts.
  absl::Status RegistrationOpen(const std::string& name) const;

  // ---- step_loop.cc: the start, the steps, recovery ------------------------

  absl::StatusOr<RunResult> RunLoop(
      std::function<absl::Status(const StepContext&)> step_fn,
      const RunOptions& options);
  // Where RunLoop is: the next step, and the recoveries in a row after
  // which no step past `stuck_at` (the newest step done when the first of
  // them began) completed.
  struct Loop {
    int64_t step = 0;
    int64_t stuck_at = -1;
    int stuck = 0;
  };
  // The registered host buffers hold the state of step `restored`: the
  // trainer's hook sees it (device copies are refreshed there) and the
  // loop goes on after it.
  absl::Status ResumeAt(Loop* loop, const RunOptions& options,
                        int64_t restored);
  // Recover(cause), unless the same failure keeps coming back
  // (RuntimeOptions::max_step_retries), then resumes after the restored
  // step.
  // Run's options, refused by name (before anything starts).
  absl::Status CheckRunOptions(const RunOptions& options,
                               bool has_step_fn) const;
  // Waits for a slot, then resumes the job where it is (recovering if the
  // start fails).
  absl::Status Begin(Loop* loop, const RunOptions& options);
  // The steps from loop->step to options.steps, recovering from each
  // failure that can be recovered.
  absl::Status RunSteps(
      Loop* loop,
      const std::function<absl::Status(const StepContext&)>& step_fn,
      const RunOptions& options);
  absl::Status RecoverInLoop(Loop* loop, const RunOptions& options,
                             const absl::Status& cause);
  // Runs step `step` of the step function; its status, or why the step
  // cannot count (the generation moved, the member cannot go on).
  // `*fenced`: the step called BeginStateUpdate(). `*fatal`: an error that
  // ends Run (a step that broke RunOptions::snapshot_copy's contract).
  absl::Status CallStep(
      const std::function<absl::Status(const StepContext&)>& step_fn,
      const RunOptions& options, int64_t step, bool* fenced,
      absl::Status* fatal);
  // The bookkeeping of a step that completed (started at `t0`): the
  // ledger, its snapshot, its report. An error is the snapshot's.
  absl::Status CompleteStep(const RunOptions& options, int64_t step,
                            absl::Time t0, bool fenced);
  // At a snapshot step, before its copy: the bitflip fault.
  void InjectBitflip(int64_t step);
  // Whether the snapshot of `step` gets a replica check
  // (NumericChecks::replica_check_every), which the step's report carries.
  bool ReplicaCheckDue(const RunOptions& options, int64_t step) const;
  RunResult Result(const RunOptions& options);
  // The start of Run for a member with a slot: a worker of a fresh job
  // starts from its registered state, or from the disk tier when it holds
  // a checkpoint; a member joining a running job (a standby taking a slot)
  // restores the committed step. Then the starting state is snapshotted and
  // backed up before the first step, so every step after it can be
  // recovered. Returns the step the state is at: `fresh_step` when this
  // is a fresh job and no disk checkpoint is there.
  absl::StatusOr<int64_t> Start(int64_t fresh_step);
  // Start's state in generation `v`, with the communicators built (the
  // training one possibly still building): restored, or FreshStart's.
  absl::StatusOr<int64_t> StartState(const View& v, int64_t fresh_step);
  // Start's fresh part, in generation `v`: the disk tier's checkpoint or
  // `fresh_step`, checked alike on every member, snapshotted and committed.
  // Also a recovery's, when no member has a committed step (the first
  // generation failed before its starting state was committed).
  absl::StatusOr<int64_t> FreshStart(const View& v, int64_t fresh_step);
  // Numeric anomalies (numerics.cc; NumericGuard checks the numbers).
  // Reports one and waits for the controller's rollback (the next
  // generation); Aborted, naming it, for the recovery that follows.
  absl::Status ReportAnomaly(const control::Anomaly& anomaly);
  // Moves the data position past the skipped data.
  void SkipData();
  DataRanges SkippedData() const;
  // At the end of Run: waits (bounded) until the last step is committed.
  // A slot whose last round found the others at another step (it had
  // skipped one) snapshots the last step again, so every slot ends in the
  // same committed round and nobody leaves a peer waiting in one.
  void FinishBackups(int64_t last, absl::Time deadline);

  // ---- generation.cc: the member's side of the generation view --------------

  // The member client's callback for a new generation.
  void OnMembership(const MembershipUpdate& u);

  // The end of step `step`: while the member has had no word from the
  // controller for longer than its lease (MemberClient::lease()), waits
  // until it hears again, so that a member cut off from the controller
  // completes no step and acks no snapshot (it may be declared lost and
  // its slot given to another). Not OK when it is fenced or the job
  // stopped meanwhile, or when its generation moved or its communicator
  // failed (the step is then redone after a recovery).
  absl::Status AwaitLease(int64_t step);

  // A standby parks here until it is given a slot.
  absl::Status AwaitSlot(const RunOptions& options);
  // Waits until step `s` of generation `gen` is committed, or cannot be
  // (a newer generation, this member fenced, the job ended, the backup
  // pipeline stopping), or until `deadline`; whether either came first.
  bool AwaitRoundEnd(int64_t s, int64_t gen, absl::Time deadline) override;

  // ---- checkpoints.cc: the backup pipeline's side channel
  // --------------------

  // The side communicator of generation `gen` and its backup links, for
  // the backup thread.
  using SideChannel = BackupPipeline::SideChannel;
  absl::StatusOr<SideChannel> Side(int64_t gen) override;
  // A side communicator failed while the training one did not: the group
  // is broken all the same (backups can no longer commit), so it is
  // rebuilt unless something else already explains it.
  void SideFailed(const absl::Status& why, int64_t gen) override;
  // Acks `step` of `gen` to the controller (for the backup pipeline).
  void AckStep(int64_t step, int64_t gen) override;

  // ---- checkpoints.cc: the checkpoint layer, as this member runs it --------

  // A restore on `comm` (host buffers) of this generation's view `v`.
  checkpoint::Restore NewRestore(Communicator* comm, const View& v);
  // Rolls every member back to the newest committed step
  // (checkpoint::Restore::FromMemory). `rec` (optional) gets what was
  // received.
  absl::StatusOr<int64_t> Restore(RecoveryRecord* rec) override;
  // Recovery::Member's.
  absl::Status BuildComms() override { return comms_->Build(/*defer=*/true); }
  absl::StatusOr<int64_t> AwaitComms() override;
  int64_t lost_steps() const override { return progress_.lost_steps; }
  void NoteRestored(const checkpoint::Restored& r, RecoveryRecord* rec);

  // ---- report.cc: what this member leaves in the controller's store -------

  void PublishRecovery(const RecoveryRecord& r);
  // Moves the pending recovery record (if any) into the run's records and
  // publishes it: after the first step that follows it, or at the run's end.
  void KeepRecoveryRecord();
  void PublishFinalState(int slot);
  void PublishFinal(const RunResult& r);

  RuntimeOptions options_;
  std::shared_ptr<control::ControllerStore> store_;
  std::unique_ptr<control::MemberClient> member_;

  // The generations, the committed step, the job's state and the
  // communicators of this member (generation_view.h).
  GenerationView gens_{[this] { return snapshots_.stopping(); }};
  // What the heartbeats say of each step (Init makes it).
  std::unique_ptr<StepReporter> reporter_;

  // Aborts ordered by the controller, run on the abort thread.
  AbortQueue aborts_{[this](int64_t upto, const std::string& reason) {
    gens_.Abort(upto, reason);
  }};

  // The training thread's own.
  checkpoint::StateRegistry state_;
  // What the training thread knows of its progress (the restore sets it);
  // its ledger travels with its snapshots' pieces.
  checkpoint::Progress progress_;
  bool started_ = false;
  bool finished_ = false;
  bool left_ = false;
  int restores_ = 0;        // Restore calls, for the restore=N fault point
  int64_t start_step_ = 0;  // RunOptions::start_step of this Run
  // Whether a completed step called BeginStateUpdate(): then a step that
  // fails before it did has not written registered state.
  bool fences_ = false;
  // The word a peer on this host reads to find out whether it may read
  // this process's memory (see Restore).
  const uint64_t probe_word_ = ProbeWord();
  int64_t snapshots_taken_ = 0;
  int64_t snapshots_skipped_ = 0;
  int64_t snapshots_unfenced_ = 0;  // copied during a step: no fence
  std::optional<RecoveryRecord> pending_record_;
  // Set by ResumeAt, logged and cleared by the next CompleteStep: when
  // the trainer's on_restore began and how long it took.
  struct Resumed {
    absl::Time at;
    absl::Duration on_restore;
  };
  std::optional<Resumed> resumed_;
  // Logs resumed_ for the step [t0, t1] and clears it (when set).
  void NoteResumed(absl::Time t0, absl::Time t1);
  // Numeric checks, the data position, the data skipped from the start
  // (RunOptions::skip_data) and by the controller, and the step under way.
  // Whether the replicated state held the same bytes on every slot at
  // the start (replica checks compare it only then).
  bool replicas_comparable_ = true;
  NumericGuard numerics_;
  int64_t* data_position_ = nullptr;
  DataRanges run_skip_;
  std::atomic<int64_t> step_now_{0};
  std::vector<RecoveryRecord> recovery_records_;

  // The pieces this member holds and the hand-over of its snapshots to
  // the backup thread.
  checkpoint::Snapshots snapshots_{&state_};
  // This member's test faults (RuntimeOptions::faults); its callbacks
  // reach this runtime until the destructor clears them. Only runtime.cc
  // configures it: everything else, the training communicators included,
  // reaches faults through the points of `faults_` (src/fault/hooks.h).
  const std::shared_ptr<fault::Injector> injector_ =
      std::make_shared<fault::Injector>();
  const std::shared_ptr<fault::Hooks> faults_ = injector_;
  // The I/O of the pieces this member receives, through which the
  // corrupt-backup and corrupt-restore faults damage them.
  FaultyPieceIo piece_io_{faults_, [this] { return slot(); }};
  std::atomic<bool> finishing_{false};
  // Builds the communicators of each generation (Init makes it).
  std::unique_ptr<CommSet> comms_;
  // How this member recovers (Init makes it; the backup thread reports
  // through it, so it goes after that thread).
  std::unique_ptr<Recovery> recovery_;
  // The backup thread and the disk tier (Init starts it; Leave stops it).
  std::unique_ptr<BackupPipeline> backups_;
};

}  // namespace holdfast

#endif  // HOLDFAST_SRC_RUNTIME_RUNTIME_IMPL_H_
