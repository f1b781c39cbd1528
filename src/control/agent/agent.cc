#include "src/control/agent/agent.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "holdfast/status.h"
#include "src/common/logging.h"
#include "src/common/thread_util.h"
#include "src/control/wire/auth.h"
#include "src/control/wire/controller.grpc.pb.h"
#include "src/control/wire/member_stream.h"
#include "src/control/wire/process_watch.h"
#include "src/control/wire/quiet.h"
#include "src/control/wire/rpc_util.h"

namespace holdfast::control {
namespace {

// Beats waiting for the next flush, at most; more flush at once.
constexpr size_t kMaxPendingBeats = 4096;
// How often the agent looks for quiet local streams (AgentOptions::
// quiet_after); a check this much later than due means the agent itself
// was held up, and its view of the streams is stale.
constexpr absl::Duration kQuietCheck = absl::Milliseconds(100);
constexpr absl::Duration kQuietLate = absl::Milliseconds(250);

class AgentImpl;

// The controller's interface, served to the host's members: heartbeat
// streams feed the agent; every other call is passed through.
class AgentService final : public Controller::CallbackService {
 public:
  AgentService(AgentImpl* agent, Controller::Stub* stub, std::string token)
      : agent_(agent), stub_(stub), token_(std::move(token)) {}

  grpc::ServerBidiReactor<HeartbeatRequest, HeartbeatResponse>* Heartbeat(
      grpc::CallbackServerContext* ctx) override;

  grpc::ServerBidiReactor<HostRequest, HostResponse>* HostStream(
      grpc::CallbackServerContext* ctx) override {
    (void)ctx;
    return new Refused();
  }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const RegisterRequest* req,
                                     RegisterResponse* resp) override;

#define HOLDFAST_FORWARD(Method, Req, Resp)                                    \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* ctx,           \
                                   const Req* req, Resp* resp) override {      \
    return Forward(ctx, false,                                                 \
                   [this, req, resp](grpc::ClientContext* c,                   \
                                     std::function<void(grpc::Status)> done) { \
                     stub_->async()->Method(c, req, resp, std::move(done));    \
                   });                                                         \
  }
  HOLDFAST_FORWARD(ReportFailure, ReportFailureRequest, ReportFailureResponse)
  HOLDFAST_FORWARD(AckCheckpoint, AckCheckpointRequest, AckCheckpointResponse)
  HOLDFAST_FORWARD(Status, StatusRequest, StatusResponse)
  HOLDFAST_FORWARD(Set, SetRequest, SetResponse)
  HOLDFAST_FORWARD(Get, GetRequest, GetResponse)
  HOLDFAST_FORWARD(Wait, WaitRequest, WaitResponse)
  HOLDFAST_FORWARD(Add, AddRequest, AddResponse)
  HOLDFAST_FORWARD(CompareAndSet, CompareAndSetRequest, CompareAndSetResponse)
  HOLDFAST_FORWARD(DeletePrefix, DeletePrefixRequest, DeletePrefixResponse)
#undef HOLDFAST_FORWARD

  // Passes a call through with the caller's token and deadline; `call`
  // starts it on the stub. Finishes with its status.
  grpc::ServerUnaryReactor* Forward(
      grpc::CallbackServerContext* ctx, bool wait_for_ready,
      std::function<void(grpc::ClientContext*,
                         std::function<void(grpc::Status)>)>
          call,
      std::function<void()> on_ok = nullptr);

  // Cancels the calls in flight and refuses new ones.
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    for (grpc::ClientContext* c : in_flight_) c->TryCancel();
  }

  bool Authorized(grpc::CallbackServerContext* ctx) const {
    return HasToken(*ctx, token_);
  }

 private:
  // A host stream on an agent: refused (agents do not chain).
  class Refused final
      : public grpc::ServerBidiReactor<HostRequest, HostResponse> {
   public:
    Refused() {
      Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "this is a host agent; host streams go to the "
                          "controller"));
    }
    void OnDone() override { delete this; }
  };

  AgentImpl* const agent_;
  Controller::Stub* const stub_;
  const std::string token_;
  absl::Mutex mu_;
  absl::flat_hash_set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

