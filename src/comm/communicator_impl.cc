#include "src/comm/communicator_impl.h"

#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <system_error>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "holdfast/status.h"
#include "src/common/config.h"
#include "src/common/logging.h"
#include "src/common/op_text.h"
#include "src/common/status_util.h"
#include "src/fault/hooks.h"
#include "src/store/keys.h"
#include "src/store/store_util.h"

namespace holdfast {
namespace comm {
namespace {

// Grace given to the transport's own time limit beyond the op deadline: the
// watchdog acts first; the transport limit only backs it up.
constexpr absl::Duration kTransportGrace = absl::Seconds(5);

// The most an idle communicator's destruction waits for its goodbyes to the
// peers to be sent (Backend::Close); they are a few bytes each.
constexpr absl::Duration kCloseTimeout = absl::Milliseconds(500);

// How long the worker leaves a fresh op at the head of the queue for the
// thread that issued it to claim in Wait() (see RunInline). Two thread
// hand-offs per op cost more than this on a busy host; an op issued
// asynchronously starts at most this much later, and only the first of a
// burst (the rest queue behind a running op anyway).
constexpr absl::Duration kInlineGrace = absl::Microseconds(200);

// How long after an abort an op may stay inside the transport before its
// waiters are released regardless (see ReleaseStuckLocked).
constexpr absl::Duration kReleaseAfter = absl::Milliseconds(100);

// The matching tag: operations that differ in kind, size, type, reduction,
// root or position never share a tag, so Gloo never pairs their messages.
uint32_t MatchTag(const backend::OpSpec& spec, int64_t match_seq,
                  uint32_t user_tag) {
  // Send and Recv must hash alike; their peers differ by construction.
  const bool p2p = !IsCollective(spec.type);
  const bool reduces =
      spec.type == OpType::kAllReduce || spec.type == OpType::kReduceScatter;
  // Explicit words: no padding bytes may reach the hash.
  const uint64_t key[5] = {
      static_cast<uint64_t>(match_seq),
      static_cast<uint64_t>(spec.count),
      static_cast<uint64_t>(static_cast<int64_t>(
          spec.type == OpType::kBroadcast ? spec.peer : -1)),
      uint64_t{user_tag},
      uint64_t{p2p ? 0xffu : static_cast<uint8_t>(spec.type)} |
          uint64_t{static_cast<uint8_t>(spec.dtype)} << 8 |
          uint64_t{reduces ? static_cast<uint8_t>(spec.reduce) : 0u} << 16,
  };
  return static_cast<uint32_t>(XXH3_64bits(&key, sizeof(key)));
}

}  // namespace

CommunicatorImpl::CommunicatorImpl(const CommunicatorOptions& options,
                                   std::shared_ptr<Store> store,
                                   std::unique_ptr<backend::Backend> backend,
                                   std::shared_ptr<fault::Hooks> faults)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      real_clock_(clock_ == Clock::Real()),
      store_(std::move(store)),
      backend_(std::move(backend)),
      faults_(std::move(faults)),
      ring_(options.trace_capacity),
      runner_handle_(std::make_shared<RunnerHandle>()) {
  {
    absl::MutexLock lock(&runner_handle_->mu);
    runner_handle_->runner = this;
  }
  try {
    worker_ = std::thread([this] { WorkerLoop(); });
    p2p_thread_ = std::thread([this] { P2PLoop(); });
    watchdog_ = std::thread([this] { WatchdogLoop(); });
  } catch (const std::system_error&) {
    // One could not start: stop the ones that did (a joinable thread's
    // destructor would std::terminate) and let Create report it.
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread* t : {&worker_, &p2p_thread_, &watchdog_}) {
      if (t->joinable()) t->join();
    }
    throw;
  }
}

CommunicatorImpl::~CommunicatorImpl() {
  bool orderly;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    // Done with the group and nothing pending: the peers are told this rank
    // left, so ops of theirs that no longer need it go on.
    orderly =
        !aborted_ && queue_.empty() && running_ == nullptr && p2p_.empty();
    if (!aborted_) {
      aborted_ = true;
      abort_status_ = absl::AbortedError("communicator destroyed");
    }
    for (auto& q : queue_) {
      FinishLocked(q.get(),
                   absl::AbortedError(absl::StrCat(
                       Describe(q->record), ": communicator destroyed")));
    }
    queue_.clear();
    if (running_ && !running_->forced.has_value()) {
      running_->forced = absl::AbortedError(
          absl::StrCat(Describe(running_->record), ": communicator destroyed"));
    }
    for (auto& p : p2p_) {
      if (!p->forced.has_value()) {
        p->forced = absl::AbortedError(
            absl::StrCat(Describe(p->record), ": communicator destroyed"));
      }
    }
  }
  // Unblocks the worker if it is inside the transport. Quiet: destroying a
  // communicator is not a failure, so no notice and no trace dump.
  if (orderly) {
    backend_->Close(kCloseTimeout);
  } else {
    backend_->Abort("communicator destroyed");
  }
  {
    // Waits for threads running an op inline (the abort above ends it).
    absl::MutexLock lock(&runner_handle_->mu);
    runner_handle_->runner = nullptr;
  }
  worker_.join();
  p2p_thread_.join();
  watchdog_.join();
}

