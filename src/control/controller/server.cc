#include "src/control/controller/server.h"

#include <grpcpp/grpcpp.h>

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "holdfast/status.h"
#include "src/common/config.h"
#include "src/common/logging.h"
#include "src/control/controller/push_burst.h"
#include "src/control/wire/auth.h"
#include "src/control/wire/controller.grpc.pb.h"
#include "src/control/wire/member_stream.h"
#include "src/control/wire/process_watch.h"
#include "src/control/wire/rpc_util.h"
#include "src/diagnosis/diagnosis.h"
#include "src/store/keys.h"

namespace holdfast::control {
namespace {

// A unary reactor that finishes when a KvStore wait completes, and cancels
// the wait if the client goes away first. Deletes itself when gRPC is done.
class WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  using OnReady = std::function<absl::Status()>;  // fills the response

  WaitReactor(KvStore* kv, uint64_t id) : kv_(kv), id_(id) {}

  // `this` may be finished (and deleted) before this returns.
  void Start(std::vector<std::string> keys, absl::Duration timeout,
             OnReady on_ready) {
    kv_->WaitAsync(id_, std::move(keys), timeout,
                   [this, on_ready = std::move(on_ready)](absl::Status s) {
                     if (s.ok()) s = on_ready();
                     Finish(ToGrpcStatus(s));
                   });
  }
  void OnCancel() override { kv_->CancelWait(id_); }
  void OnDone() override { delete this; }

 private:
  KvStore* const kv_;
  const uint64_t id_;
};

// What members' heartbeats do at the controller: feed Membership. A
// checkpoint ack on the stream is taken as an AckCheckpoint call, and an
// ack request is answered on the stream.
class MembershipFeed final : public BeatHandler {
 public:
  explicit MembershipFeed(Membership* membership) : membership_(membership) {}

  absl::Status OnBeat(const HeartbeatRequest& req, MemberSink* sink) override {
    HOLDFAST_RETURN_IF_ERROR(membership_->Heartbeat(req, sink, absl::Now()));
    if (req.has_checkpoint_ack()) {
      AckCheckpointRequest ack;
      ack.set_member_id(req.member_id());
      ack.set_generation(req.checkpoint_ack().generation());
      ack.set_step(req.checkpoint_ack().step());
      absl::Status s =
          membership_->AckCheckpoint(ack, absl::Now(), sink).status();
      if (s.code() == absl::StatusCode::kInvalidArgument) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad checkpoint ack: ", s.message()));
      }
      // Else (FailedPrecondition) an ack of another generation, whose
      // news reaches the member on this stream, or a standby's: it counts
      // for nothing and the stream goes on.
    }
    if (req.want_ack()) {
      HeartbeatResponse ack;
      ack.set_ack_seq(req.seq());
      sink->Push(ack);
    }
    return absl::OkStatus();
  }

  void OnGone(uint64_t member_id, MemberSink* sink, bool leaving, bool finished,
              absl::string_view why) override {
    membership_->Detach(member_id, sink, leaving, finished, why, absl::Now());
  }

 private:
  Membership* const membership_;
};

