#include "src/runtime/runtime_impl.h"

#include <algorithm>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "holdfast/clock.h"
#include "holdfast/status.h"
#include "holdfast/trace.h"
#include "src/common/logging.h"
#include "src/fault/hooks.h"
#include "src/store/keys.h"

namespace holdfast {
namespace {

// A fresh job's workers start at one step (RunOptions::start_step).
absl::Status SameStartStep(Communicator* host, int world, int slot,
                           int64_t step) {
  std::vector<int64_t> all(static_cast<size_t>(world));
  HOLDFAST_RETURN_IF_ERROR(
      host->AllGather(&step, all.data(), 1, DataType::kInt64)->Wait());
  for (int r = 0; r < world; ++r) {
    if (all[static_cast<size_t>(r)] != step) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Run: start_step differs between the workers: ", step, " on slot ",
          slot, ", ", all[static_cast<size_t>(r)], " on slot ", r,
          " (a fresh job's workers start from one checkpoint)"));
    }
  }
  return absl::OkStatus();
}

// What `comm` did for the step [t0, t1] of `generation`: the operations
// issued in it, when the first was issued and the last done (ms into the
// step), and the longest. For the first step after a restore: whether its
// time went to the communicator (a new one's connections, say) or before
// its first operation (the trainer's own rebuild and compute).
std::string StepOps(Communicator* comm, int64_t generation, absl::Time t0,
                    absl::Time t1) {
  if (comm == nullptr) return "";
  // The trace's clock (monotonic) at t0 and t1.
  const int64_t now = MonotonicNanos();
  const absl::Time abs_now = absl::Now();
  const int64_t start = now - absl::ToInt64Nanoseconds(abs_now - t0);
  const int64_t end = now - absl::ToInt64Nanoseconds(abs_now - t1);
  int n = 0;
  int64_t first = 0, last = 0, longest = -1;
  TraceRecord slow;
  for (const TraceRecord& r : comm->TraceSnapshot()) {
    if (r.generation != generation || r.enqueued_ns < start ||
        r.enqueued_ns > end) {
      continue;
    }
    const int64_t done = r.ended_ns > 0 ? r.ended_ns : end;
    first = n++ == 0 ? r.enqueued_ns : std::min(first, r.enqueued_ns);
    last = std::max(last, done);
    if (done - r.enqueued_ns > longest) {
      longest = done - r.enqueued_ns;
      slow = r;
    }
  }
  if (n == 0) return "; no operation of the training communicator in it";
  constexpr int64_t kMs = 1000000;
  const absl::string_view op = OpTypeName(slow.op);
  const bool vowel =
      !op.empty() && absl::string_view("aeiou").find(
                         absl::ascii_tolower(op[0])) != absl::string_view::npos;
  return absl::StrCat("; ", n, " operation", n == 1 ? "" : "s",
                      " of the training communicator in it, the first issued ",
                      (first - start) / kMs, " ms into it, the last done at ",
                      (last - start) / kMs, " ms, the longest ",
                      vowel ? "an " : "a ", op, " of ", slow.bytes, " bytes (",
                      longest / kMs, " ms)");
}

}  // namespace