namespace {

bool Reduces(OpType type) {
  return type == OpType::kAllReduce || type == OpType::kReduceScatter;
}

// count * size * element size must fit, and the buffers the op reads and
// writes must be there.
absl::Status CheckBuffers(const backend::OpSpec& spec, int size) {
  const size_t esize = DataTypeSize(spec.dtype);
  const bool blocked = spec.type == OpType::kAllGather ||
                       spec.type == OpType::kReduceScatter ||
                       spec.type == OpType::kAllToAll;
  const size_t blocks = blocked ? static_cast<size_t>(size) : 1;
  if (spec.count > SIZE_MAX / esize / blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("count ", spec.count, " overflows the buffer size"));
  }
  if (spec.type == OpType::kBarrier || spec.count == 0) {
    return absl::OkStatus();
  }
  const bool needs_send = blocked || spec.type == OpType::kSend;
  if (needs_send && spec.send == nullptr) {
    return absl::InvalidArgumentError("send buffer is null");
  }
  if (spec.type != OpType::kSend && spec.recv == nullptr) {
    return absl::InvalidArgumentError(needs_send ? "receive buffer is null"
                                                 : "buffer is null");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CommunicatorImpl::Validate(const backend::OpSpec& spec) const {
  if (DataTypeSize(spec.dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported dtype ", static_cast<int>(spec.dtype)));
  }
  if (Reduces(spec.type) && static_cast<int>(spec.reduce) >= kNumReduceOps) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported reduction ", static_cast<int>(spec.reduce)));
  }
  if (Reduces(spec.type) && spec.dtype == DataType::kBool &&
      spec.reduce == ReduceOp::kAverage) {
    return absl::InvalidArgumentError("an average of bool is not defined");
  }
  const bool peer_out = spec.peer < 0 || spec.peer >= options_.size;
  if (spec.type == OpType::kBroadcast && peer_out) {
    return absl::InvalidArgumentError(absl::StrCat(
        "root ", spec.peer, " is out of range [0, ", options_.size, ")"));
  }
  if (!IsCollective(spec.type) && peer_out) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer ", spec.peer, " is out of range [0, ", options_.size, ")"));
  }
  if (!IsCollective(spec.type) && spec.peer == options_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer ", spec.peer, " is this rank itself"));
  }
  return CheckBuffers(spec, options_.size);
}

std::shared_ptr<Work> CommunicatorImpl::RefuseLocked(const TraceRecord& r,
                                                     const absl::Status& valid,
                                                     const OpOptions& options) {
  // Refused calls are traced too, but take no matching position.
  ring_.Begin(r);
  if (!valid.ok()) {
    ring_.Transition(r.seq, OpState::kFailed, r.enqueued_ns,
                     static_cast<int32_t>(valid.code()));
    return WorkImpl::Done(r.seq, Annotate(valid, Describe(r)),
                          options.on_queued);
  }
  ring_.Transition(r.seq, OpState::kAborted, r.enqueued_ns,
                   static_cast<int32_t>(absl::StatusCode::kAborted));
  return WorkImpl::Done(r.seq,
                        absl::AbortedError(absl::StrCat(
                            Describe(r), ": communicator already aborted: ",
                            abort_status_.message())),
                        options.on_queued);
}

int64_t CommunicatorImpl::MatchLocked(backend::OpSpec& spec, TraceRecord& r,
                                      const OpOptions& options) {
  if (spec.type == OpType::kSend) return sends_to_[{spec.peer, options.tag}]++;
  if (!IsCollective(spec.type)) return recvs_from_[{spec.peer, options.tag}]++;
  const int64_t match_seq = next_coll_seq_++;
  if (faults_ != nullptr && faults_->MismatchAt(options_.rank, match_seq)) {
    // An injected mismatch: a Barrier goes where the peers' call goes.
    spec = backend::OpSpec{};
    spec.type = OpType::kBarrier;
    r.op = OpType::kBarrier;
    r.count = 0;
    r.bytes = 0;
  }
  return match_seq;
}

void CommunicatorImpl::PostLocked(const std::shared_ptr<Pending>& p) {
  // Posting never blocks; doing it under mu_ keeps the per-peer order
  // equal to the numbering.
  if (p->spec.count > 0) {
    absl::StatusOr<std::unique_ptr<backend::PendingP2P>> posted =
        backend_->Post(p->spec);
    if (posted.ok()) {
      p->posted = std::move(*posted);
    } else {
      p->post_status = posted.status();
    }
  }
  ring_.Transition(p->record.seq, OpState::kStarted, Now());
  p2p_.push_back(p);
}

std::shared_ptr<Work> CommunicatorImpl::Submit(backend::OpSpec spec,
                                               uint64_t bytes,
                                               const OpOptions& options) {
  auto p = std::make_shared<Pending>();
  const absl::Status valid = Validate(spec);
  absl::MutexLock lock(&mu_);
  TraceRecord& r = p->record;
  r.seq = next_seq_++;
  r.generation = options_.generation;
  r.op = spec.type;
  r.dtype = spec.dtype;
  r.reduce = spec.reduce;
  r.peer = spec.peer;
  if (!IsCollective(spec.type)) r.tag = options.tag;
  r.count = spec.count;
  r.bytes = bytes;
  r.enqueued_ns = Now();
  if (!valid.ok() || aborted_) return RefuseLocked(r, valid, options);
  r.coll_seq = MatchLocked(spec, r, options);
  spec.tag = MatchTag(spec, r.coll_seq, options.tag);
  p->timeout = options.timeout > absl::ZeroDuration() ? options.timeout
                                                      : options_.timeout;
  spec.timeout = p->timeout + kTransportGrace;
  p->deadline_ns = r.enqueued_ns + absl::ToInt64Nanoseconds(p->timeout);
  p->issued_ns = real_clock_ ? r.enqueued_ns : MonotonicNanos();
  p->work = std::make_shared<WorkImpl>(
      r.seq, IsCollective(spec.type) ? runner_handle_ : nullptr);
  p->work->SetOnQueued(options.on_queued);
  spec.after_event = options.after_event;
  // The backend runs the op while p (and so its Work) is alive.
  if (options.on_queued) {
    spec.on_queued = [work = p->work.get()](void* stream) {
      work->Queued(stream);
    };
  }
  p->spec = spec;
  ring_.Begin(r);
  if (IsCollective(spec.type)) {
    queue_.push_back(p);
  } else {
    PostLocked(p);
  }
  return p->work;
}

void CommunicatorImpl::FinishLocked(Pending* p, const absl::Status& status) {
  if (!p->traced_final) {
    ring_.Transition(p->record.seq, FinalState(status), Now(),
                     static_cast<int32_t>(status.code()));
    p->traced_final = true;
  }
  p->work->Finish(status);
}

void CommunicatorImpl::WorkerLoop() {
  for (;;) {
    std::shared_ptr<Pending> p;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping
      // Leave a fresh op to its issuer for a moment (see kInlineGrace).
      std::shared_ptr<Pending> head = queue_.front();
      const absl::Duration age =
          absl::Nanoseconds(MonotonicNanos() - head->issued_ns);
      if (age < kInlineGrace) {
        auto claimed = [this, &head]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || queue_.empty() || queue_.front() != head;
        };
        mu_.AwaitWithTimeout(absl::Condition(&claimed), kInlineGrace - age);
        continue;  // re-examine the queue
      }
      if (running_ != nullptr) {
        // Running inline on a caller's thread; wait for it to finish.
        auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || running_ == nullptr;
        };
        mu_.Await(absl::Condition(&idle));
        continue;
      }
      p = queue_.front();
      queue_.pop_front();
      running_ = p;
      ring_.Transition(p->record.seq, OpState::kStarted, Now());
    }
    Execute(p);
  }
}