class AgentImpl final : public HostAgent, public BeatHandler {
 public:
  explicit AgentImpl(AgentOptions o)
      : options_(std::move(o)),
        stub_(Controller::NewStub(
            ControllerChannel(options_.controller, options_.tls))),
        service_(this, stub_.get(), options_.token),
        exits_(options_.exit_watch_interval,
               [this](uint64_t id, const std::string& why) {
                 ProcessExiting(id, why);
               }) {
    if (options_.host.empty()) {
      char name[256] = {};
      gethostname(name, sizeof(name) - 1);
      options_.host = name;
    }
    if (options_.flush_interval > absl::ZeroDuration()) {
      flush_ms_ = std::max<int64_t>(
          1, absl::ToInt64Milliseconds(options_.flush_interval));
    }
  }

  ~AgentImpl() override { Stop(); }

  absl::Status Listen() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(options_.listen, ServerCredentials(options_.tls),
                             &port);
    builder.RegisterService(&service_);
    builder.AddChannelArgument(
        GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
    builder.SetMaxReceiveMessageSize(64 << 20);
    server_ = builder.BuildAndStart();
    const bool unix_socket = absl::StartsWith(options_.listen, "unix:");
    if (server_ == nullptr || (!unix_socket && port == 0)) {
      return absl::UnavailableError(
          absl::StrCat("host agent: cannot listen on ", options_.listen));
    }
    if (unix_socket) {
      address_ = options_.listen;
    } else {
      address_ = absl::StrCat(
          options_.listen.substr(0, options_.listen.rfind(':')), ":", port);
    }
    absl::StatusOr<std::thread> t =
        StartThread("the host agent's upstream thread", [this] { Run(); });
    if (!t.ok()) return t.status();
    upstream_ = std::move(*t);
    HOLDFAST_LOG_INFO("host agent for {} on {}, controller {}", options_.host,
                      address_, options_.controller);
    return absl::OkStatus();
  }

  std::string address() const override { return address_; }

  int members() const override {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(local_.size());
  }

  bool connected() const override {
    absl::MutexLock lock(&mu_);
    return connected_;
  }

  void Handover() override { StopWith(true); }
  void Stop() override { StopWith(false); }

  // A flush interval learned from a Register answer passing through.
  void LearnInterval(int64_t heartbeat_interval_ms) {
    if (heartbeat_interval_ms <= 0) return;
    interval_ms_ = heartbeat_interval_ms;
    if (options_.flush_interval > absl::ZeroDuration()) return;
    flush_ms_ = heartbeat_interval_ms;
  }

  absl::Status OnBeat(const HeartbeatRequest& req, MemberSink* sink) override {
    if (req.member_id() == 0) {
      return absl::InvalidArgumentError("a heartbeat with no member id");
    }
    absl::MutexLock lock(&mu_);
    if (stop_) {
      // Not a loss: the refused stream's end is not reported (OnGone finds
      // no entry), and the member resumes through the next agent.
      auto it = local_.find(req.member_id());
      if (it != local_.end() && it->second.sink == sink) local_.erase(it);
      return absl::UnavailableError(
          "the host agent is stopping; resume through the next one");
    }
    // A refused stream leaves no entry: every entry has a sink.
    auto found = local_.find(req.member_id());
    MemberSink* current = found == local_.end() ? nullptr : found->second.sink;
    absl::StatusOr<bool> bound = BindStream(&current, sink);
    if (!bound.ok()) return bound.status();
    Local& l = local_[req.member_id()];
    l.sink = current;
    l.last_beat = absl::Now();
    // The first message binds the stream, and goes at once.
    bool urgent = *bound;
    if (*bound) l.plain_epoch = -1;
    const StepReport& r = req.report();
    if (req.generation() > l.generation ||
        (r.has_rendezvous_generation() &&
         r.rendezvous_generation() > l.rendezvous)) {
      urgent = true;  // an answer to a new generation
    }
    l.generation = std::max(l.generation, req.generation());
    if (r.has_rendezvous_generation()) {
      l.rendezvous = std::max(l.rendezvous, r.rendezvous_generation());
    }
    const bool plain =
        !r.step_end() && !req.has_checkpoint_ack() && !req.leaving();
    urgent = urgent || req.has_checkpoint_ack() || req.leaving();
    if (plain && l.plain_epoch == epoch_) {
      // A periodic report replaces the previous one still waiting (an
      // ack request it carried goes with the newer).
      HeartbeatRequest& prev = beats_[l.plain_index];
      const bool ask = prev.want_ack() && !req.want_ack();
      const uint64_t seq = prev.seq();
      prev = req;
      if (ask) {
        prev.set_want_ack(true);
        prev.set_seq(seq);
      }
    } else {
      beats_.push_back(req);
      l.plain_epoch = plain ? epoch_ : -1;
      l.plain_index = beats_.size() - 1;
    }
    if (urgent || beats_.size() >= kMaxPendingBeats) urgent_ = true;
    return absl::OkStatus();
  }

