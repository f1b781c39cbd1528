// Runtime: a process's place in a fault-tolerant job. It joins the job's
// controller, keeps heartbeats going, builds the Communicator of the current
// generation, snapshots the registered state into host memory, and on a
// failure recovers in the same process: abort, wait for the next
// generation, rebuild the communicator, roll back to the last committed
// step (a standby receives the state from a survivor), and go on.
//
// A trainer registers its state (parameters, optimizer state, data
// position, RNG state) as named host buffers, then hands its step function
// to Run(), which needs no recovery code from the trainer:
//
//   auto rt = holdfast::Runtime::Create();           // HOLDFAST_* env
//   rt.value()->RegisterState("params", w.data(), w.size() * 4);
//   auto result = rt.value()->Run(
//       [&](const holdfast::StepContext& ctx) -> absl::Status {
//         ... compute on this rank's share of the batch ...
//         return ctx.comm->AllReduce(g, n, kFloat32, kSum)->Wait();
//       }, {.steps = 1000});
//
// Steps are numbered from 1; step 0 is the registered state as it is when
// Run() starts. The state after step s is snapshot s.
//
// State is replicated (identical on every slot: parameters and optimizer
// state of plain data parallelism, the data position) or sharded (each slot
// owns a different partition of a global array: ZeRO optimizer shards,
// tensor- or pipeline-parallel partitions). A snapshot is cut into one
// piece per slot: slot i keeps partition i of every replicated buffer and
// its own partition of every sharded one, so snapshot memory and traffic
// per slot are 1/N of the replicated state. Each piece is copied to
// `replicas` buddies in other failure domains (its host label) over a side
// communicator, from a background thread. A step is committed once every
// piece is held by its owner and its buddies. A restore reassembles what
// each member needs from the pieces of the committed step, verifying their
// xxHash3 checksums, and falls back to another copy or to the optional disk
// tier; with no good copy left it fails with DataLoss naming the piece.
//
// Threading: Run() and the low-level calls belong to one thread (the
// training loop). Controller pushes arrive on a background thread; they
// abort the communicator, which is safe from any thread.
#ifndef HOLDFAST_RUNTIME_H_
#define HOLDFAST_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "holdfast/communicator.h"
#include "holdfast/options.h"
#include "holdfast/state.h"
#include "holdfast/tls.h"

