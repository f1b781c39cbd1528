#include "holdfast/runtime.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "holdfast/status.h"
#include "src/common/config.h"
#include "src/common/logging.h"
#include "src/control/auth.h"
#include "src/control/client.h"
#include "src/control/member.h"
#include "src/fault/fault.h"
#include "src/runtime/report.h"

namespace holdfast {
namespace {

using control::JobEnd;
using control::MembershipUpdate;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// Point-to-point transfers of the state go in chunks, so one op stays well
// inside its deadline and the receiver's progress is visible in the trace.
constexpr size_t kChunkBytes = size_t{64} << 20;
constexpr uint32_t kRestoreTag = 0x5e570;

// A rendezvous store that gives up as soon as `cancelled` says so (a newer
// generation opened, the member was fenced, the job ended), instead of
// waiting out the whole connect timeout for a peer that will never come.
class CancellableStore final : public Store {
 public:
  CancellableStore(std::shared_ptr<Store> base,
                   std::function<std::optional<std::string>()> cancelled)
      : base_(std::move(base)), cancelled_(std::move(cancelled)) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override {
    return base_->Set(key, value);
  }
  absl::StatusOr<std::optional<std::string>> TryGet(
      absl::string_view key) override {
    return base_->TryGet(key);
  }
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override {
    std::string value;
    absl::Status s = Sliced(timeout, [&](absl::Duration slice) {
      absl::StatusOr<std::string> v = base_->Get(key, slice);
      if (v.ok()) value = *std::move(v);
      return v.status();
    });
    if (!s.ok()) return s;
    return value;
  }
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override {
    return Sliced(timeout, [&](absl::Duration slice) {
      return base_->Wait(keys, slice);
    });
  }

 private:
  static constexpr absl::Duration kSlice = absl::Milliseconds(100);

  // Runs `wait` (a wait on the base store) in slices of at most kSlice
  // until it ends other than by its own deadline, `timeout` passes, or the
  // rendezvous is cancelled.
  template <typename F>
  absl::Status Sliced(absl::Duration timeout, F wait) {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      if (auto why = cancelled_()) return absl::AbortedError(*why);
      const absl::Duration left = deadline - absl::Now();
      absl::Status s = wait(std::min(left, kSlice));
      if (s.code() != absl::StatusCode::kDeadlineExceeded || left <= kSlice) {
        return s;
      }
    }
  }

  const std::shared_ptr<Store> base_;
  const std::function<std::optional<std::string>()> cancelled_;
};

struct StateBuffer {
  std::string name;
  uint8_t* data;
  size_t bytes;
};

// One host snapshot of the whole registered state.
struct Snap {
  int64_t step = -1;  // -1: empty
  std::unique_ptr<uint8_t[]> bytes;
};

class RuntimeImpl final : public Runtime {
 public:
  explicit RuntimeImpl(RuntimeOptions o) : options_(std::move(o)) {}

  ~RuntimeImpl() override {
    Leave(finished_);
    {
      absl::MutexLock lock(&ack_mu_);
      ack_stop_ = true;
    }
    if (ack_thread_.joinable()) ack_thread_.join();
    fault::Injector::Global().SetClaim(nullptr);
  }