// A host agent's stream: the beats of the members on its host, each bound
// to Membership through a sink of its own, and their pushes merged into
// one message per write. A member's gone record is its stream's end; the
// stream's own end ends every member still on it (a crash, unless the
// stream had been quiet, or a handover). Deletes itself when gRPC is done.
class HostReactor final
    : public grpc::ServerBidiReactor<HostRequest, HostResponse> {
 public:
  HostReactor(Membership* membership, MembershipFeed* feed, bool authorized,
              int64_t epoch)
      : membership_(membership), feed_(feed), epoch_(epoch) {
    if (!authorized) {
      {
        absl::MutexLock lock(&mu_);
        finishing_ = true;
      }
      Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing or wrong job token"));
      return;
    }
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    const absl::Time now = absl::Now();
    if (!ok) {
      EndAll(absl::StrCat("host agent's stream ended (host ", host_, ")"), now);
      FinishStream(absl::OkStatus());
      return;
    }
    if (host_.empty()) {
      host_ = req_.host().empty() ? "?" : req_.host().substr(0, 256);
    }
    for (const HeartbeatRequest& beat : req_.beats()) {
      Sink* sink = SinkFor(beat.member_id());
      if (sink == nullptr) continue;  // closed; its close record is queued
      absl::Status s = feed_->OnBeat(beat, sink);
      if (!s.ok()) {
        feed_->OnGone(beat.member_id(), sink, false, false,
                      absl::StrCat("bad heartbeat: ", s.message()));
        sink->Close(s);
      }
    }
    for (const MemberGone& g : req_.gone()) {
      Sink* sink = Find(g.member_id());
      if (sink == nullptr || !Drop(sink)) continue;
      feed_->OnGone(
          g.member_id(), sink, g.leaving(), g.finished(),
          absl::StrCat("on host agent ", host_, ": ", g.why().substr(0, 256)));
    }
    for (const MemberQuiet& q : req_.quiet()) {
      Sink* sink = Find(q.member_id());
      if (sink != nullptr) {
        membership_->NoteQuiet(q.member_id(), sink,
                               absl::Milliseconds(q.quiet_ms()), now);
      }
    }
    heard_at_ = now;
    if (req_.handover()) {
      for (Sink* sink : Live()) {
        if (Drop(sink)) membership_->Unbind(sink->id(), sink);
      }
      HOLDFAST_LOG_INFO("host agent {} hands its members over (restarting)",
                        host_);
    }
    StartRead(&req_);
  }

  void OnCancel() override {
    EndAll(absl::StrCat("host agent's connection lost (host ", host_, ")"),
           absl::Now());
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (finishing_) {
        if (!finish_sent_) {
          finish_sent_ = true;
          Finish(ToGrpcStatus(finish_status_));
        }
        return;
      }
      if (!ok || !TakePendingLocked()) return;
      writing_ = true;
    }
    StartWrite(&out_);
  }

  void OnDone() override {
    EndAll("stream done", absl::Now());
    delete this;
  }

 private:
  // One member on this stream, as Membership sees it.
  class Sink final : public MemberSink {
   public:
    Sink(HostReactor* host, uint64_t id) : host_(host), id_(id) {}
    uint64_t id() const { return id_; }
    void Push(const HeartbeatResponse& msg) override {
      host_->PushTo(id_, msg);
    }
    void Close(const absl::Status& status) override {
      host_->CloseMember(this, status);
    }
    bool Relayed() const override { return true; }
    bool Closed() const override {
      absl::MutexLock lock(&host_->mu_);
      return closed_;
    }
    bool closed_ ABSL_GUARDED_BY(host_->mu_) = false;

   private:
    HostReactor* const host_;
    const uint64_t id_;
  };

  // The open sink of `id`, made if there is none; null if the member's
  // sink was closed by Membership and its close record waits (a beat that
  // the agent sent before it heard of the close).
  Sink* SinkFor(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = sinks_.find(id);
    if (it != sinks_.end()) {
      if (!it->second->closed_) return it->second;
      if (closing_.contains(id)) return nullptr;
    }
    all_.push_back(std::make_unique<Sink>(this, id));
    sinks_[id] = all_.back().get();
    return all_.back().get();
  }

  Sink* Find(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = sinks_.find(id);
    return it == sinks_.end() ? nullptr : it->second;
  }

  // Marks `sink` closed without a close record; false if it was already.
  bool Drop(Sink* sink) {
    absl::MutexLock lock(&mu_);
    if (sink->closed_) return false;
    sink->closed_ = true;
    return true;
  }

  std::vector<Sink*> Live() {
    absl::MutexLock lock(&mu_);
    std::vector<Sink*> out;
    for (const auto& [id, sink] : sinks_) {
      if (!sink->closed_) out.push_back(sink);
    }
    return out;
  }

  // Ends every member still on this stream: crashed if the stream carried
  // anything in the last two heartbeat intervals, else left to the silence
  // rule (Membership::Detach).
  void EndAll(const std::string& why, absl::Time now) {
    for (Sink* sink : Live()) {
      if (Drop(sink)) {
        membership_->Detach(sink->id(), sink, false, false, why, now,
                            heard_at_);
      }
    }
  }

  void PushTo(uint64_t id, const HeartbeatResponse& msg) {
    {
      absl::MutexLock lock(&mu_);
      if (finishing_) return;
      HeartbeatResponse& pending = pending_[id];
      MergePush(msg, &pending);
      if (epoch_ > 0) pending.set_epoch(epoch_);
    }
    // In a push to every member, the host's members go in one write.
    if (!PushBurst::Defer(this, [this] { Kick(); })) Kick();
  }

  // Starts a write of what pends, unless one is in flight.
  void Kick() {
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finishing_ || !TakePendingLocked()) return;
      writing_ = true;
    }
    StartWrite(&out_);
  }

  void CloseMember(Sink* sink, const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (sink->closed_ || finishing_) return;
      sink->closed_ = true;
      closing_.insert(sink->id());
      MemberClose c;
      c.set_member_id(sink->id());
      c.set_code(static_cast<int32_t>(status.code()));
      c.set_message(std::string(status.message()));
      closes_.push_back(std::move(c));
    }
    Kick();
  }

  void FinishStream(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finishing_) return;
      finishing_ = true;
      finish_status_ = status;
      if (writing_) return;  // OnWriteDone finishes
      finish_sent_ = true;
    }
    Finish(ToGrpcStatus(status));
  }

  // Moves what pends into out_ for the next write; false if nothing does.
  bool TakePendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (pending_.empty() && closes_.empty()) return false;
    out_.Clear();
    for (auto& [id, msg] : pending_) {
      MemberPush* p = out_.add_pushes();
      p->set_member_id(id);
      p->mutable_msg()->Swap(&msg);
    }
    pending_.clear();
    for (MemberClose& c : closes_) out_.add_closes()->Swap(&c);
    closes_.clear();
    closing_.clear();
    out_.set_epoch(epoch_);
    return true;
  }

  Membership* const membership_;
  MembershipFeed* const feed_;
  const int64_t epoch_;  // stamped on every push when > 0
  HostRequest req_;      // read side only
  std::string host_;     // read side only
  // When the stream last carried a message (read side; OnCancel and
  // OnDone come after the reads).
  absl::Time heard_at_ = absl::InfinitePast();

  mutable absl::Mutex mu_;
  // Every sink made, alive until OnDone (Membership may hold any of them
  // until it is dropped or closed); by member, the newest.
  std::vector<std::unique_ptr<Sink>> all_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Sink*> sinks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, HeartbeatResponse> pending_
      ABSL_GUARDED_BY(mu_);
  std::vector<MemberClose> closes_ ABSL_GUARDED_BY(mu_);
  // Members whose close record waits in closes_.
  absl::flat_hash_set<uint64_t> closing_ ABSL_GUARDED_BY(mu_);
  HostResponse out_;  // owned by the one write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_sent_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