  // A member registered through this agent: watched until its process
  // exits (ProcessWatch), when it is reported gone at once.
  void WatchMember(uint64_t member_id, const ProcessIdentity& who) {
    exits_.Watch(member_id, who);
  }

  void ProcessExiting(uint64_t member_id, const std::string& why) {
    absl::MutexLock lock(&mu_);
    auto it = local_.find(member_id);
    if (it == local_.end()) return;  // not on a stream here (or gone)
    local_.erase(it);                // its stream's end is not news any more
    MemberGone g;
    g.set_member_id(member_id);
    g.set_why(absl::StrCat(why, " (seen in /proc by the host agent)"));
    gone_.push_back(std::move(g));
    urgent_ = true;
  }

  void OnGone(uint64_t member_id, MemberSink* sink, bool leaving, bool finished,
              absl::string_view why) override {
    absl::MutexLock lock(&mu_);
    auto it = local_.find(member_id);
    if (it == local_.end() || it->second.sink != sink) return;
    local_.erase(it);
    MemberGone g;
    g.set_member_id(member_id);
    g.set_leaving(leaving);
    g.set_finished(finished);
    g.set_why(std::string(why));
    gone_.push_back(std::move(g));
    urgent_ = true;
  }

 private:
  struct Local {
    MemberSink* sink = nullptr;
    int64_t generation = -1;
    int64_t rendezvous = -1;
    // Its periodic report waiting in beats_ (when plain_epoch == epoch_).
    int64_t plain_epoch = -1;
    size_t plain_index = 0;
    absl::Time last_beat;  // its last message, by this agent's clock
  };

  absl::Duration QuietAfter() const {
    if (options_.quiet_after > absl::ZeroDuration()) {
      return options_.quiet_after;
    }
    return DefaultQuietAfter(absl::Milliseconds(interval_ms_.load()));
  }