  absl::Status Init() {
    if (options_.recovery_timeout <= absl::ZeroDuration()) {
      options_.recovery_timeout =
          absl::Milliseconds(config::IntParam("HOLDFAST_RECOVERY_TIMEOUT_MS"));
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
    control::MemberCallbacks cb;
    cb.on_membership = [this](const MembershipUpdate& u) { OnMembership(u); };
    cb.on_abort = [this](const control::AbortOrder& a) {
      AbortComm(a.generation(), absl::StrCat("controller: ", a.reason()));
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
        "runtime: member {} joined as {} (generation {}, world "
        "{})",
        a.member_id,
        a.standby ? std::string("standby") : absl::StrCat("slot ", a.slot),
        a.generation, a.world_size);
    // Each fault fires once per job: the first process to claim it in the
    // controller's store fires it.
    std::shared_ptr<control::ControllerStore> store = store_;
    const uint64_t id = a.member_id;
    fault::Injector::Global().SetClaim([store, id](const fault::FaultSpec& f) {
      auto r = store->CompareAndSet(absl::StrCat("holdfast/faults/", f.index),
                                    "", true, absl::StrCat(id));
      return r.ok() && r->first;
    });
    ack_thread_ = std::thread([this] { AckLoop(); });
    return absl::OkStatus();
  }

  // ---- State ----------------------------------------------------------------

  absl::Status RegisterState(const std::string& name, void* data,
                             size_t bytes) override {
    if (name.empty() || (data == nullptr && bytes > 0)) {
      return absl::InvalidArgumentError(
          "RegisterState: the name must be non-empty and the data non-null");
    }
    if (started_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "RegisterState('", name, "'): state is registered before Run"));
    }
    for (const StateBuffer& b : buffers_) {
      if (b.name == name) {
        return absl::InvalidArgumentError(
            absl::StrCat("RegisterState: '", name, "' is registered twice"));
      }
    }
    buffers_.push_back({name, static_cast<uint8_t*>(data), bytes});
    return absl::OkStatus();
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

  void ReportStep(int64_t step, absl::Duration step_time,
                  const std::map<std::string, double>& metrics) override {
    (void)member_->ReportStep(step, step_time, metrics);
  }

  void Leave(bool finished) override {
    if (left_) return;
    left_ = true;
    {
      absl::MutexLock lock(&mu_);
      comm_.reset();
    }
    if (member_ != nullptr) member_->Leave(finished);
  }

  // ---- Snapshots
  // --------------------------------------------------------------

  absl::StatusOr<bool> Snapshot(int64_t step) override {
    if (step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Snapshot: step ", step, " is negative"));
    }
    EnsureSnapshots();
    // Keep the newest snapshot that is committed. The other buffer may be
    // overwritten once what it holds is committed-and-superseded (or
    // empty). If it holds a step that may still commit, wait for that
    // commit: every slot acked it right after taking it, so it is normally
    // in flight. Skipping instead would leave slots holding different steps
    // and nothing would ever commit.
    const absl::Time deadline = absl::Now() + options_.commit_wait;
    int target = -1;
    for (;;) {
      const int64_t committed = committed_step();
      int keep = -1;
      for (int i = 0; i < 2; ++i) {
        if (snaps_[i].step >= 0 && snaps_[i].step <= committed &&
            (keep < 0 || snaps_[i].step > snaps_[keep].step)) {
          keep = i;
        }
      }
      target = keep >= 0 ? 1 - keep : snaps_[0].step < snaps_[1].step ? 0 : 1;
      if (snaps_[target].step <= committed) break;
      if (!AwaitCommitted(snaps_[target].step, deadline)) {
        ++snapshots_skipped_;
        HOLDFAST_LOG_WARN(
            "runtime: snapshot of step {} skipped: step {} is not committed "
            "after {}",
            step, snaps_[target].step,
            absl::FormatDuration(options_.commit_wait));
        return false;
      }
    }
    snaps_[target].step = -1;  // torn until the copy completes
    uint8_t* out = snaps_[target].bytes.get();
    for (const StateBuffer& b : buffers_) {
      if (b.bytes > 0) std::memcpy(out, b.data, b.bytes);
      out += b.bytes;
    }
    snaps_[target].step = step;
    ++snapshots_;
    if (!standby()) {
      absl::MutexLock lock(&ack_mu_);
      ack_step_ = step;
      ack_generation_ = CommGeneration();
    }
    return true;
  }

  // ---- Recovery
  // ---------------------------------------------------------------