absl::StatusOr<RunResult> RuntimeImpl::Run(
    std::function<absl::Status(const StepContext&)> step_fn,
    const RunOptions& options) {
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

absl::Status RuntimeImpl::CheckRunOptions(const RunOptions& options,
                                          bool has_step_fn) const {
  if (options.start_step < 0 || options.start_step > options.steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("Run: start_step is ", options.start_step,
                     "; it is 0 to steps (", options.steps, ")"));
  }
  if (options.steps < 0 || options.snapshot_every < 1 || !has_step_fn) {
    return absl::InvalidArgumentError(
        "Run: steps must be >= 0, snapshot_every >= 1 and step_fn set");
  }
  for (const auto& [begin, end] : options.skip_data) {
    if (begin < 0 || end <= begin) {
      return absl::InvalidArgumentError(
          absl::StrCat("Run: skip_data range [", begin, ", ", end,
                       ") is not a non-empty range of positions >= 0"));
    }
  }
  if (!options.skip_data.empty() && data_position_ == nullptr) {
    return absl::FailedPreconditionError(
        "Run: skip_data needs a data position "
        "(Runtime::RegisterDataPosition)");
  }
  if (options.numerics.spike_factor < 0 || options.numerics.spike_window < 1 ||
      options.numerics.spike_warmup < 1) {
    return absl::InvalidArgumentError(
        "Run: numerics.spike_factor must be >= 0 (0: off), spike_window and "
        "spike_warmup >= 1");
  }
  if (options.numerics.replica_check_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Run: numerics.replica_check_every is ",
        options.numerics.replica_check_every, "; it must be >= 0 (0: off)"));
  }
  return absl::OkStatus();
}

absl::Status RuntimeImpl::Begin(Loop* loop, const RunOptions& options) {
  HOLDFAST_RETURN_IF_ERROR(AwaitSlot(options));
  start_step_ = options.start_step;
  absl::StatusOr<int64_t> started = Start(options.start_step);
  if (started.ok()) return ResumeAt(loop, options, *started);
  if (!IsRecoverable(started.status()) && gens_.CommHealth().ok()) {
    return started.status();
  }
  return RecoverInLoop(loop, options, started.status());
}

absl::Status RuntimeImpl::RunSteps(
    Loop* loop, const std::function<absl::Status(const StepContext&)>& step_fn,
    const RunOptions& options) {
  while (loop->step <= options.steps) {
    const absl::Time t0 = absl::Now();
    bool fenced = false;  // the step called BeginStateUpdate()
    absl::Status fatal;
    absl::Status s = CallStep(step_fn, options, loop->step, &fenced, &fatal);
    HOLDFAST_RETURN_IF_ERROR(fatal);
    if (!s.ok()) {
      if (!IsRecoverable(s) && gens_.CommHealth().ok() &&
          s.code() != absl::StatusCode::kFailedPrecondition) {
        return s;
      }
      // A trainer that fences its writes and failed before this
      // step's fence left its state as the last step did.
      if (fenced || !fences_) progress_.live_step = -1;
      HOLDFAST_RETURN_IF_ERROR(RecoverInLoop(loop, options, s));
      continue;
    }
    s = CompleteStep(options, loop->step, t0, fenced);
    if (!s.ok()) {
      if (!IsRecoverable(s)) return s;
      HOLDFAST_RETURN_IF_ERROR(RecoverInLoop(loop, options, s));
      continue;
    }
    ++loop->step;
  }
  return absl::OkStatus();
}

absl::StatusOr<RunResult> RuntimeImpl::RunLoop(
    std::function<absl::Status(const StepContext&)> step_fn,
    const RunOptions& options) {
  if (started_) {
    return absl::FailedPreconditionError("Run: called twice");
  }
  HOLDFAST_RETURN_IF_ERROR(CheckRunOptions(options, step_fn != nullptr));
  run_skip_ = options.skip_data;
  state_.SetReadyWait(options.state_ready);
  started_ = true;
  Loop loop;
  HOLDFAST_RETURN_IF_ERROR(Begin(&loop, options));
  for (;;) {
    HOLDFAST_RETURN_IF_ERROR(RunSteps(&loop, step_fn, options));
    // Let the last backup round finish (its peers are in it too) before
    // leaving, so nobody sees this member vanish from under a transfer.
    finishing_ = true;
    FinishBackups(options.steps, absl::Now() + std::max(options_.commit_wait,
                                                        absl::Seconds(10)));
    // A generation opened meanwhile (a peer or the side communicator failed
    // during the last steps) includes this member: leaving now would leave
    // the others waiting for it in the rendezvous. Take part, redo what
    // was not committed, and finish with them.
    if (!gens_.Moved() || !gens_.Stopped().ok()) break;
    finishing_ = false;
    HOLDFAST_RETURN_IF_ERROR(RecoverInLoop(
        &loop, options,
        absl::AbortedError(
            "a new generation was opened while this member was finishing")));
  }
  const RunResult result = Result(options);
  PublishFinalState(result.slot);
  if (result.slot == 0) PublishFinal(result);
  finished_ = true;
  Leave(true);
  return result;
}