void CommunicatorImpl::RunInline(uint64_t seq) {
  std::shared_ptr<Pending> p;
  {
    absl::MutexLock lock(&mu_);
    if (stop_ || running_ != nullptr || queue_.empty() ||
        queue_.front()->record.seq != seq) {
      return;
    }
    p = queue_.front();
    queue_.pop_front();
    running_ = p;
    ring_.Transition(p->record.seq, OpState::kStarted, Now());
  }
  Execute(p);
}

void CommunicatorImpl::Execute(const std::shared_ptr<Pending>& p) {
  absl::Status result = absl::OkStatus();
  if (p->spec.count > 0 || p->spec.type == OpType::kBarrier) {
    // An injected failure (fail-op) stands for a transport error.
    if (faults_ != nullptr) {
      result = faults_->AtCollective(options_.rank, p->record.coll_seq);
    }
    if (result.ok()) result = backend_->Run(p->spec);
  }
  Complete(p, std::move(result));
}

void CommunicatorImpl::P2PLoop() {
  for (;;) {
    std::shared_ptr<Pending> p;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !p2p_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (p2p_.empty()) return;  // stopping
      p = p2p_.front();  // stays listed (for the watchdog) until complete
    }
    absl::Status result = p->post_status;
    if (result.ok() && p->posted != nullptr)
      result = backend_->Wait(*p->posted);
    Complete(p, std::move(result));
  }
}