// Prometheus metrics, fed by Membership events and refreshed from its status.
class Metrics final : public MembershipObserver {
 public:
  Metrics()
      : registry_(std::make_shared<prometheus::Registry>()),
        heartbeats_(prometheus::BuildCounter()
                        .Name("holdfast_heartbeats_total")
                        .Help("Heartbeat messages received")
                        .Register(*registry_)
                        .Add({})),
        incidents_(prometheus::BuildCounter()
                       .Name("holdfast_incidents_total")
                       .Help("Failure detections, by kind")
                       .Register(*registry_)),
        latency_(prometheus::BuildHistogram()
                     .Name("holdfast_detection_latency_seconds")
                     .Help("From a member's last sign of health to its "
                           "detection, by incident kind")
                     .Register(*registry_)),
        members_(prometheus::BuildGauge()
                     .Name("holdfast_members")
                     .Help("Members by state, standbys and vacant slots")
                     .Register(*registry_)),
        verdicts_(prometheus::BuildCounter()
                      .Name("holdfast_diagnoses_total")
                      .Help("Culprit verdicts on failed generations, by "
                            "diagnosed kind and action")
                      .Register(*registry_)),
        job_(prometheus::BuildGauge()
                 .Name("holdfast_job")
                 .Help("Job-wide values: generation, committed step, world "
                       "size, median step seconds, step rate (steps/s)")
                 .Register(*registry_)) {}