absl::Status RuntimeImpl::ResumeAt(Loop* loop, const RunOptions& options,
                                   int64_t restored) {
  SkipData();
  const absl::Time t0 = absl::Now();
  if (options.on_restore) {
    HOLDFAST_RETURN_IF_ERROR(options.on_restore(restored));
  }
  resumed_ = Resumed{t0, absl::Now() - t0};
  loop->step = restored + 1;
  return absl::OkStatus();
}

absl::Status RuntimeImpl::RecoverInLoop(Loop* loop, const RunOptions& options,
                                        const absl::Status& cause) {
  if (progress_.high_step > loop->stuck_at) {
    loop->stuck_at = progress_.high_step;
    loop->stuck = 0;
  }
  if (options_.max_step_retries > 0 &&
      ++loop->stuck > options_.max_step_retries) {
    HOLDFAST_LOG_ERROR(
        "runtime: slot {} gives up: {} recoveries in a row and no step "
        "after step {} completed; the failure repeats: {}",
        slot(), options_.max_step_retries, loop->stuck_at,
        std::string(cause.message()));
    return absl::Status(
        cause.code(),
        absl::StrCat("no step after step ", loop->stuck_at, " completed in ",
                     options_.max_step_retries,
                     " recoveries in a row (HOLDFAST_MAX_STEP_RETRIES), "
                     "so the failure repeats each time the steps are "
                     "redone; the last one: ",
                     cause.message()));
  }
  HOLDFAST_ASSIGN_OR_RETURN(RecoveryRecord rec, recovery_->Run(cause));
  pending_record_ = rec;
  return ResumeAt(loop, options, rec.restored_step);
}

absl::Status RuntimeImpl::CallStep(
    const std::function<absl::Status(const StepContext&)>& step_fn,
    const RunOptions& options, int64_t step, bool* fenced,
    absl::Status* fatal) {
  const View v = gens_.Current();
  step_now_ = step;
  numerics_.BeginStep(data_position_ != nullptr ? *data_position_ : 0);
  faults_->AtStep(v.slot, step);
  member_->SetPhase(control::PHASE_COMPUTING, 0);
  Communicator* comm = gens_.Comm();
  if (comm == nullptr) return absl::AbortedError("no communicator");
  StepContext ctx;
  ctx.step = step;
  ctx.slot = v.slot;
  ctx.world_size = v.world;
  ctx.generation = v.generation;
  ctx.comm = comm;
  ctx.runtime = this;
  snapshots_.TakeFenceSeen();
  absl::Status s = step_fn(ctx);
  std::string early;  // what the step wrote before its fence
  *fenced = snapshots_.TakeFenceSeen(&early);
  if (snapshots_.DropUnfenced() && s.ok()) {
    const std::string what =
        absl::StrCat(early.empty() ? std::string(" returned without calling")
                                   : absl::StrCat(" wrote registered state (",
                                                  early, ") before it called"),
                     " Runtime::BeginStateUpdate() (Python: "
                     "runtime.begin_state_update())");
    if (options.snapshot_copy == SnapshotCopy::kDuringNextStep) {
      *fatal = absl::FailedPreconditionError(absl::StrCat(
          "RunOptions::snapshot_copy is kDuringNextStep and step ", step, what,
          ", which every step must call before it writes registered "
          "state; the snapshot of step ",
          step - 1, " may be torn and was dropped"));
      return *fatal;
    }
    // kAuto: the step before fenced its writes and this one did not, or
    // too late. Its snapshot was dropped; the next is copied between the
    // steps (fenced is false).
    if (snapshots_unfenced_++ == 0) {
      HOLDFAST_LOG_WARN(
          "runtime: slot {}: step {}{}; step {} had called it, so its "
          "snapshot was copied during step {}, may be torn, and was dropped "
          "(once per run: RunResult::snapshots_unfenced counts them); call "
          "it in every step before its first write to registered state, or "
          "set RunOptions::snapshot_copy to kBetweenSteps",
          v.slot, step, what, step - 1, step);
    }
  }
  // A step that finished while its generation was being replaced may not
  // have finished everywhere: it is redone after the rollback.
  if (s.ok()) s = gens_.Stopped();
  if (s.ok()) s = AwaitLease(step);
  if (s.ok() && (!gens_.CommHealth().ok() || gens_.Moved())) {
    s = gens_.CommHealth();
    if (s.ok()) s = absl::AbortedError("a new generation was opened");
  }
  return s;
}

