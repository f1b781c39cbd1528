#include "src/runtime/runtime_impl.h"

#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "holdfast/clock.h"
#include "holdfast/status.h"
#include "src/backend/backend.h"
#include "src/common/config.h"
#include "src/common/logging.h"
#include "src/control/wire/auth.h"
#include "src/fault/fault.h"
#include "src/store/keys.h"

namespace holdfast {
namespace {

// Waits until the pipe whose read end is `fd` ends (its writer closed it),
// up to `timeout` (RuntimeOptions::start_gate_fd), then closes it.
absl::Status AwaitGate(int fd, absl::Duration timeout) {
  struct stat st;
  const bool open = fstat(fd, &st) == 0;
  if (!open || !S_ISFIFO(st.st_mode)) {
    HOLDFAST_LOG_WARN(
        "runtime: HOLDFAST_START_GATE_FD={} is not an open pipe ({}); "
        "joining at once",
        fd, open ? "another kind of file" : std::strerror(errno));
    return absl::OkStatus();
  }
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  bool told = false;
  absl::Status s;
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      s = absl::DeadlineExceededError(absl::StrCat(
          "Runtime: the launcher did not let this worker join within ",
          absl::FormatDuration(timeout),
          " (HOLDFAST_START_GATE_FD: it waits for the node's standbys to "
          "register)"));
      break;
    }
    pollfd p{fd, POLLIN, 0};
    const int rc = poll(&p, 1,
                        static_cast<int>(absl::ToInt64Milliseconds(
                            std::min(left, absl::Seconds(1)))) +
                            1);
    if (rc < 0 && errno != EINTR) break;
    if (rc > 0) {
      char byte;
      const ssize_t n = read(fd, &byte, 1);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;
      continue;  // a byte, or a signal: the gate opens at the end
    }
    if (!told && absl::Now() - start >= absl::Seconds(1)) {
      told = true;
      HOLDFAST_LOG_INFO(
          "runtime: waiting for the launcher to let this worker join (its "
          "node's standbys are registering)");
    }
  }
  close(fd);
  return s;
}

// AwaitGate, and then HOLDFAST_START_GATE_FD is removed from the
// environment if it names `fd` (as sd_listen_fds does with LISTEN_FDS):
// the descriptor is closed, and its number may name another file later.
absl::Status AwaitStartGate(int fd, absl::Duration timeout) {
  absl::Status s = AwaitGate(fd, timeout);
  const std::optional<int> env = defaults::StartGateFd();
  if (env.has_value() && *env == fd) unsetenv("HOLDFAST_START_GATE_FD");
  return s;
}

}  // namespace

RuntimeImpl::~RuntimeImpl() {
  Leave(finished_);
  aborts_.Stop();
  injector_->SetClaim(nullptr);
  injector_->SetRelease(nullptr);
  injector_->SetCommitted(nullptr);
}

absl::Status RuntimeImpl::Init() {
  snapshots_.SetKeep(options_.keep_snapshots);
  if (!options_.faults.empty()) {
    HOLDFAST_RETURN_IF_ERROR(injector_->Configure(options_.faults));
  }
  if (options_.start_gate_fd.has_value()) {
    HOLDFAST_RETURN_IF_ERROR(
        AwaitStartGate(*options_.start_gate_fd, options_.join_timeout));
  }
  control::ClientOptions client;
  client.address = options_.controller;
  client.token = options_.token;
  HOLDFAST_ASSIGN_OR_RETURN(client.tls, control::LoadTls(options_.tls));
  HOLDFAST_ASSIGN_OR_RETURN(store_, control::ControllerStore::Connect(client));
  control::MemberOptions mo;
  mo.client = client;
  mo.host = options_.host;
  mo.topology_block = options_.topology_block;
  mo.connect_timeout = options_.join_timeout;
  mo.preferred_slot = options_.preferred_slot;
  control::MemberCallbacks cb;
  cb.on_membership = [this](const MembershipUpdate& u) { OnMembership(u); };
  cb.on_abort = [this](const control::AbortOrder& a) {
    aborts_.Queue(a.generation(), absl::StrCat("controller: ", a.reason()));
  };
  cb.on_committed = [this](int64_t c) { gens_.NoteCommitted(c); };
  cb.on_fenced = [this](const absl::Status& s) {
    gens_.Fence(s);
    snapshots_.EndGeneration(INT64_MAX);
    gens_.Abort(INT64_MAX, absl::StrCat("fenced: ", s.message()));
  };
  cb.on_job_end = [this](const JobEnd& e) {
    gens_.EndJob(e);
    snapshots_.EndGeneration(INT64_MAX);
    if (e.state() != control::JOB_FINISHED) {
      gens_.Abort(INT64_MAX, absl::StrCat("the job stopped: ", e.reason()));
    }
  };
  cb.collective_in_progress = [this] { return CollectiveInProgress(gens_); };
  HOLDFAST_ASSIGN_OR_RETURN(member_,
                            control::MemberClient::Join(mo, std::move(cb)));
  const control::Assignment a = member_->assignment();
  gens_.Join(a);
  reporter_ = std::make_unique<StepReporter>(&gens_, member_.get(),
                                             PauseClock::Process());
  comms_ = std::make_unique<CommSet>(
      options_, store_, &gens_, &snapshots_, faults_,
      [member = member_.get()](int64_t gen) { member->AtRendezvous(gen); });
  HOLDFAST_LOG_INFO(
      "runtime: member {} ({}) joined as {} (generation {}, world {})",
      a.member_id, options_.host,
      a.standby ? std::string("standby") : absl::StrCat("slot ", a.slot),
      a.generation, a.world_size);
  // Each fault fires once per job: the first process to claim it in the
  // controller's store fires it.
  std::shared_ptr<control::ControllerStore> store = store_;
  const uint64_t id = a.member_id;
  injector_->SetClaim([store, id](const fault::FaultSpec& f) {
    auto r = store->CompareAndSet(keys::FaultClaim(f.index), "", true,
                                  absl::StrCat(id));
    return r.ok() && r->first;
  });
  // An injected stall ends once this member has no job to go on with.
  injector_->SetRelease([this] { return !gens_.Stopped().ok(); });
  injector_->SetCommitted([this] { return committed_step(); });
  recovery_ =
      std::make_unique<Recovery>(&options_, &gens_, member_.get(), store_,
                                 faults_, static_cast<Recovery::Member*>(this));
  backups_ = std::make_unique<BackupPipeline>(
      static_cast<BackupPipeline::Member*>(this), &snapshots_, &state_,
      &piece_io_, faults_,
      BackupPipeline::Options{options_.checkpoint_dir,
                              options_.checkpoint_every});
  backups_->Start();
  return absl::OkStatus();
}