void CommunicatorImpl::Complete(const std::shared_ptr<Pending>& p,
                                absl::Status result) {
  if (!result.ok()) {
    bool decided;
    {
      absl::MutexLock lock(&mu_);
      decided = p->forced.has_value() || aborted_;
    }
    if (!decided) {
      // A failure this rank saw first (typically a lost peer).
      AbortWith(ExplainFailure(result, p->record), p.get());
    }
  }
  absl::MutexLock lock(&mu_);
  if (running_ == p) running_ = nullptr;
  if (!p2p_.empty() && p2p_.front() == p) p2p_.pop_front();
  absl::Status final_status;
  if (p->forced.has_value()) {
    final_status = *p->forced;
  } else if (result.ok()) {
    final_status = absl::OkStatus();
  } else {
    final_status = Annotate(result, Describe(p->record));
  }
  FinishLocked(p.get(), final_status);
}

void CommunicatorImpl::ExpireLocked(WatchdogTick* tick) {
  const int64_t now = Now();
  std::shared_ptr<Pending> expired;
  if (running_ && running_->deadline_ns <= now) expired = running_;
  for (auto& q : p2p_) {
    if (expired == nullptr && q->deadline_ns <= now) expired = q;
  }
  for (auto& q : queue_) {
    if (expired == nullptr && q->deadline_ns <= now) expired = q;
  }
  if (expired == nullptr) return;
  const bool queued = IsCollective(expired->record.op) && expired != running_;
  const char* where = queued ? "never started: an earlier op held the queue"
                             : "still in progress";
  tick->cause = absl::DeadlineExceededError(
      absl::StrCat(Describe(expired->record), ": timed out after ",
                   absl::FormatDuration(expired->timeout), " (", where,
                   "); a peer may be frozen, slow or issuing a different op"));
  // A queued collective never started: nothing to compare.
  if (options_.size > 1 && !queued) {
    tick->timed_out = expired;
  } else {
    tick->began = BeginAbortLocked(tick->cause, expired.get(), &tick->finish);
  }
}