void RuntimeImpl::NoteResumed(absl::Time t0, absl::Time t1) {
  if (!resumed_.has_value()) return;
  // Where a (re)start's time goes after the restore, on every member (a
  // standby's first step included): the trainer's hook, then the step.
  HOLDFAST_LOG_INFO(
      "runtime: slot {} (generation {}): after the restore, on_restore "
      "took {} ms and the first step {} ms (done {} ms after the "
      "restore){}",
      slot(), gens_.Current().generation,
      absl::ToInt64Milliseconds(resumed_->on_restore),
      absl::ToInt64Milliseconds(t1 - t0),
      absl::ToInt64Milliseconds(t1 - resumed_->at),
      StepOps(gens_.Comm(), gens_.Current().generation, t0, t1));
  resumed_.reset();
}

absl::Status RuntimeImpl::CompleteStep(const RunOptions& options, int64_t step,
                                       absl::Time t0, bool fenced) {
  fences_ = fences_ || fenced;
  progress_.live_step = step;
  const absl::Time t1 = absl::Now();
  NoteResumed(t0, t1);
  if (pending_record_.has_value()) {
    // The first training step after the recovery is done (its snapshot is
    // the loop's usual per-step work).
    pending_record_->first_step_ms = absl::ToUnixMillis(t1);
  }
  if (step == 1) {
    progress_.ledger[0] = absl::ToUnixMillis(t0);
    progress_.ledger[2] = absl::ToInt64Microseconds(t1 - t0);
  }
  progress_.ledger[1] += absl::ToInt64Microseconds(t1 - t0);
  progress_.high_step = std::max(progress_.high_step, step);
  std::map<std::string, double> metrics =
      options.metrics ? options.metrics() : std::map<std::string, double>{};
  if (auto loss = metrics.find("loss");
      loss != metrics.end() &&
      faults_->FiresAt(fault::Kind::kSpike, slot(), step)) {
    loss->second *= 1000;
    HOLDFAST_LOG_WARN("runtime: slot {}: loss spike at step {} (injected)",
                      slot(), step);
  }
  const int64_t data_end = data_position_ != nullptr ? *data_position_ : -1;
  const std::optional<double> norm = numerics_.TakeLocalNorm();
  // A step whose numbers are not sane is not snapshotted: the job rolls
  // back past it.
  if (std::optional<control::Anomaly> a = numerics_.Check(
          options.numerics, step, options_.keep_snapshots, data_end, metrics)) {
    if (norm.has_value() && !a->local()) a->set_local_norm(*norm);
    return ReportAnomaly(*a);
  }
  if (norm.has_value()) {
    // Before the snapshot: its ack reaches the controller after the norm.
    control::LocalNorm n;
    n.set_step(step);
    n.set_norm(*norm);
    n.set_keep_snapshots(options_.keep_snapshots);
    *n.mutable_data() = numerics_.StepData(data_end);
    member_->NoteLocalNorm(gens_.CommGeneration(), n);
  }
  SkipData();
  if (step % options.snapshot_every == 0 || step == options.steps) {
    member_->SetPhase(control::PHASE_CHECKPOINTING, 0);
    InjectBitflip(step);
    if (step == options.steps) {
      // Every slot snapshots the last step, waiting for its previous
      // backup if need be, so the last round is the same everywhere and
      // commits: nobody leaves while a peer waits for it in one.
      snapshots_.AwaitIdle(absl::Now() + options_.commit_wait);
    }
    // A snapshot with a replica check is copied between the steps, and
    // hashed after its copy: it holds nothing the hash did not see (one
    // copied during the next step could take in a bit flipped after the
    // check, and a rollback to it would restore the flip everywhere).
    const bool check = ReplicaCheckDue(options, step);
    const bool defer =
        step < options.steps && !check &&
        (options.snapshot_copy == SnapshotCopy::kDuringNextStep ||
         (options.snapshot_copy == SnapshotCopy::kAuto && fenced));
    HOLDFAST_RETURN_IF_ERROR(TakeSnapshot(step, defer).status());
    if (check) {
      member_->NoteReplicaCheck(gens_.CommGeneration(), step, state_.LiveHash(),
                                options_.keep_snapshots);
    }
  }
  reporter_->Report(step, t0, t1, metrics);
  KeepRecoveryRecord();
  return absl::OkStatus();
}