  absl::StatusOr<int64_t> Recover(const absl::Status& cause) override {
    RecoveryRecord rec;
    rec.cause = std::string(cause.message());
    rec.seen_ms = NowMs();
    int64_t failed = CommGeneration();
    rec.failed_generation = failed;
    AbortComm(INT64_MAX, absl::StrCat("recovering: ", cause.message()));
    rec.aborted_ms = NowMs();
    member_->SetPhase(control::PHASE_RECOVERING, 0);
    HOLDFAST_LOG_WARN("runtime: slot {} recovering from generation {}: {}",
                      slot(), failed, std::string(cause.message()));
    const absl::Time deadline = absl::Now() + options_.recovery_timeout;
    ++recoveries_;
    bool fault_point = true;
    std::string last_error = rec.cause;
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
        absl::StatusOr<bool> r = member_->ReportFailure(-1, last_error);
        if (!r.ok() &&
            r.status().code() != absl::StatusCode::kFailedPrecondition) {
          HOLDFAST_LOG_WARN("runtime: reporting the failure: {}",
                            std::string(r.status().message()));
        }
        AwaitGeneration(failed, deadline);
        continue;
      }
      HOLDFAST_RETURN_IF_ERROR(Terminal());
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
      if (s.ok()) {
        rec.rebuilt_ms = NowMs();
        absl::StatusOr<int64_t> restored = Restore(&rec.received_state);
        if (restored.ok()) {
          rec.restored_ms = NowMs();
          rec.generation = v.generation;
          rec.restored_step = *restored;
          rec.lost_steps = lost_steps_;
          pending_record_ = rec;
          HOLDFAST_LOG_INFO(
              "runtime: slot {} of {} recovered at generation {}: step {} "
              "restored{} in {} ms",
              v.slot, v.world, v.generation, *restored,
              rec.received_state ? " (state received)" : "",
              rec.restored_ms - rec.seen_ms);
          return *restored;
        }
        s = restored.status();
        if (!IsRecoverable(s) && CommHealthy()) return s;
      }
      last_error = std::string(s.message());
      HOLDFAST_LOG_WARN("runtime: generation {} failed during recovery: {}",
                        v.generation, last_error);
      AbortComm(INT64_MAX, last_error);
      failed = v.generation;
    }
  }

  // ---- The loop
  // ---------------------------------------------------------------

  absl::StatusOr<RunResult> Run(
      std::function<absl::Status(const StepContext&)> step_fn,
      const RunOptions& options) override {
    if (started_) {
      return absl::FailedPreconditionError("Run: called twice");
    }
    if (options.steps < 0 || options.snapshot_every < 1 || !step_fn) {
      return absl::InvalidArgumentError(
          "Run: steps must be >= 0, snapshot_every >= 1 and step_fn set");
    }
    // The runtime's own ledger travels with the state, so the productive
    // time survives a rollback (and reaches a standby that takes over):
    // [0] the first step's start (Unix ms), [s] step s's duration (us).
    ledger_.assign(static_cast<size_t>(options.steps) + 1, 0);
    HOLDFAST_RETURN_IF_ERROR(RegisterState("holdfast/ledger", ledger_.data(),
                                           ledger_.size() * sizeof(int64_t)));
    started_ = true;
    // Step 0: the state as every slot starts.
    HOLDFAST_ASSIGN_OR_RETURN(bool taken, Snapshot(0));
    (void)taken;
    RunResult result;
    HOLDFAST_RETURN_IF_ERROR(AwaitSlot());

    int64_t step;
    {
      const View v = CurrentView();
      if (v.generation > 0) {
        // Joining a running job (a standby taking a slot): its first
        // recovery, for fault injection.
        fault::Injector::Global().AtRecovery(v.slot, ++recoveries_);
      }
      absl::Status s = BuildComm();
      absl::StatusOr<int64_t> restored =
          s.ok() ? Restore(nullptr) : absl::StatusOr<int64_t>(s);
      if (!restored.ok()) {
        if (!IsRecoverable(restored.status()) && CommHealthy()) {
          return restored.status();
        }
        restored = Recover(restored.status());
        if (!restored.ok()) return restored.status();
      }
      step = *restored + 1;
    }
    while (step <= options.steps) {
      const View v = CurrentView();
      fault::Injector::Global().AtStep(v.slot, step);
      member_->SetPhase(control::PHASE_COMPUTING, 0);
      const absl::Time t0 = absl::Now();
      absl::Status s;
      Communicator* comm = nullptr;
      {
        absl::MutexLock lock(&mu_);
        comm = comm_.get();
      }
      if (comm == nullptr) {
        s = absl::AbortedError("no communicator");
      } else {
        StepContext ctx;
        ctx.step = step;
        ctx.rank = v.slot;
        ctx.world_size = v.world;
        ctx.generation = v.generation;
        ctx.comm = comm;
        s = step_fn(ctx);
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
        absl::StatusOr<int64_t> restored = Recover(s);
        if (!restored.ok()) return restored.status();
        step = *restored + 1;
        continue;
      }
      const absl::Time t1 = absl::Now();
      if (pending_record_.has_value()) {
        // The first training step after the recovery is done (its
        // snapshot is the loop's usual per-step work).
        pending_record_->first_step_ms = absl::ToUnixMillis(t1);
      }
      if (step == 1) ledger_[0] = absl::ToUnixMillis(t0);
      ledger_[static_cast<size_t>(step)] = absl::ToInt64Microseconds(t1 - t0);
      high_step_ = std::max(high_step_, step);
      if (step % options.snapshot_every == 0 || step == options.steps) {
        member_->SetPhase(control::PHASE_CHECKPOINTING, 0);
        HOLDFAST_ASSIGN_OR_RETURN(bool snapped, Snapshot(step));
        (void)snapped;
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
    const View v = CurrentView();
    result.final_step = options.steps;
    result.world_size = v.world;
    result.slot = v.slot;
    result.generation = v.generation;
    result.recoveries = recovery_records_;
    result.snapshots = snapshots_;
    result.snapshots_skipped = snapshots_skipped_;
    int64_t us = 0;
    for (size_t s = 1; s < ledger_.size(); ++s) us += ledger_[s];
    result.productive_ms = us / 1000;
    result.wall_ms = options.steps > 0 ? NowMs() - ledger_[0] : 0;
    if (v.slot == 0) PublishFinal(result);
    finished_ = true;
    Leave(true);
    return result;
  }

 private:
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

  // Aborts the communicator if its generation is <= `upto`.
  void AbortComm(int64_t upto, absl::string_view reason) {
    absl::MutexLock lock(&mu_);
    if (comm_ != nullptr && comm_generation_ <= upto) comm_->Abort(reason);
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
  // communicator fails meanwhile.
  bool AwaitCommitted(int64_t step, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return committed_ >= step || view_.generation > comm_generation_ ||
             !fenced_.ok() || job_end_.has_value() ||
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
      return view_.generation > failed || !fenced_.ok() || job_end_.has_value();
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
        return !view_.standby || !fenced_.ok() || job_end_.has_value();
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
    auto cancelled = [this, gen]() -> std::optional<std::string> {
      absl::MutexLock lock(&mu_);
      if (view_.generation > gen) {
        return absl::StrCat("rendezvous of generation ", gen,
                            " abandoned: generation ", view_.generation,
                            " opened");
      }
      if (!fenced_.ok()) return std::string("fenced");
      if (job_end_.has_value()) return std::string("the job ended");
      return std::nullopt;
    };
    CommunicatorOptions o = options_.comm;
    o.rank = v.slot;
    o.size = v.world;
    o.generation = gen;
    absl::StatusOr<std::unique_ptr<Communicator>> c = Communicator::Create(
        std::make_shared<CancellableStore>(store_, cancelled), o);
    if (!c.ok()) {
      if (auto why = cancelled()) return absl::AbortedError(*why);
      return c.status();
    }
    std::shared_ptr<Communicator> comm(std::move(*c));
    absl::MutexLock lock(&mu_);
    comm_ = comm;
    comm_generation_ = gen;
    // An order that arrived while building applies now.
    if (view_.generation > gen) comm_->Abort("a newer generation opened");
    return absl::OkStatus();
  }

  // Rolls every slot back to the newest committed step some member holds;
  // members without it receive it from the lowest slot that has it.
  // `received`: set when this member received the state.
  absl::StatusOr<int64_t> Restore(bool* received) {
    Communicator* comm;
    {
      absl::MutexLock lock(&mu_);
      comm = comm_.get();
    }
    const View v = CurrentView();
    size_t total = 0;
    uint64_t layout = 0;
    for (const StateBuffer& b : buffers_) {
      total += b.bytes;
      layout =
          XXH3_64bits_withSeed(b.name.data(), b.name.size(), layout) ^ b.bytes;
    }
    const int64_t target_here = std::max<int64_t>(0, committed_step());
    // Every slot: [the step it would restore, the highest step it reached,
    // total bytes, layout hash].
    const int64_t mine[4] = {target_here, high_step_,
                             static_cast<int64_t>(total),
                             static_cast<int64_t>(layout)};
    std::vector<int64_t> all(static_cast<size_t>(v.world) * 4);
    // Two rounds: agree on the target, then on who holds it.
    HOLDFAST_RETURN_IF_ERROR(
        comm->AllGather(mine, all.data(), 4, DataType::kInt64)->Wait());
    int64_t target = 0;
    int64_t high = 0;
    for (int r = 0; r < v.world; ++r) {
      const int64_t* e = &all[static_cast<size_t>(r) * 4];
      if (e[2] != mine[2] || e[3] != mine[3]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "registered state differs between slots: slot ", r, " has ", e[2],
            " bytes (layout hash ", static_cast<uint64_t>(e[3]), "), slot ",
            v.slot, " has ", total, " (", layout,
            "); every slot must register the same names and sizes"));
      }
      target = std::max(target, e[0]);
      high = std::max(high, e[1]);
    }
    lost_steps_ = std::max<int64_t>(0, high - target);
    int held = -1;
    for (int i = 0; i < 2; ++i) {
      if (snaps_[i].step == target) held = i;
    }
    int64_t have = held >= 0 ? 1 : 0;
    std::vector<int64_t> haves(static_cast<size_t>(v.world));
    HOLDFAST_RETURN_IF_ERROR(
        comm->AllGather(&have, haves.data(), 1, DataType::kInt64)->Wait());
    int root = -1;
    for (int r = 0; r < v.world && root < 0; ++r) {
      if (haves[static_cast<size_t>(r)] != 0) root = r;
    }
    if (root < 0) {
      return absl::DataLossError(
          absl::StrCat("no member of generation ", v.generation,
                       " holds the committed snapshot of step ", target,
                       "; the state cannot be restored"));
    }
    // Snapshots past the target belong to a timeline that was abandoned.
    for (Snap& s : snaps_) {
      if (s.step > target) s.step = -1;
    }
    if (held < 0) {
      // Receive into a free buffer (the one not holding anything useful).
      held = snaps_[0].step < 0 ? 0 : 1;
      snaps_[held].step = -1;
      uint8_t* dst = snaps_[held].bytes.get();
      for (size_t off = 0; off < total; off += kChunkBytes) {
        const size_t n = std::min(kChunkBytes, total - off);
        OpOptions oo;
        oo.tag = kRestoreTag;
        HOLDFAST_RETURN_IF_ERROR(
            comm->Recv(dst + off, n, DataType::kUInt8, root, oo)->Wait());
      }
      snaps_[held].step = target;
      if (received != nullptr) *received = true;
    } else if (v.slot == root) {
      const uint8_t* src = snaps_[held].bytes.get();
      std::vector<std::shared_ptr<Work>> sends;
      for (int r = 0; r < v.world; ++r) {
        if (haves[static_cast<size_t>(r)] != 0) continue;
        for (size_t off = 0; off < total; off += kChunkBytes) {
          const size_t n = std::min(kChunkBytes, total - off);
          OpOptions oo;
          oo.tag = kRestoreTag;
          sends.push_back(comm->Send(src + off, n, DataType::kUInt8, r, oo));
        }
      }
      for (auto& w : sends) HOLDFAST_RETURN_IF_ERROR(w->Wait());
    }
    const uint8_t* src = snaps_[held].bytes.get();
    for (const StateBuffer& b : buffers_) {
      if (b.bytes > 0) std::memcpy(b.data, src, b.bytes);
      src += b.bytes;
    }
    high_step_ = std::max(high_step_, target);
    return target;
  }

  void EnsureSnapshots() {
    if (snaps_[0].bytes != nullptr) return;
    size_t total = 0;
    for (const StateBuffer& b : buffers_) total += b.bytes;
    for (Snap& s : snaps_) {
      s.bytes.reset(new uint8_t[std::max<size_t>(1, total)]);
    }
  }

  // Sends the newest snapshot ack; the controller commits a step once every
  // slot acked it.
  void AckLoop() {
    int64_t sent = -1;
    int64_t sent_gen = -1;
    for (;;) {
      int64_t step, gen;
      {
        absl::MutexLock lock(&ack_mu_);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ack_mu_) {
          return ack_stop_ || ack_step_ != sent || ack_generation_ != sent_gen;
        };
        ack_mu_.Await(absl::Condition(&ready));
        if (ack_stop_) return;
        step = ack_step_;
        gen = ack_generation_;
      }
      sent = step;
      sent_gen = gen;
      if (gen < 0) continue;
      absl::StatusOr<int64_t> c = member_->AckCheckpoint(step, gen);
      if (c.ok()) NoteCommitted(*c);
    }
  }

  void PublishRecovery(const RecoveryRecord& r) {
    // Every member that recovered offers its record; the first one kept
    // (they differ by a few milliseconds) speaks for the generation.
    nlohmann::json j = ToJson(r);
    (void)store_->CompareAndSet(absl::StrCat(kRecoveryPrefix, r.generation), "",
                                true, j.dump());
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
    if (ledger_.size() > 1) {
      j["first_step_done_unix_ms"] = ledger_[0] + ledger_[1] / 1000;
    }
    (void)store_->Set(kFinalKey, j.dump());
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

  // The training thread's own.
  std::vector<StateBuffer> buffers_;
  Snap snaps_[2];
  std::vector<int64_t> ledger_;
  bool started_ = false;
  bool finished_ = false;
  bool left_ = false;
  int recoveries_ = 0;
  int64_t high_step_ = 0;
  int64_t lost_steps_ = 0;
  int64_t snapshots_ = 0;
  int64_t snapshots_skipped_ = 0;
  std::optional<RecoveryRecord> pending_record_;
  std::vector<RecoveryRecord> recovery_records_;

  absl::Mutex ack_mu_;
  int64_t ack_step_ ABSL_GUARDED_BY(ack_mu_) = -1;
  int64_t ack_generation_ ABSL_GUARDED_BY(ack_mu_) = -1;
  bool ack_stop_ ABSL_GUARDED_BY(ack_mu_) = false;
  std::thread ack_thread_;
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
  if (options.join_timeout <= absl::ZeroDuration() ||
      options.report_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "Runtime: join_timeout must be > 0 and report_grace >= 0");
  }
  auto rt = std::make_unique<RuntimeImpl>(std::move(options));
  HOLDFAST_RETURN_IF_ERROR(rt->Init());
  return std::unique_ptr<Runtime>(std::move(rt));
}

}  // namespace holdfast