absl::Status RuntimeImpl::RegisterState(const std::string& name, void* data,
                                        size_t bytes) {
  HOLDFAST_RETURN_IF_ERROR(RegistrationOpen(name));
  return state_.AddReplicated(name, data, bytes);
}

absl::StatusOr<ShardView> RuntimeImpl::RegisterShardedState(
    const std::string& name, size_t global_bytes, size_t unit_bytes) {
  HOLDFAST_RETURN_IF_ERROR(RegistrationOpen(name));
  const View v = gens_.Current();
  return state_.AddSharded(name, global_bytes, unit_bytes,
                           v.standby ? 0 : v.world, v.slot);
}

absl::StatusOr<ShardView> RuntimeImpl::Shard(const std::string& name) {
  return state_.Shard(name);
}

bool RuntimeImpl::standby() const { return gens_.Current().standby; }

int RuntimeImpl::slot() const { return gens_.Current().slot; }

int RuntimeImpl::world_size() const { return gens_.Current().world; }

int64_t RuntimeImpl::generation() const { return gens_.Current().generation; }

int64_t RuntimeImpl::committed_step() const { return gens_.committed(); }

absl::Status RuntimeImpl::AwaitCommit(int64_t step, absl::Duration timeout) {
  if (gens_.AwaitCommitted(step, absl::Now() + timeout))
    return absl::OkStatus();
  HOLDFAST_RETURN_IF_ERROR(gens_.Stopped());
  const bool moved = gens_.Moved();
  const absl::Status health = gens_.CommHealth();
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

absl::StatusOr<Communicator*> RuntimeImpl::communicator() {
  if (Communicator* c = gens_.CurrentHealthyComm()) return c;
  HOLDFAST_RETURN_IF_ERROR(comms_->Build());
  return gens_.Comm();
}

absl::StatusOr<int64_t> RuntimeImpl::AwaitComms() {
  HOLDFAST_RETURN_IF_ERROR(comms_->AwaitComm());
  return absl::ToUnixMillis(comms_->comm_up());
}

void RuntimeImpl::Leave(bool finished) {
  if (left_) return;
  left_ = true;
  // Stop the backup thread first. An idle one just exits; one inside a
  // round (peers that stopped snapshotting leave it waiting) is freed by
  // aborting the side communicator.
  const bool busy = snapshots_.Stop();
  // The waits that end when the pipeline stops (AwaitRoundEnd, a
  // rendezvous abandoned) look again.
  gens_.Wake();
  if (busy) gens_.Abort(INT64_MAX, "this member left the job");
  if (backups_ != nullptr) backups_->Join();
  GenerationView::Comms comms = gens_.TakeAll();
  comms.comm.reset();  // quietly: leaving is no failure
  comms.side.reset();
  if (member_ != nullptr) member_->Leave(finished);
}

absl::StatusOr<bool> RuntimeImpl::Snapshot(int64_t step) {
  return TakeSnapshot(step, /*defer=*/false);
}

absl::StatusOr<bool> RuntimeImpl::TakeSnapshot(int64_t step, bool defer) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Snapshot: step ", step, " is negative"));
  }
  const View v = gens_.Current();
  if (v.standby || v.slot < 0) {
    return absl::FailedPreconditionError(
        "Snapshot: a standby has no state to snapshot");
  }
  const int64_t comm_gen = gens_.CommGeneration();
  if (comm_gen < 0) {
    return absl::FailedPreconditionError(
        "Snapshot: no communicator yet (call communicator() first)");
  }
  if (comm_gen != v.generation) {
    return absl::AbortedError(
        absl::StrCat("Snapshot: generation ", v.generation,
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
  std::unique_ptr<Piece> p =
      snapshots_.NewPiece(step, comm_gen, v.world, v.slot, /*checksum=*/0);
  p->ledger = progress_.ledger;
  HOLDFAST_RETURN_IF_ERROR(snapshots_.Queue(std::move(p), defer));
  return true;
}

void RuntimeImpl::ReportEarlyWrite(absl::string_view what) {
  snapshots_.ReportEarlyWrite(what);
}

absl::Status RuntimeImpl::RegistrationOpen(const std::string& name) const {
  if (started_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "RegisterState('", name, "'): state is registered before Run"));
  }
  return absl::OkStatus();
}