void CommunicatorImpl::ConfirmTimeout(WatchdogTick* tick) {
  tick->cause = DiagnoseTimeout(tick->timed_out->record, tick->cause);
  absl::MutexLock lock(&mu_);
  // Unless it finished (or something else aborted) meanwhile.
  if (running_ == tick->timed_out ||
      std::find(p2p_.begin(), p2p_.end(), tick->timed_out) != p2p_.end()) {
    tick->began =
        BeginAbortLocked(tick->cause, tick->timed_out.get(), &tick->finish);
  }
}

void CommunicatorImpl::CheckPeersOnce() {
  // A lost peer is normally reported by the op that talks to it; this
  // catches the ones the transport leaves waiting (see CheckPeers).
  absl::Status peers = backend_->CheckPeers();
  if (peers.ok()) return;
  std::optional<TraceRecord> running;
  {
    absl::MutexLock lock(&mu_);
    if (Pending* p = InProgressLocked()) running = p->record;
  }
  absl::Status cause = ExplainFailure(peers, running);
  std::vector<std::shared_ptr<Pending>> finish;
  bool began;
  {
    absl::MutexLock lock(&mu_);
    Pending* trigger = InProgressLocked();
    if (trigger != nullptr) {
      cause = Annotate(cause, Describe(trigger->record));
    }
    began = BeginAbortLocked(cause, trigger, &finish);
  }
  if (began) CompleteAbort(cause, std::move(finish));
}

void CommunicatorImpl::WatchdogLoop() {
  for (;;) {
    WatchdogTick tick;
    bool in_flight = false;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_),
                               options_.watchdog_interval)) {
        return;
      }
      if (aborted_) {
        ReleaseStuckLocked();
        continue;
      }
      in_flight = running_ != nullptr || !p2p_.empty();
      ExpireLocked(&tick);
    }
    if (tick.timed_out != nullptr) ConfirmTimeout(&tick);
    if (tick.began) {
      CompleteAbort(tick.cause, std::move(tick.finish));
      continue;
    }
    if (in_flight) CheckPeersOnce();
  }
}

CommunicatorImpl::Pending* CommunicatorImpl::InProgressLocked() const {
  return running_       ? running_.get()
         : p2p_.empty() ? nullptr
                        : p2p_.front().get();
}

void CommunicatorImpl::ReleaseStuckLocked() {
  // After an abort the transport normally lets go of an op within
  // milliseconds. If it has not after kReleaseAfter, its waiters are released
  // anyway: every connection is closed, so nothing writes its buffers any
  // more; only a thread still waiting inside the transport remains.
  if (MonotonicNanos() - abort_mono_ns_ <
      absl::ToInt64Nanoseconds(kReleaseAfter)) {
    return;
  }
  auto release = [&](Pending* p) {
    if (p->forced.has_value() && !p->work->IsCompleted()) {
      HOLDFAST_LOG_WARN(
          "rank {}: {} is still inside the transport {} after the abort; "
          "releasing its waiters",
          options_.rank, Describe(p->record),
          absl::FormatDuration(kReleaseAfter));
      p->work->Finish(*p->forced);
    }
  };
  if (running_) release(running_.get());
  for (auto& q : p2p_) release(q.get());
}