  // Queues a MemberQuiet for each local stream quiet for QuietAfter(), and
  // makes the next message go at once. Nothing while the agent's own
  // checks come late (it was stopped or starved: the beats it has not read
  // yet are in its sockets), until a bound's time after they are on time.
  void CheckQuietLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Duration after = QuietAfter();
    if (after == absl::InfiniteDuration()) return;
    if (now - checked_at_ > kQuietCheck + kQuietLate) {
      quiet_hold_until_ = now + after;
    }
    checked_at_ = now;
    if (now < quiet_hold_until_) return;
    for (const auto& [id, l] : local_) {
      const absl::Duration quiet = now - l.last_beat;
      if (quiet < after) continue;
      MemberQuiet& q = quiet_.emplace_back();
      q.set_member_id(id);
      q.set_quiet_ms(absl::ToInt64Milliseconds(quiet));
      urgent_ = true;
    }
  }

  void StopWith(bool handover) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      stop_ = true;
      handover_ = handover;
      if (!handover && stream_ctx_ != nullptr) stream_ctx_->TryCancel();
    }
    if (upstream_.joinable()) upstream_.join();
    CloseLocal(absl::UnavailableError(
        handover ? "the host agent is restarting; resume through the next one"
                 : "the host agent stopped"));
    service_.Stop();
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(1));
      server_->Wait();
      server_.reset();
    }
  }

  // Ends every member's local stream with `why` (they resume).
  void CloseLocal(const absl::Status& why) {
    absl::MutexLock lock(&mu_);
    for (auto& [id, l] : local_) l.sink->Close(why);
    local_.clear();
    beats_.clear();
    gone_.clear();
    quiet_.clear();
    ++epoch_;
  }

  // The upstream thread: one stream to the controller at a time.
  void Run() {
    absl::Duration backoff = options_.reconnect_min;
    absl::BitGen rng;
    for (;;) {
      const absl::Status ended = RunStream();
      {
        absl::MutexLock lock(&mu_);
        connected_ = false;
        if (stop_) return;
      }
      HOLDFAST_LOG_WARN(
          "host agent {}: stream to the controller at {} ended ({}); its "
          "members resume when it is back",
          options_.host, options_.controller,
          std::string(
              ExplainTls(ended, options_.controller, options_.tls.has_value())
                  .message()));
      CloseLocal(absl::UnavailableError(
          absl::StrCat("the host agent lost its controller at ",
                       options_.controller, ": ", ended.message())));
      const absl::Duration wait = backoff * (1 + absl::Uniform(rng, 0.0, 0.5));
      backoff = std::min(backoff * 2, options_.reconnect_max);
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), wait);
      if (stop_) return;
    }
  }

  // Waits until the next flush (`next`) or something to send at once,
  // running the quiet checks meanwhile, then moves what waits into `req`
  // (with the host when `first`). False when the stream is to end: it
  // broke, or the agent stops without a handover.
  bool NextMessage(absl::Time next, bool first, HostRequest* req) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || broken_ || urgent_;
    };
    for (;;) {
      const absl::Time now = absl::Now();
      if (now - checked_at_ >= kQuietCheck) CheckQuietLocked(now);
      if (ready() || now >= next) break;
      mu_.AwaitWithDeadline(absl::Condition(&ready),
                            std::min(next, checked_at_ + kQuietCheck));
    }
    if (broken_ || (stop_ && !handover_)) return false;
    if (first) req->set_host(options_.host);
    for (HeartbeatRequest& b : beats_) req->add_beats()->Swap(&b);
    for (MemberGone& g : gone_) req->add_gone()->Swap(&g);
    for (MemberQuiet& q : quiet_) req->add_quiet()->Swap(&q);
    beats_.clear();
    gone_.clear();
    quiet_.clear();
    ++epoch_;
    urgent_ = false;
    req->set_handover(stop_);
    return true;
  }

  absl::Status RunStream() {
    auto ctx = TokenContext(options_.token, absl::InfiniteFuture());
    auto stream = stub_->HostStream(ctx.get());
    {
      absl::MutexLock lock(&mu_);
      if (stop_) {
        ctx->TryCancel();
        (void)stream->Finish();
        return absl::CancelledError("stopping");
      }
      stream_ctx_ = ctx.get();
      broken_ = false;
    }
    absl::StatusOr<std::thread> started =
        StartThread("the host agent's reader thread", [&] {
          HostResponse msg;
          while (stream->Read(&msg) && Dispatch(msg)) {
          }
          absl::MutexLock lock(&mu_);
          broken_ = true;
        });
    if (!started.ok()) {
      ctx->TryCancel();
      (void)stream->Finish();
      absl::MutexLock lock(&mu_);
      stream_ctx_ = nullptr;
      return started.status();
    }
    std::thread reader = std::move(*started);
    bool first = true;
    absl::Time next = absl::Now();
    for (;;) {
      HostRequest req;
      if (!NextMessage(next, first, &req)) break;
      const bool handover = req.handover();
      const absl::Time now = absl::Now();
      next = now + absl::Milliseconds(flush_ms_.load());
      if (!first && !handover && req.beats().empty() && req.gone().empty() &&
          req.quiet().empty()) {
        continue;
      }
      if (!stream->Write(req)) break;
      if (first) {
        first = false;
        absl::MutexLock lock(&mu_);
        connected_ = true;
      }
      if (handover) {
        stream->WritesDone();
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&broken_), absl::Seconds(2));
        break;
      }
    }
    ctx->TryCancel();  // a no-op once the controller has finished it
    reader.join();
    {
      absl::MutexLock lock(&mu_);
      stream_ctx_ = nullptr;
    }
    return FromGrpc(stream->Finish(), "HostStream");
  }

  // The controller's messages to this host's members; false (nothing
  // done, and the stream ends) for a message from a deposed leader, whose
  // epoch is below one seen before.
  bool Dispatch(const HostResponse& msg) {
    absl::MutexLock lock(&mu_);
    if (msg.epoch() < controller_epoch_) {
      HOLDFAST_LOG_WARN(
          "host agent {}: the controller at {} has epoch {}, below {}: a "
          "deposed leader; its orders are refused",
          options_.host, options_.controller, msg.epoch(), controller_epoch_);
      return false;
    }
    controller_epoch_ = msg.epoch();
    for (const MemberPush& p : msg.pushes()) {
      auto it = local_.find(p.member_id());
      if (it != local_.end()) it->second.sink->Push(p.msg());
    }
    for (const MemberClose& c : msg.closes()) {
      auto it = local_.find(c.member_id());
      if (it == local_.end()) continue;
      it->second.sink->Close(
          absl::Status(static_cast<absl::StatusCode>(c.code()), c.message()));
      local_.erase(it);
    }
    return true;
  }

  AgentOptions options_;
  std::unique_ptr<Controller::Stub> stub_;
  AgentService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::thread upstream_;
  std::atomic<int64_t> flush_ms_{500};
  // The members' heartbeat interval, learned from their registrations.
  std::atomic<int64_t> interval_ms_{500};

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Local> local_ ABSL_GUARDED_BY(mu_);
  // The highest controller epoch seen (HostResponse.epoch).
  int64_t controller_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // What the next flush sends: beats in the order they came, then ends.
  std::vector<HeartbeatRequest> beats_ ABSL_GUARDED_BY(mu_);
  std::vector<MemberGone> gone_ ABSL_GUARDED_BY(mu_);
  std::vector<MemberQuiet> quiet_ ABSL_GUARDED_BY(mu_);
  // When CheckQuietLocked last ran, and until when it reports nothing.
  absl::Time checked_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time quiet_hold_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;  // flushes so far
  bool urgent_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool handover_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* stream_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Last: its thread, which calls ProcessExiting, ends first.
  ProcessWatch exits_;
};