namespace holdfast {

// When a buddy checks the copy it received against the owner's checksum.
// A restore checks every copy it uses either way.
enum class VerifyBackups {
  // As the bytes land; a damaged copy keeps its step from committing. This
  // hashes every received byte inside the round, which costs about what the
  // transfer does where the link is as fast as memory (loopback,
  // NVLink-class hosts).
  kArrival,
  // The round only moves the bytes and the checksum, and a damaged copy is
  // found when a restore needs it; that restore then uses another copy or
  // the disk tier, or stops with DataLoss naming the piece. Never a wrong
  // model, but a step can commit with fewer good copies than `replicas`
  // promises.
  kRestore,
};

// The runtime's defaults after environment overrides (docs/configuration.md),
// as for CommunicatorOptions (holdfast/options.h). Each reads its variable
// when called; a malformed value gives the built-in default here, and
// Runtime::Create refuses it by name.
namespace defaults {
std::string Controller();          // HOLDFAST_CONTROLLER ("")
std::string JobToken();            // HOLDFAST_JOB_TOKEN ("")
TlsFiles Tls();                    // HOLDFAST_TLS_CA, _CERT, _KEY, _SERVER_NAME
std::string Host();                // HOLDFAST_HOST, else the host name
std::string TopologyBlock();       // HOLDFAST_TOPOLOGY_BLOCK ("")
absl::Duration RecoveryTimeout();  // HOLDFAST_RECOVERY_TIMEOUT_MS (300000)
std::string Faults();              // HOLDFAST_FAULTS ("")
// HOLDFAST_PREFERRED_SLOT: a slot, -1 for "standby", none for "" (the
// controller chooses).
std::optional<int> PreferredSlot();
// HOLDFAST_START_GATE_FD: a file descriptor, none for "".
std::optional<int> StartGateFd();
int Replicas();                     // HOLDFAST_REPLICAS (1)
VerifyBackups VerifyBackupsWhen();  // HOLDFAST_VERIFY_BACKUPS (arrival)
bool SameHostRestore();             // HOLDFAST_SAME_HOST_RESTORE (on)
bool SideExchanges();               // HOLDFAST_SIDE_EXCHANGES (off)
bool OverlapInit();                 // HOLDFAST_OVERLAP_INIT (on)
bool LiveRestore();                 // HOLDFAST_LIVE_RESTORE (on)
int TpSize();                       // HOLDFAST_TP_SIZE (1)
int PpSize();                       // HOLDFAST_PP_SIZE (1)
std::string CheckpointDir();        // HOLDFAST_CHECKPOINT_DIR ("")
int64_t CheckpointEvery();          // HOLDFAST_CHECKPOINT_EVERY (100)
int MaxStepRetries();               // HOLDFAST_MAX_STEP_RETRIES (10)
int KeepSnapshots();                // HOLDFAST_KEEP_SNAPSHOTS (2)
int ReplicaCheckEvery();            // HOLDFAST_REPLICA_CHECK_EVERY (0)
}  // namespace defaults

// Every field starts at its default, read from the environment when the
// struct is made (see `defaults`); a field set in code wins. Runtime::Create
// refuses a value out of range, naming the field.
struct RuntimeOptions {
  // host:port of the controller (required).
  std::string controller = defaults::Controller();
  // The job token (required). When `token_file` is set, Create reads the
  // token from its first line instead.
  std::string token = defaults::JobToken();
  std::string token_file;
  // Mutual TLS to the controller (or the host agent): the job's CA and
  // this process's certificate and key, all three or none (plain TCP).
  TlsFiles tls = defaults::Tls();
  // Failure-domain labels: this member's machine and its rack or switch
  // (buddies are placed on other machines, and other blocks where they
  // can be).
  std::string host = defaults::Host();
  std::string topology_block = defaults::TopologyBlock();
  // Communicators of every generation are built with these (rank, size and
  // generation are set by the runtime).
  CommunicatorOptions comm;
  // How long Create waits for the controller (> 0).
  absl::Duration join_timeout = absl::Seconds(60);
  // One recovery (from the failure to the restored state) longer than this
  // ends Run with DeadlineExceeded (> 0).
  absl::Duration recovery_timeout = defaults::RecoveryTimeout();
  // After a failure nobody explained, how long to wait for the controller's
  // own verdict (a peer's crash is detected in under a second) before
  // reporting the broken communicator, which rebuilds the group (>= 0).
  absl::Duration report_grace = absl::Milliseconds(500);
  // A snapshot may not overwrite a step that can still commit; it waits
  // this long for that commit (normally a round trip to the controller)
  // before it is skipped.
  absl::Duration commit_wait = absl::Seconds(2);
  // Faults to inject (docs/testing.md).
  std::string faults = defaults::Faults();
  // Ask for this slot when joining (-1: the standby role; none: the
  // controller chooses).
  std::optional<int> preferred_slot = defaults::PreferredSlot();
  // The read end of a pipe: Create joins the job once it reads the pipe's
  // end (its writer closed it), within join_timeout. holdfast-run gives
  // its workers one that it closes once the node's standbys have
  // registered, so a fault early in the job finds them in place. Create
  // closes it, and removes HOLDFAST_START_GATE_FD from the environment if
  // it names it; a descriptor that is not a pipe is ignored with a
  // warning.
  std::optional<int> start_gate_fd = defaults::StartGateFd();
  // Copies of each piece on buddies (1 to 64).
  int replicas = defaults::Replicas();
  // When buddies check received copies.
  VerifyBackups verify_backups = defaults::VerifyBackupsWhen();
  // Whether a restore reads the pieces a member on the same host holds
  // straight from its memory, where the kernel allows it.
  bool same_host_restore = defaults::SameHostRestore();
  // Whether the runtime's own exchanges (a restore's agreements and
  // transfers, the start's checks) go over the side communicator (Gloo)
  // while the training communicator is built, as they always do when the
  // training one takes device memory (NCCL): a restore then overlaps the
  // training communicator's build. Off: over the training communicator
  // when it takes host memory, once it is built. On runs the NCCL jobs'
  // protocol on a machine without a GPU.
  bool side_exchanges = defaults::SideExchanges();
  // Where they go over the side communicator: whether a restore (and the
  // start's checks) runs while the training communicator is still being
  // built, rather than after it is (off: for comparison).
  bool overlap_init = defaults::OverlapInit();
  // After a fault, with all registered state replicated: whether the job
  // goes on from the survivors' live state when it is a completed step
  // past the committed one and the same on each of them (they restore
  // nothing, and a newcomer receives it from all of them at once),
  // rather than rolling back to the committed step. Not after a numeric
  // rollback, which must go back to its clean step.
  bool live_restore = defaults::LiveRestore();
  // The parallel layout buddies avoid: slot = ((dp * pp) + pp_index) * tp +
  // tp_index (each >= 1).
  int tp_size = defaults::TpSize();
  int pp_size = defaults::PpSize();
  // Disk tier: every committed step that is a multiple of checkpoint_every
  // (>= 1) is written here (asynchronously, atomically, with checksums);
  // read when no memory copy is left, and when a fresh job starts. Empty:
  // no disk tier.
  std::string checkpoint_dir = defaults::CheckpointDir();
  int64_t checkpoint_every = defaults::CheckpointEvery();
  // Run gives up (returning the last failure, with a message saying so)
  // after this many recoveries in a row in which no step after the newest
  // one ever done completed: a failure that comes back every time the
  // steps are redone (an op timeout too short for a step's collective, a
  // step function that always fails) would otherwise recover forever.
  // 0: no limit.
  int max_step_retries = defaults::MaxStepRetries();
  // Committed snapshots kept in memory (own pieces and buddies' copies),
  // 2 to 64. A numeric anomaly rolls the job back to the newest of them
  // that is clean; the newest may already be poisoned (an update that was
  // finite but wrong shows in the next step's loss). Each one costs the
  // snapshot memory of one step.
  int keep_snapshots = defaults::KeepSnapshots();
};

class Runtime;

// What the step function gets.
struct StepContext {
  int64_t step = 0;  // 1-based
  // This member's slot in the world: its rank in `comm` and its index in
  // the data-parallel split.
  int slot = 0;
  int world_size = 0;
  int64_t generation = 0;
  Communicator* comm = nullptr;  // this generation's; valid during the call
  Runtime* runtime = nullptr;    // for Shard()
};

// What Run checks after each step (docs/gray-failures.md). A step that
// fails a check is not snapshotted: the member reports it to the
// controller, which rolls the job back to the newest clean committed step
// and skips the step's data (the registered data position moves past it).
struct NumericChecks {
  // NaN or Inf in these metrics (from RunOptions::metrics), or in values
  // handed to Runtime::CheckFinite.
  bool check_finite = true;
  std::vector<std::string> metrics = {"loss", "grad_norm"};
  // A loss spike: the metric "loss" above spike_factor times the median of
  // its last spike_window values, once it has spike_warmup of them. 0 (the
  // default): off. A ratio to the median suits a loss that stays well
  // above its noise (a language model's); near zero a batch's loss swings
  // by 10x and more (the example MLP, converged, spiked 8 times in 11
  // minutes at 10x), and each false spike rolls back and skips a batch.
  // Losses are compared on one slot; a trainer whose loss is local to a
  // slot gets its own slot's spikes.
  double spike_factor = 0.0;
  int spike_window = 64;
  int spike_warmup = 16;
  // Silent data corruption at rest: at every k-th snapshot every slot
  // reports a hash of its replicated registered state to the controller,
  // which compares the slots'. Where they differ, the slots outside the
  // majority are named and the job rolls back to the newest commit at or
  // before the last step where every slot agreed, skipping no data; a
  // member named a second time is replaced. The hash reads all of the
  // replicated state on the training thread (xxHash3; with 64 MiB per
  // slot, 3 slots on 2 cores and 10 ms steps, it doubled the step time),
  // after the snapshot's copy, which a check keeps between the steps,
  // and that commit must still be kept (keep_snapshots): hence off by
  // default. 0: off. Off for a run whose replicated state already differed
  // between slots at its start (a warning names the buffer).
  int replica_check_every = defaults::ReplicaCheckEvery();
};

// Data positions [begin, end) to skip.
using DataRanges = std::vector<std::pair<int64_t, int64_t>>;

struct RunOptions {
  // Run steps 1..steps (the loop resumes after the committed step).
  int64_t steps = 0;
  // Snapshot after every k-th step (and step 0).
  int64_t snapshot_every = 1;
  // Optional: metrics sent with each step report (loss, tokens_per_s).
  std::function<std::map<std::string, double>()> metrics;
  // Optional: called when the registered buffers have been restored (at
  // the start, with the step the loop goes on from, and after every
  // recovery), before the next step. A trainer whose state lives on a GPU
  // registers pinned host copies (nccl::DeviceSnapshot) and copies them
  // back to the device here. An error ends Run with it.
  std::function<absl::Status(int64_t restored_step)> on_restore;
  // Optional: returns once the registered buffers hold what the trainer
  // last wrote into them. Called before each read of the live state (a
  // snapshot's copy, on the training thread or, during the next step, on
  // the backup thread; a restore), from any thread, so it must not need
  // the step's locks. For buffers filled asynchronously: a trainer that
  // starts a device-to-pinned-host copy at a step's end waits for it here
  // (Python: what register_tensor does for CUDA tensors), and the copy
  // overlaps the next step. An error drops that snapshot, and fails a
  // snapshot taken between the steps, or a restore, with it.
  std::function<absl::Status()> state_ready;
  // Optional: called once in a standby, before it waits for a slot. A
  // trainer runs here what a step computes, on throwaway inputs (a forward
  // and backward pass of the model, without communicating), so that what
  // a process pays at its first step (on a GPU: CUDA's lazily loaded
  // kernels, cuBLAS's handles, the caching allocator's blocks) is paid
  // before the standby takes a slot, and not while the survivors wait for
  // its first step. It must not change registered state (a job that fails
  // before its first commit starts afresh from every member's own), nor
  // communicate. An error is logged and the standby waits as usual.
  std::function<absl::Status()> standby_warmup;
  // Where each snapshot is copied out of the registered buffers: on the
  // training thread between the steps, or on the background thread while
  // the next step computes (as CheckFreq does: a step reads the state long
  // before it writes it), which needs the step function to call
  // ctx.runtime->BeginStateUpdate() before its first write to registered
  // state. The last step's snapshot is always copied between the steps.
  enum class SnapshotCopy {
    // During the next step when the step just snapshotted called
    // BeginStateUpdate() (the trainer fences its writes), else between the
    // steps. If a step then returns without the call, the snapshot it may
    // have written under is dropped (RunResult::snapshots_unfenced, with a
    // warning) and the next one is copied between the steps.
    kAuto,
    // Always between the steps (BeginStateUpdate() returns at once).
    kBetweenSteps,
    // Always during the next step: a step that returns without calling
    // BeginStateUpdate() fails Run with FailedPrecondition.
    kDuringNextStep,
  };
  SnapshotCopy snapshot_copy = SnapshotCopy::kAuto;
  // What is checked after each step (NaN, Inf, loss spikes).
  NumericChecks numerics;
  // Data to skip from the start, as a job that rolled back past an anomaly
  // skipped it (summary.json's skipped_data): a reference run. Needs a
  // registered data position (Runtime::RegisterDataPosition).
  DataRanges skip_data;
  // The step a fresh job's registered state is at: the trainer loaded it
  // from a checkpoint of its own (a torch.distributed.checkpoint, say), and
  // the loop goes on at start_step + 1. Every worker passes the same value
  // (a mismatch fails Run by name). Ignored when the job resumes from a
  // holdfast checkpoint (a running job's memory, or the disk tier).
  int64_t start_step = 0;
};

// One recovery, as this process saw it. Times are Unix milliseconds.
struct RecoveryRecord {
  int64_t failed_generation = 0;  // the generation that broke
  int64_t generation = 0;         // the one that recovered
  std::string cause;              // the first error or order seen
  int64_t seen_ms = 0;            // the failure was seen
  int64_t aborted_ms = 0;         // the communicator was aborted
  int64_t agreed_ms = 0;          // the new generation was known
  int64_t rebuilt_ms = 0;         // the new communicator was up
  int64_t restored_ms = 0;        // the state was rolled back
  int64_t first_step_ms = 0;      // the first step after it ended; 0: none
                                  // came (it restored the job's last step)
  int64_t restored_step = 0;      // the committed step restored
  int64_t lost_steps = 0;         // steps done past it, done again
  bool received_state = false;    // pieces came from other members
  bool from_disk = false;         // no memory copy was left: disk tier
  int64_t bytes_received = 0;     // by this member
  // Of those, read straight from the memory of a member on this host
  // (HOLDFAST_SAME_HOST_RESTORE), not over the communicator.
  int64_t bytes_read_in_place = 0;
  // The training communicator was up (Unix ms, as the times above). Where the
  // runtime's exchanges go over the side communicator (NCCL; side_exchanges),
  // rebuilt_ms is the side one's, and the training one is built during the
  // restore: this may come before or after restored_ms. Else by rebuilt_ms.
  int64_t comm_up_ms = 0;
};

struct RunResult {
  int64_t final_step = 0;
  int world_size = 0;
  int slot = 0;
  int64_t generation = 0;
  std::vector<RecoveryRecord> recoveries;
  int64_t snapshots = 0;
  int64_t snapshots_skipped = 0;  // the previous one was not committed yet
  // Of the snapshots, those copied during the next step that called
  // BeginStateUpdate() first, and those dropped because the next step
  // did not call it (kAuto).
  int64_t snapshots_overlapped = 0;
  int64_t snapshots_unfenced = 0;
  // Step time of the steps that count (those rolled back are dropped),
  // carried across recoveries, and the wall time from the first step's
  // start to the last step's end.
  int64_t productive_ms = 0;
  int64_t wall_ms = 0;
  // Backups: rounds committed, bytes this member sent and received for
  // them, and the time its background thread spent in them (the rounds;
  // not the copies made during a step).
  int64_t backups = 0;
  int64_t backup_bytes = 0;
  int64_t backup_ms = 0;
  int64_t disk_writes = 0;
  // The data the job skipped (numeric anomalies and RunOptions::skip_data).
  DataRanges skipped_data;
};

class Runtime {
 public:
  // Joins the controller (waiting up to join_timeout) and validates the
  // fault list. A standby returns at once; Run() parks it until it is
  // given a slot. InvalidArgument for bad options or faults (naming them),
  // Unauthenticated for a wrong token, Unavailable if no controller
  // answers.
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(
      RuntimeOptions options);
  // Create with the defaults (RuntimeOptions()).
  static absl::StatusOr<std::unique_ptr<Runtime>> Create();
  // Leaves the job (as finished if Run completed).
  virtual ~Runtime() = default;