  std::shared_ptr<prometheus::Registry> registry() { return registry_; }

  void OnHeartbeat() override { heartbeats_.Increment(); }
  void OnIncident(const Incident& inc) override {
    const std::string kind = IncidentKindName(inc.kind());
    incidents_.Add({{"kind", kind}}).Increment();
    latency_
        .Add({{"kind", kind}},
             prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1, 0.25, 0.5,
                                                     1, 2, 5, 10, 30, 60, 300})
        .Observe(static_cast<double>(inc.time_to_detect_ms()) / 1000.0);
  }

  void OnVerdict(const Verdict& v) {
    verdicts_.Add({{"kind", v.kind()}, {"action", v.action()}}).Increment();
  }

  void Refresh(const StatusResponse& s) {
    members_.Add({{"state", "alive"}}).Set(s.alive());
    members_.Add({{"state", "dead"}}).Set(s.dead());
    members_.Add({{"state", "left"}}).Set(s.left());
    members_.Add({{"state", "standby"}}).Set(s.standbys());
    members_.Add({{"state", "vacant_slot"}}).Set(s.vacant_slots());
    job_.Add({{"value", "generation"}})
        .Set(static_cast<double>(s.generation()));
    job_.Add({{"value", "committed_step"}})
        .Set(static_cast<double>(s.committed_step()));
    job_.Add({{"value", "world_size"}}).Set(s.world_size());
    const double median = static_cast<double>(s.median_step_us()) / 1e6;
    job_.Add({{"value", "median_step_seconds"}}).Set(median);
    job_.Add({{"value", "step_rate"}}).Set(median > 0 ? 1.0 / median : 0.0);
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter& heartbeats_;
  prometheus::Family<prometheus::Counter>& incidents_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Gauge>& members_;
  prometheus::Family<prometheus::Counter>& verdicts_;
  prometheus::Family<prometheus::Gauge>& job_;
};

class Service final : public Controller::CallbackService {
 public:
  Service(const ControllerOptions& o)
      : token_(o.token),
        epoch_(o.epoch),
        kv_(o.limits),
        membership_(o.world_size, o.detection, absl::Now(), o.membership_limits,
                    o.recovery),
        feed_(&membership_),
        exits_(o.detection.exit_watch_interval,
               [this](uint64_t id, const std::string& why) {
                 membership_.ProcessExiting(id, why, absl::Now());
               }) {}