grpc::ServerBidiReactor<HeartbeatRequest, HeartbeatResponse>*
AgentService::Heartbeat(grpc::CallbackServerContext* ctx) {
  return NewMemberStream(agent_, Authorized(ctx));
}

grpc::ServerUnaryReactor* AgentService::Register(
    grpc::CallbackServerContext* ctx, const RegisterRequest* req,
    RegisterResponse* resp) {
  // Members register with wait_for_ready (they wait for a controller that
  // is coming up), and so does the call passed on.
  return Forward(
      ctx, true,
      [this, req, resp](grpc::ClientContext* c,
                        std::function<void(grpc::Status)> done) {
        stub_->async()->Register(c, req, resp, std::move(done));
      },
      [this, req, resp] {
        agent_->LearnInterval(resp->heartbeat_interval_ms());
        agent_->WatchMember(
            resp->member_id(),
            {req->pid(), req->process_start(), req->host_key()});
      });
}

grpc::ServerUnaryReactor* AgentService::Forward(
    grpc::CallbackServerContext* ctx, bool wait_for_ready,
    std::function<void(grpc::ClientContext*, std::function<void(grpc::Status)>)>
        call,
    std::function<void()> on_ok) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto* out = new grpc::ClientContext();
  for (const auto& [k, v] : ctx->client_metadata()) {
    if (absl::string_view(k.data(), k.size()) == kTokenMetadataKey) {
      out->AddMetadata(kTokenMetadataKey, std::string(v.data(), v.size()));
    }
  }
  out->set_deadline(ctx->deadline());
  out->set_wait_for_ready(wait_for_ready);
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      delete out;
      reactor->Finish(grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          "the host agent is stopping; try the next one at this address"));
      return reactor;
    }
    in_flight_.insert(out);
  }
  call(out, [this, reactor, out, on_ok = std::move(on_ok)](grpc::Status s) {
    if (s.ok() && on_ok) on_ok();
    {
      absl::MutexLock lock(&mu_);
      in_flight_.erase(out);
    }
    delete out;
    reactor->Finish(s);
  });
  return reactor;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostAgent>> HostAgent::Start(
    const AgentOptions& options) {
  if (options.controller.empty()) {
    return absl::InvalidArgumentError("host agent: empty controller address");
  }
  if (options.token.empty()) {
    return absl::InvalidArgumentError(
        "host agent: a job token is required (--token-file or "
        "HOLDFAST_JOB_TOKEN)");
  }
  if (options.listen.empty()) {
    return absl::InvalidArgumentError("host agent: empty listen address");
  }
  if (options.flush_interval < absl::ZeroDuration() ||
      options.quiet_after < absl::ZeroDuration() ||
      options.reconnect_min <= absl::ZeroDuration() ||
      options.reconnect_max < options.reconnect_min) {
    return absl::InvalidArgumentError(
        "host agent: flush interval and quiet_after must be >= 0 and 0 < "
        "reconnect_min <= reconnect_max");
  }
  AgentOptions o = options;
  o.reconnect_max = ReconnectCap(o.controller, o.reconnect_max);
  o.reconnect_min = std::min(o.reconnect_min, o.reconnect_max);
  auto agent = std::make_unique<AgentImpl>(o);
  HOLDFAST_RETURN_IF_ERROR(agent->Listen());
  return std::unique_ptr<HostAgent>(std::move(agent));
}

}  // namespace holdfast::control