  // ---- State --------------------------------------------------------------
  // Registers `bytes` bytes at `data` (host memory, valid for the runtime's
  // life) under a unique non-empty name. Every slot registers the same
  // names and sizes in the same order (checked at the start and at each
  // restore). The state is replicated: it holds the same bytes on every
  // slot (a restore rebuilds each slot's copy from pieces of all slots; a
  // fresh start warns about a buffer that differs).
  virtual absl::Status RegisterState(const std::string& name, void* data,
                                     size_t bytes) = 0;
  // Registers sharded state: a `global_bytes` array partitioned over the
  // slots in whole units of `unit_bytes` (an element, or one slot's whole
  // tensor-parallel partition); the runtime owns the memory. Returns this
  // slot's partition (zeroed; fill it before Run). After a recovery that
  // changes the world size the partitions move: survivors receive the
  // parts of the lost slot's data that now fall in their partition, so a
  // trainer reads Shard() (or ctx.runtime->Shard()) at every step.
  virtual absl::StatusOr<ShardView> RegisterShardedState(
      const std::string& name, size_t global_bytes, size_t unit_bytes) = 0;
  // The current partition of a sharded buffer. NotFound for another name.
  virtual absl::StatusOr<ShardView> Shard(const std::string& name) = 0;
  // Registers `*position` (replicated state, like RegisterState) as the
  // trainer's position in its data: the index of the next sample or batch
  // it consumes. The step function reads it, consumes data from there,
  // and advances it (after BeginStateUpdate(), as any registered state).
  // Between the steps and after each restore, Run moves it past the data
  // the job skips (numeric anomalies, RunOptions::skip_data), so a step
  // never sees skipped data. At most one; before Run.
  virtual absl::Status RegisterDataPosition(const std::string& name,
                                            int64_t* position) = 0;