  Membership& membership() { return membership_; }
  KvStore& kv() { return kv_; }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const RegisterRequest* req,
                                     RegisterResponse* resp) override {
    return Reply(ctx, [&]() -> absl::Status {
      auto r = membership_.Register(*req, absl::Now());
      if (!r.ok()) return r.status();
      *resp = std::move(*r);
      resp->set_epoch(epoch_);
      // A member on this machine is watched until its process exits.
      exits_.Watch(resp->member_id(),
                   {req->pid(), req->process_start(), req->host_key()});
      return absl::OkStatus();
    });
  }

  grpc::ServerBidiReactor<HeartbeatRequest, HeartbeatResponse>* Heartbeat(
      grpc::CallbackServerContext* ctx) override {
    return NewMemberStream(&feed_, Authorized(ctx), epoch_);
  }

  grpc::ServerBidiReactor<HostRequest, HostResponse>* HostStream(
      grpc::CallbackServerContext* ctx) override {
    return new HostReactor(&membership_, &feed_, Authorized(ctx), epoch_);
  }

  grpc::ServerUnaryReactor* ReportFailure(
      grpc::CallbackServerContext* ctx, const ReportFailureRequest* req,
      ReportFailureResponse* resp) override {
    return Reply(ctx, [&]() -> absl::Status {
      auto r = membership_.ReportFailure(*req, absl::Now());
      if (!r.ok()) return r.status();
      resp->set_declared(*r);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* AckCheckpoint(
      grpc::CallbackServerContext* ctx, const AckCheckpointRequest* req,
      AckCheckpointResponse* resp) override {
    return Reply(ctx, [&]() -> absl::Status {
      auto r = membership_.AckCheckpoint(*req, absl::Now());
      if (!r.ok()) return r.status();
      resp->set_committed_step(*r);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const StatusRequest* req,
                                   StatusResponse* resp) override {
    return Reply(ctx, [&]() -> absl::Status {
      if (req->max_incidents() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "max_incidents ", req->max_incidents(), " is negative"));
      }
      *resp = membership_.Status(*req, absl::Now());
      resp->set_epoch(epoch_);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx,
                                const SetRequest* req, SetResponse*) override {
    return Reply(ctx, [&] { return kv_.Set(req->key(), req->value()); });
  }

  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx,
                                const GetRequest* req,
                                GetResponse* resp) override {
    if (!Authorized(ctx) || req->timeout_ms() <= 0) {
      return Reply(ctx, [&]() -> absl::Status {
        auto v = kv_.Get(req->key());
        if (!v.ok()) return v.status();
        if (!v->has_value()) {
          return absl::NotFoundError(
              absl::StrCat("key '", req->key(), "' is not set"));
        }
        resp->set_value(**v);
        return absl::OkStatus();
      });
    }
    auto* reactor = new WaitReactor(&kv_, kv_.NewWaitId());
    const std::string key = req->key();
    reactor->Start({key}, absl::Milliseconds(req->timeout_ms()),
                   [this, key, resp]() -> absl::Status {
                     auto v = kv_.Get(key);
                     if (!v.ok()) return v.status();
                     if (!v->has_value()) {
                       return absl::NotFoundError(
                           absl::StrCat("key '", key, "' was deleted"));
                     }
                     resp->set_value(**v);
                     return absl::OkStatus();
                   });
    return reactor;
  }

  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx,
                                 const WaitRequest* req,
                                 WaitResponse*) override {
    if (!Authorized(ctx)) return Reply(ctx, [] { return absl::OkStatus(); });
    auto* reactor = new WaitReactor(&kv_, kv_.NewWaitId());
    reactor->Start(
        std::vector<std::string>(req->keys().begin(), req->keys().end()),
        absl::Milliseconds(std::max<int64_t>(0, req->timeout_ms())),
        [] { return absl::OkStatus(); });
    return reactor;
  }

  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx,
                                const AddRequest* req,
                                AddResponse* resp) override {
    return Reply(ctx, [&]() -> absl::Status {
      auto v = kv_.Add(req->key(), req->delta());
      if (!v.ok()) return v.status();
      resp->set_value(*v);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* CompareAndSet(
      grpc::CallbackServerContext* ctx, const CompareAndSetRequest* req,
      CompareAndSetResponse* resp) override {
    return Reply(ctx, [&]() -> absl::Status {
      auto r = kv_.CompareAndSet(req->key(), req->expected(),
                                 req->expect_absent(), req->desired());
      if (!r.ok()) return r.status();
      resp->set_swapped(r->first);
      resp->set_value(r->second);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* DeletePrefix(grpc::CallbackServerContext* ctx,
                                         const DeletePrefixRequest* req,
                                         DeletePrefixResponse* resp) override {
    return Reply(ctx, [&]() -> absl::Status {
      auto n = kv_.DeletePrefix(req->prefix());
      if (!n.ok()) return n.status();
      resp->set_deleted(*n);
      return absl::OkStatus();
    });
  }

 private:
  bool Authorized(grpc::CallbackServerContext* ctx) const {
    return HasToken(*ctx, token_);
  }

  // Finishes a unary call at once: Unauthenticated without the right
  // token, else the status of `handler`.
  template <typename F>
  grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx,
                                  F&& handler) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (!Authorized(ctx)) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                   "missing or wrong job token"));
    } else {
      reactor->Finish(ToGrpcStatus(handler()));
    }
    return reactor;
  }

  const std::string token_;
  const int64_t epoch_;  // ControllerOptions::epoch
  KvStore kv_;
  Membership membership_;
  MembershipFeed feed_;
  // After membership_: its thread, which calls into it, ends first.
  ProcessWatch exits_;
};

class ServerImpl final : public ControllerServer {
 public:
  ServerImpl(std::unique_ptr<Service> service, std::unique_ptr<Metrics> metrics,
             std::unique_ptr<prometheus::Exposer> exposer,
             std::unique_ptr<grpc::Server> server, std::string host, int port,
             absl::Duration scan_interval, absl::Duration settle)
      : service_(std::move(service)),
        metrics_(std::move(metrics)),
        exposer_(std::move(exposer)),
        server_(std::move(server)),
        host_(std::move(host)),
        port_(port),
        scan_interval_(scan_interval),
        settle_(settle) {
    detector_ = std::thread([this] { DetectLoop(); });
  }
  ~ServerImpl() override { Shutdown(); }

  int port() const override { return port_; }
  int metrics_port() const override {
    if (exposer_ == nullptr) return -1;
    auto ports = exposer_->GetListeningPorts();
    return ports.empty() ? -1 : ports[0];
  }
  std::string address() const override {
    return absl::StrCat(host_, ":", port_);
  }
  void Shutdown() override { Stop(absl::Seconds(1)); }
  void Abandon() override { Stop(absl::ZeroDuration()); }

  // Stops detection, then serving: calls in flight get `grace` to finish.
  void Stop(absl::Duration grace) {
    if (server_ == nullptr) return;
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    detector_.join();
    service_->membership().Close();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    server_->Wait();
    server_.reset();
    exposer_.reset();
  }

 private:
  void DetectLoop() {
    absl::Time next_refresh = absl::InfinitePast();
    absl::MutexLock lock(&mu_);
    absl::Time next_scan = absl::Now() + scan_interval_;
    while (!stop_) {
      // Wakes for a merged push that falls due before the next scan.
      const absl::Time push = service_->membership().PushDue();
      mu_.AwaitWithDeadline(absl::Condition(&stop_), std::min(push, next_scan));
      if (stop_) break;
      const absl::Time now = absl::Now();
      service_->membership().FlushPushes(now);
      if (now < next_scan) continue;
      next_scan = now + scan_interval_;
      service_->membership().Scan(now);
      service_->membership().FlushPushes(now);
      DiagnoseDue(now);
      if (metrics_ != nullptr && now >= next_refresh) {
        metrics_->Refresh(service_->membership().Status({}, now));
        next_refresh = now + absl::Seconds(1);
      }
    }
  }

  // Runs the culprit analysis of each pending case whose members have all
  // answered (left their abort notices), or whose settle time is over;
  // the verdict goes to the incidents, the store (keys::Verdict) and the
  // metrics.
  void DiagnoseDue(absl::Time now) {
    Membership& m = service_->membership();
    for (DiagnosisCase& c : m.PendingDiagnoses(now)) {
      bool all = true;
      for (diagnosis::SlotEvidence& s : c.slots) {
        if (s.liveness != diagnosis::SlotEvidence::Liveness::kAlive) continue;
        absl::StatusOr<std::optional<std::string>> notice =
            service_->kv().Get(keys::AbortNotice(c.generation, s.slot));
        if (notice.ok() && notice->has_value())
          diagnosis::ReadNotice(**notice, &s);
        all = all && s.answered;
      }
      if (!all && now < c.since + settle_) continue;
      const Verdict v =
          m.SetDiagnosis(c.generation, diagnosis::Diagnose(c.slots), now);
      (void)service_->kv().Set(keys::Verdict(c.generation),
                               VerdictJson(v).dump());
      if (metrics_ != nullptr) metrics_->OnVerdict(v);
    }
  }

  // Declared first: outlive the server, which calls into them.
  std::unique_ptr<Service> service_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<grpc::Server> server_;
  const std::string host_;
  const int port_;
  const absl::Duration scan_interval_;
  const absl::Duration settle_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread detector_;
};

}  // namespace

namespace {

// The controller's options, refused by name.
absl::Status CheckOptions(const ControllerOptions& options) {
  if (options.token.empty()) {
    return absl::InvalidArgumentError(
        "controller: a job token is required (--token-file or "
        "HOLDFAST_JOB_TOKEN)");
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("controller: port ", options.port, " is out of range"));
  }
  if (options.world_size <= 0 || options.world_size > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("controller: world size ", options.world_size,
                     " is out of range [1, 1048576]"));
  }
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "controller: metrics port ", options.metrics_port, " is out of range"));
  }
  if (options.recovery.min_world < 1 ||
      options.recovery.min_world > options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "controller: minimum world size ", options.recovery.min_world,
        " is out of range [1, ", options.world_size, "]"));
  }
  if (options.scan_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("controller: scan interval must be > 0");
  }
  if (const absl::Duration lease = Lease(options.detection);
      lease < absl::ZeroDuration() || lease >= options.detection.silent_after) {
    return absl::InvalidArgumentError(absl::StrCat(
        "controller: lease ", absl::FormatDuration(lease),
        " must be shorter than the silence threshold (",
        absl::FormatDuration(options.detection.silent_after),
        "), so that a cut-off member stops acting before it is declared "
        "lost; 0 turns the lease off"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ControllerServer>> ControllerServer::Start(
    const ControllerOptions& options) {
  config::ApplyMutexMode();
  HOLDFAST_RETURN_IF_ERROR(CheckOptions(options));
  auto service = std::make_unique<Service>(options);
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<prometheus::Exposer> exposer;
  if (options.metrics_port >= 0) {
    metrics = std::make_unique<Metrics>();
    const std::string where =
        absl::StrCat(options.bind_address, ":", options.metrics_port);
    try {
      // Civetweb's defaults under prometheus-cpp (2 threads, a request
      // awaited 30 s) let 2 connections that send nothing hold the
      // endpoint for 30 s each: 16 threads, a request awaited 2 s.
      exposer = std::make_unique<prometheus::Exposer>(
          std::vector<std::string>{"listening_ports", where, "num_threads",
                                   "16", "request_timeout_ms", "2000"});
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(
          "controller: cannot serve metrics on ", where, ": ", e.what()));
    }
    exposer->RegisterCollectable(metrics->registry());
    service->membership().set_observer(metrics.get());
  }
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(
      absl::StrCat(options.bind_address, ":", options.port),
      ServerCredentials(options.tls), &bound_port);
  builder.RegisterService(service.get());
  // One controller per address: a second one on the port must fail to
  // bind, not share it (holdfast-run's nodes decide who serves by it).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Members ping every 10 s to spot a frozen controller; allow it.
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Requests are bounded by the store's limits plus framing.
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      options.limits.max_value_bytes + options.limits.max_key_bytes + 4096));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    return absl::UnavailableError(absl::StrCat("controller: cannot listen on ",
                                               options.bind_address, ":",
                                               options.port));
  }
  HOLDFAST_LOG_INFO("controller listening on {}:{}", options.bind_address,
                    bound_port);
  HOLDFAST_LOG_INFO(
      "controller: world size {}, heartbeat every {} ms, silent after {} ms, "
      "lease {} ms, stall floor {} ms",
      options.world_size,
      absl::ToInt64Milliseconds(options.detection.heartbeat_interval),
      absl::ToInt64Milliseconds(options.detection.silent_after),
      absl::ToInt64Milliseconds(Lease(options.detection)),
      absl::ToInt64Milliseconds(options.detection.stall_floor));
  return std::unique_ptr<ControllerServer>(new ServerImpl(
      std::move(service), std::move(metrics), std::move(exposer),
      std::move(server), options.bind_address, bound_port,
      options.scan_interval, options.detection.diagnosis_settle));
}

}  // namespace holdfast::control
