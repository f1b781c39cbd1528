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
// Run() starts (every slot must start from the same state). The state after
// step s is snapshot s; s is committed once every slot holds it.
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
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "holdfast/communicator.h"
#include "holdfast/options.h"

namespace holdfast {

struct RuntimeOptions {
  // host:port of the controller; empty reads HOLDFAST_CONTROLLER.
  std::string controller;
  // The job token; empty reads token_file, then HOLDFAST_JOB_TOKEN.
  std::string token;
  std::string token_file;
  // Labels; empty reads HOLDFAST_HOST (default: the host name) and
  // HOLDFAST_TOPOLOGY_BLOCK.
  std::string host;
  std::string topology_block;
  // Communicators of every generation are built with these (rank, size and
  // generation are set by the runtime).
  CommunicatorOptions comm;
  // How long Create waits for the controller.
  absl::Duration join_timeout = absl::Seconds(60);
  // One recovery (from the failure to the restored state) longer than this
  // ends Run with DeadlineExceeded; default HOLDFAST_RECOVERY_TIMEOUT_MS.
  absl::Duration recovery_timeout = absl::ZeroDuration();
  // After a failure nobody explained, how long to wait for the controller's
  // own verdict (a peer's crash is detected in under a second) before
  // reporting the broken communicator, which rebuilds the group.
  absl::Duration report_grace = absl::Milliseconds(500);
  // A snapshot may not overwrite a step that can still commit; it waits
  // this long for that commit (normally a round trip to the controller)
  // before it is skipped.
  absl::Duration commit_wait = absl::Seconds(2);
  // Faults to inject; empty reads HOLDFAST_FAULTS.
  std::string faults;
};

// What the step function gets.
struct StepContext {
  int64_t step = 0;  // 1-based
  int rank = 0;      // this slot
  int world_size = 0;
  int64_t generation = 0;
  Communicator* comm = nullptr;  // this generation's; valid during the call
};

struct RunOptions {
  // Run steps 1..steps (the loop resumes after the committed step).
  int64_t steps = 0;
  // Snapshot after every k-th step (and step 0).
  int64_t snapshot_every = 1;
  // Optional: metrics sent with each step report (loss, tokens_per_s).
  std::function<std::map<std::string, double>()> metrics;
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
  int64_t first_step_ms = 0;      // the first step after it ended
  int64_t restored_step = 0;      // the committed step restored
  int64_t lost_steps = 0;         // steps done past it, done again
  bool received_state = false;    // from a survivor (a standby's view)
};

struct RunResult {
  int64_t final_step = 0;
  int world_size = 0;
  int slot = 0;
  int64_t generation = 0;
  std::vector<RecoveryRecord> recoveries;
  int64_t snapshots = 0;
  int64_t snapshots_skipped = 0;  // the previous one was not committed yet
  // Step time of the steps that count (those rolled back are dropped),
  // carried across recoveries, and the wall time from the first step's
  // start to the last step's end.
  int64_t productive_ms = 0;
  int64_t wall_ms = 0;
};

class Runtime {
 public:
  // Joins the controller (waiting up to join_timeout) and validates the
  // fault list. A standby returns at once; Run() parks it until it is
  // given a slot. InvalidArgument for bad options or faults (naming them),
  // Unauthenticated for a wrong token, Unavailable if no controller
  // answers.
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(
      RuntimeOptions options = {});
  // Leaves the job (as finished if Run completed).
  virtual ~Runtime() = default;

  // ---- State --------------------------------------------------------------
  // Registers `bytes` bytes at `data` (host memory, valid for the runtime's
  // life) under a unique non-empty name. Every slot registers the same
  // names and sizes in the same order (checked at each restore).
  virtual absl::Status RegisterState(const std::string& name, void* data,
                                     size_t bytes) = 0;

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
  // Copies the registered state into the host snapshot of `step`, and acks
  // it to the controller. Returns false if skipped: the older buffer still
  // holds a step that may yet commit.
  virtual absl::StatusOr<bool> Snapshot(int64_t step) = 0;
  // Full recovery after `cause`; returns the restored step (the loop goes
  // on at restored + 1).
  virtual absl::StatusOr<int64_t> Recover(const absl::Status& cause) = 0;
  // Sends a step report (at each step's end).
  virtual void ReportStep(int64_t step, absl::Duration step_time,
                          const std::map<std::string, double>& metrics) = 0;
  // Leaves the job; `finished` after the last step.
  virtual void Leave(bool finished) = 0;
};

// True for the statuses a holdfast call returns when a peer, the group or
// the controller failed (Unavailable, DeadlineExceeded, Aborted): Run
// recovers from these and passes any other error of the step function on.
bool IsRecoverable(const absl::Status& status);

}  // namespace holdfast

#endif  // HOLDFAST_RUNTIME_H_