  // ---- Numeric checks -----------------------------------------------------
  // Checks this slot's own values (its local gradients before the
  // all-reduce) for NaN and Inf; false if any. A slot that finds one is
  // named the source of the step's anomaly, and its step is rolled back
  // at its end (its trainer goes on with the step as usual: the collective
  // spreads the NaN, which every slot's own checks then see). Finite
  // values count toward the step's local norm (ReportLocalSquares). The
  // values are written only by the injected faults nan:slot=S:step=N,
  // which makes them NaN, and gradflip:slot=S:step=N, which flips a bit of
  // one. Call from the step function.
  virtual bool CheckFinite(absl::string_view what, float* data,
                           size_t count) = 0;
  // The same verdict from a trainer that checked its values itself (a
  // framework's isfinite). Call from the step function.
  virtual void ReportNonFinite(absl::string_view what) = 0;
  // The sum of the squares of finite values this slot checked itself (its
  // local gradients before the all-reduce; CheckFinite adds its own). A
  // step's sums make its local norm, which its report carries; the
  // controller compares the slots' norms of each step and names a slot
  // whose norm is far above the others' (a bit flipped in its gradients:
  // DetectionOptions::gradient_outlier_factor). Call from the step
  // function, from any thread.
  virtual void ReportLocalSquares(double sum_of_squares) = 0;