void RuntimeImpl::KeepRecoveryRecord() {
  if (!pending_record_.has_value()) return;
  recovery_records_.push_back(*pending_record_);
  PublishRecovery(*pending_record_);
  pending_record_.reset();
}

void RuntimeImpl::InjectBitflip(int64_t step) {
  if (!faults_->FiresAt(fault::Kind::kBitflip, slot(), step)) return;
  for (const checkpoint::StateBuffer& b : state_.buffers()) {
    if (b.sharded || b.global == 0) continue;
    b.data[b.global / 2] ^= 1;
    HOLDFAST_LOG_WARN(
        "runtime: slot {}: a bit of '{}' flipped after step {} (injected)",
        slot(), b.name, step);
    return;
  }
}

bool RuntimeImpl::ReplicaCheckDue(const RunOptions& options,
                                  int64_t step) const {
  const int every = options.numerics.replica_check_every;
  return every > 0 && replicas_comparable_ &&
         (step / options.snapshot_every) % every == 0;
}

RunResult RuntimeImpl::Result(const RunOptions& options) {
  const View v = gens_.Current();
  RunResult result;
  result.final_step = options.steps;
  result.world_size = v.world;
  result.slot = v.slot;
  result.generation = v.generation;
  // A recovery that restored the last step has no step after it
  // (first_step_ms stays 0).
  KeepRecoveryRecord();
  result.recoveries = recovery_records_;
  result.skipped_data = SkippedData();
  result.snapshots = snapshots_taken_;
  result.snapshots_skipped = snapshots_skipped_;
  result.snapshots_unfenced = snapshots_unfenced_;
  result.productive_ms = progress_.ledger[1] / 1000;
  result.wall_ms = options.steps > 0 && progress_.ledger[0] > 0
                       ? NowMs() - progress_.ledger[0]
                       : 0;
  const testing::BackupStats b = snapshots_.stats();
  result.snapshots_overlapped = snapshots_.overlapped();
  result.backups = b.rounds;
  result.backup_bytes = b.bytes;
  result.backup_ms = b.round_us / 1000;
  result.disk_writes = b.disk_writes;
  return result;
}