bool IsRecoverable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kAborted;
}

namespace {

// The one check of the options (their defaults came from the environment
// when they were made): each value out of range is refused by name; the
// token is read from its file.
absl::Status CheckOptions(RuntimeOptions* o) {
  if (o->controller.empty()) {
    return absl::InvalidArgumentError(
        "Runtime: no controller address: set HOLDFAST_CONTROLLER=host:port "
        "(holdfast-run sets it) or RuntimeOptions::controller");
  }
  if (!o->token_file.empty() || o->token.empty()) {
    HOLDFAST_ASSIGN_OR_RETURN(o->token, control::LoadToken(o->token_file));
  }
  if (absl::Status linked = backend::CheckLinked(o->comm.backend);
      !linked.ok()) {
    return absl::Status(
        linked.code(),
        absl::StrCat("Runtime: ", linked.message(), " (HOLDFAST_BACKEND)"));
  }
  auto refuse = [](absl::string_view field, const auto& value,
                   absl::string_view want) {
    return absl::InvalidArgumentError(
        absl::StrCat("Runtime: RuntimeOptions::", field, " is ", value,
                     "; it must be ", want));
  };
  if (o->join_timeout <= absl::ZeroDuration()) {
    return refuse("join_timeout", absl::FormatDuration(o->join_timeout), "> 0");
  }
  if (o->report_grace < absl::ZeroDuration()) {
    return refuse("report_grace", absl::FormatDuration(o->report_grace),
                  ">= 0");
  }
  if (o->recovery_timeout <= absl::ZeroDuration()) {
    return refuse("recovery_timeout", absl::FormatDuration(o->recovery_timeout),
                  "> 0");
  }
  if (o->preferred_slot.has_value() && *o->preferred_slot < -1) {
    return refuse("preferred_slot", *o->preferred_slot,
                  "a slot (>= 0) or -1 (standby)");
  }
  if (o->start_gate_fd.has_value() && *o->start_gate_fd < 0) {
    return refuse("start_gate_fd", *o->start_gate_fd,
                  "a file descriptor (>= 0)");
  }
  if (o->replicas < 1 || o->replicas > 64) {
    return refuse("replicas", o->replicas, "1 to 64");
  }
  if (o->tp_size < 1) return refuse("tp_size", o->tp_size, ">= 1");
  if (o->pp_size < 1) return refuse("pp_size", o->pp_size, ">= 1");
  if (o->checkpoint_every < 1) {
    return refuse("checkpoint_every", o->checkpoint_every, ">= 1");
  }
  if (o->keep_snapshots < config::kMinKeepSnapshots ||
      o->keep_snapshots > config::kMaxKeepSnapshots) {
    return refuse("keep_snapshots", o->keep_snapshots,
                  absl::StrCat(config::kMinKeepSnapshots, " to ",
                               config::kMaxKeepSnapshots,
                               " (the newest committed snapshot may already "
                               "be poisoned when a numeric anomaly shows; "
                               "HOLDFAST_KEEP_SNAPSHOTS sets the default)"));
  }
  if (o->max_step_retries < 0) {
    return refuse("max_step_retries", o->max_step_retries,
                  ">= 0 (0: no limit)");
  }
  if (o->host.empty()) {
    return refuse("host", "empty", "a label of this machine");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create() {
  return Create(RuntimeOptions());
}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(
    RuntimeOptions options) {
  HOLDFAST_RETURN_IF_ERROR(config::Validate());
  config::ApplyMutexMode();
  HOLDFAST_RETURN_IF_ERROR(CheckOptions(&options));
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

namespace testing {

BackupStats BackupStatsOf(const Runtime& runtime) {
  const auto* impl = dynamic_cast<const RuntimeImpl*>(&runtime);
  return impl != nullptr ? impl->backup_stats() : BackupStats();
}

}  // namespace testing
}  // namespace holdfast