  // ---- The step loop ------------------------------------------------------
  // Runs steps committed+1 .. options.steps with automatic recovery. A
  // standby first waits for a slot. OK when the last step is done (the
  // runtime then leaves the job as finished). Errors: the job stopped below
  // its minimum world size (Aborted, with the controller's reason), this
  // member was fenced (FailedPrecondition), a recovery timed out
  // (DeadlineExceeded), no copy of the committed state is left (DataLoss),
  // the step function returned a non-holdfast error (returned as is).
  virtual absl::StatusOr<RunResult> Run(
      std::function<absl::Status(const StepContext&)> step_fn,
      const RunOptions& options) = 0;

  // ---- Low level (for trainers that drive their own loop) -----------------
  virtual bool standby() const = 0;
  virtual int slot() const = 0;
  virtual int world_size() const = 0;
  virtual int64_t generation() const = 0;
  virtual int64_t committed_step() const = 0;
  // The current generation's communicator; builds it if needed (blocks
  // until every slot has arrived). Null only on error.
  virtual absl::StatusOr<Communicator*> communicator() = 0;
  // Copies this slot's piece of the registered state into a host snapshot
  // of `step` and hands it to the backup thread, which copies it to the
  // buddies and acks it. Returns false if skipped: the previous snapshot is
  // still being backed up (training never waits for a backup), or `step`
  // is not newer than the committed step.
  virtual absl::StatusOr<bool> Snapshot(int64_t step) = 0;
  // Waits until the committed step is at least `step` (after Snapshot(step)
  // returned true: until its backup round commits), without polling. OK
  // once it is. DeadlineExceeded after `timeout`: a snapshot that no round
  // backed up (another slot offered another step) commits only when a
  // later one does. Aborted when the communicator fails, a newer
  // generation opens (a recovery rolls the state back first) or the job
  // ended; FailedPrecondition when this member was fenced.
  virtual absl::Status AwaitCommit(int64_t step, absl::Duration timeout) = 0;
  // The step function calls this before it writes registered state, so
  // that its snapshot can be copied during the next step (see
  // RunOptions::snapshot_copy). It waits for the background copy of the
  // previous step's snapshot if one is under way (a memory copy), and lets
  // that snapshot commit; one the background thread has not started is
  // copied here instead, as between the steps. Without such a snapshot it
  // returns at once.
  virtual void BeginStateUpdate() = 0;
  // For a step function that finds it wrote registered state before it
  // called BeginStateUpdate() (`what` names that state), instead of the
  // call: the step does not count as fenced. A snapshot copied during it
  // may be torn, so it is dropped at the step's end (RunResult::
  // snapshots_unfenced; with kDuringNextStep, Run fails with
  // FailedPrecondition naming `what`), and the next snapshot is copied
  // between the steps. A BeginStateUpdate() later in the same step is
  // ignored. The Python package calls it when a registered tensor's
  // version counter moved between the snapshot and the fence.
  virtual void ReportEarlyWrite(absl::string_view what) = 0;
  // Leaves the job; `finished` after the last step.
  virtual void Leave(bool finished) = 0;
};

// True for the statuses a holdfast call returns when a peer, the group or
// the controller failed (Unavailable, DeadlineExceeded, Aborted): Run
// recovers from these and passes any other error of the step function on.
bool IsRecoverable(const absl::Status& status);

}  // namespace holdfast

#endif  // HOLDFAST_RUNTIME_H_