absl::StatusOr<int64_t> RuntimeImpl::Start(int64_t fresh_step) {
  const View v = gens_.Current();
  if (v.generation > 0) {
    // Joining a running job is a recovery: the controller does not hold
    // this member's step 0 against it while the state comes in, and it
    // is this member's first recovery for fault injection.
    member_->SetPhase(control::PHASE_RECOVERING, 0);
    faults_->AtRecovery(v.slot, recovery_->Count());
  }
  // A communicator of this generation built before Run (communicator(),
  // or a torch.distributed call outside a step) is used as it is: a
  // second rendezvous of the same generation would meet the first one's
  // addresses in the store. Else the state comes in while the training
  // communicator is built, where the runtime's exchanges do not need it
  // (CommSet::Build), and it is awaited whatever the outcome.
  if (gens_.CurrentHealthyComm() == nullptr) {
    HOLDFAST_RETURN_IF_ERROR(comms_->Build(/*defer=*/true));
  }
  absl::StatusOr<int64_t> at = StartState(v, fresh_step);
  const absl::Status up = comms_->AwaitComm();
  HOLDFAST_RETURN_IF_ERROR(at.status());
  HOLDFAST_RETURN_IF_ERROR(up);
  return at;
}

absl::StatusOr<int64_t> RuntimeImpl::StartState(const View& v,
                                                int64_t fresh_step) {
  if (v.generation > 0 || committed_step() >= 0) {
    const absl::Time t0 = absl::Now();
    RecoveryRecord rec;
    HOLDFAST_ASSIGN_OR_RETURN(const int64_t at, Restore(&rec));
    HOLDFAST_LOG_INFO(
        "runtime: slot {} of {} joined at generation {}: step {} restored "
        "({}) in {} ms",
        v.slot, v.world, v.generation, at, Received(rec),
        absl::ToInt64Milliseconds(absl::Now() - t0));
    return at;
  }
  return FreshStart(v, fresh_step);
}

absl::StatusOr<int64_t> RuntimeImpl::FreshStart(const View& v,
                                                int64_t fresh_step) {
  int64_t at = 0;
  bool resumed = false;  // from the disk tier
  if (!options_.checkpoint_dir.empty()) {
    HOLDFAST_ASSIGN_OR_RETURN(Communicator * host, gens_.HostComm());
    HOLDFAST_ASSIGN_OR_RETURN(const std::optional<checkpoint::Restored> d,
                              NewRestore(host, v).FromDisk(/*required=*/false));
    if (d.has_value()) {
      NoteRestored(*d, nullptr);
      resumed = true;
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
  if (!resumed) {
    HOLDFAST_ASSIGN_OR_RETURN(Communicator * host, gens_.HostComm());
    HOLDFAST_RETURN_IF_ERROR(SameStartStep(host, v.world, v.slot, fresh_step));
    at = fresh_step;
    HOLDFAST_RETURN_IF_ERROR(checkpoint::CheckReplicatedEqual(
        host, v.world, v.slot, state_, &replicas_comparable_));
  }
  progress_.high_step = std::max(progress_.high_step, at);
  progress_.live_step = at;
  HOLDFAST_ASSIGN_OR_RETURN(bool taken, Snapshot(at));
  if (!taken ||
      !gens_.AwaitCommitted(at, absl::Now() + options_.recovery_timeout)) {
    HOLDFAST_RETURN_IF_ERROR(gens_.Stopped());
    absl::Status s = gens_.CommHealth();
    return s.ok() ? absl::AbortedError(absl::StrCat("the starting state (step ",
                                                    at, ") was not committed"))
                  : s;
  }
  return at;
}

void RuntimeImpl::FinishBackups(int64_t last, absl::Time deadline) {
  while (absl::Now() < deadline && committed_step() < last &&
         gens_.Stopped().ok() && !gens_.Moved()) {
    const bool idle = snapshots_.AwaitIdle(
        std::min(deadline, absl::Now() + absl::Milliseconds(50)));
    if (committed_step() >= last) return;
    if (idle && !Snapshot(last).ok()) return;
  }
}

}  // namespace holdfast