void CommunicatorImpl::Abort(absl::string_view reason) {
  AbortWith(absl::AbortedError(absl::StrCat(
                "rank ", options_.rank, " aborted the communicator: ", reason)),
            nullptr);
}

absl::Status CommunicatorImpl::health() const {
  absl::MutexLock lock(&mu_);
  return aborted_ ? abort_status_ : absl::OkStatus();
}

std::vector<TraceRecord> CommunicatorImpl::TraceSnapshot() const {
  return ring_.Snapshot();
}

std::string CommunicatorImpl::DumpTrace() const {
  std::string reason;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) reason = abort_status_.ToString();
  }
  return trace::ToJson(ring_.Snapshot(), options_.rank, options_.size,
                       options_.generation, Now(),
                       absl::ToUnixNanos(absl::Now()), reason);
}

// ---- operation entry points ------------------------------------------------

namespace {

backend::OpSpec Spec(OpType type, const void* send, void* recv, size_t count,
                     DataType dtype, ReduceOp reduce = ReduceOp::kSum,
                     int peer = -1) {
  backend::OpSpec s;
  s.type = type;
  s.send = send;
  s.recv = recv;
  s.count = count;
  s.dtype = dtype;
  s.reduce = reduce;
  s.peer = peer;
  return s;
}

}  // namespace

std::shared_ptr<Work> CommunicatorImpl::AllReduce(void* data, size_t count,
                                                  DataType dtype, ReduceOp op,
                                                  const OpOptions& options) {
  return Submit(Spec(OpType::kAllReduce, nullptr, data, count, dtype, op),
                count * DataTypeSize(dtype), options);
}

std::shared_ptr<Work> CommunicatorImpl::Broadcast(void* data, size_t count,
                                                  DataType dtype, int root,
                                                  const OpOptions& options) {
  return Submit(Spec(OpType::kBroadcast, nullptr, data, count, dtype,
                     ReduceOp::kSum, root),
                count * DataTypeSize(dtype), options);
}

std::shared_ptr<Work> CommunicatorImpl::AllGather(const void* send, void* recv,
                                                  size_t count, DataType dtype,
                                                  const OpOptions& options) {
  return Submit(Spec(OpType::kAllGather, send, recv, count, dtype),
                count * DataTypeSize(dtype) * options_.size, options);
}

std::shared_ptr<Work> CommunicatorImpl::ReduceScatter(
    const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
    const OpOptions& options) {
  return Submit(Spec(OpType::kReduceScatter, send, recv, count, dtype, op),
                count * DataTypeSize(dtype) * options_.size, options);
}

std::shared_ptr<Work> CommunicatorImpl::AllToAll(const void* send, void* recv,
                                                 size_t count, DataType dtype,
                                                 const OpOptions& options) {
  return Submit(Spec(OpType::kAllToAll, send, recv, count, dtype),
                count * DataTypeSize(dtype) * options_.size, options);
}

std::shared_ptr<Work> CommunicatorImpl::Barrier(const OpOptions& options) {
  return Submit(Spec(OpType::kBarrier, nullptr, nullptr, 0, DataType::kUInt8),
                0, options);
}

std::shared_ptr<Work> CommunicatorImpl::Send(const void* data, size_t count,
                                             DataType dtype, int peer,
                                             const OpOptions& options) {
  return Submit(
      Spec(OpType::kSend, data, nullptr, count, dtype, ReduceOp::kSum, peer),
      count * DataTypeSize(dtype), options);
}

std::shared_ptr<Work> CommunicatorImpl::Recv(void* data, size_t count,
                                             DataType dtype, int peer,
                                             const OpOptions& options) {
  return Submit(
      Spec(OpType::kRecv, nullptr, data, count, dtype, ReduceOp::kSum, peer),
      count * DataTypeSize(dtype), options);
}

}  // namespace comm

// ---- factory
// -----------------------------------------------------------------

namespace {

// A write to a socket whose peer has died raises SIGPIPE, whose default
// action kills the process: exactly the death-by-peer holdfast exists to
// prevent. Gloo writes with writev (no MSG_NOSIGNAL), so SIGPIPE is set to
// ignored, as gRPC does, unless the program installed a handler of its own.
// The write then fails with EPIPE, which becomes Unavailable.
void IgnoreSigpipe() {
  static const bool done = [] {
    struct sigaction current;
    if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
        current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
    return true;
  }();
  (void)done;
}

}  // namespace

namespace comm {

backend::BackendOptions ToBackendOptions(const CommunicatorOptions& options) {
  backend::BackendOptions bo;
  bo.rank = options.rank;
  bo.size = options.size;
  bo.generation = options.generation;
  bo.bind_address = options.bind_address;
  bo.interface = options.interface;
  bo.connect_timeout = options.connect_timeout;
  bo.device = options.device;
  bo.link_secret = options.link_secret;
  bo.cancelled = options.rendezvous_cancelled;
  return bo;
}

absl::StatusOr<std::unique_ptr<Communicator>> Create(
    std::shared_ptr<Store> store, const CommunicatorOptions& options,
    std::shared_ptr<fault::Hooks> faults) {
  HOLDFAST_RETURN_IF_ERROR(config::Validate());
  config::ApplyMutexMode();
  IgnoreSigpipe();
  if (store == nullptr) {
    return absl::InvalidArgumentError("Communicator::Create: store is null");
  }
  if (options.size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Communicator::Create: size must be >= 1, got ", options.size));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Communicator::Create: rank ", options.rank,
                     " is out of range [0, ", options.size, ")"));
  }
  if (options.generation < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Communicator::Create: generation must be >= 0, got ",
                     options.generation));
  }
  if (options.timeout <= absl::ZeroDuration() ||
      options.connect_timeout <= absl::ZeroDuration() ||
      options.watchdog_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "Communicator::Create: timeout, connect_timeout and "
        "watchdog_interval must be positive");
  }
  if (options.trace_capacity < 1) {
    return absl::InvalidArgumentError(
        "Communicator::Create: trace_capacity must be >= 1");
  }
  const backend::BackendOptions bo = comm::ToBackendOptions(options);
  // The backend's rendezvous waits on the store end when it is cancelled.
  std::shared_ptr<Store> rendezvous =
      options.rendezvous_cancelled
          ? NewCancellableStore(store, options.rendezvous_cancelled)
          : store;
  // A thread that cannot start (a pids limit) throws std::system_error:
  // reported, like every other failure, as a status.
  try {
    std::unique_ptr<backend::Backend> backend;
    if (options.backend == "gloo") {
      HOLDFAST_ASSIGN_OR_RETURN(backend,
                                backend::CreateGlooBackend(rendezvous, bo));
    } else if (options.backend == "nccl") {
      backend::BackendFactory nccl = backend::NcclFactory();
      if (nccl == nullptr) {
        return absl::FailedPreconditionError(
            "Communicator::Create: backend 'nccl' is not in this program: "
            "link holdfast_nccl (built when CMake finds CUDA and NCCL)");
      }
      HOLDFAST_ASSIGN_OR_RETURN(backend, nccl(rendezvous, bo));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("Communicator::Create: unknown backend '",
                       options.backend, "' (gloo or nccl)"));
    }
    return std::unique_ptr<Communicator>(new CommunicatorImpl(
        options, std::move(store), std::move(backend), std::move(faults)));
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "Communicator::Create: cannot start a thread: ", e.what()));
  }
}

}  // namespace comm

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Create(
    std::shared_ptr<Store> store, const CommunicatorOptions& options) {
  return comm::Create(std::move(store), options, nullptr);
}

}  // namespace holdfast
