#include "src/control/server.h"

#include <grpcpp/grpcpp.h>

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <atomic>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "src/common/config.h"
#include "src/common/logging.h"
#include "src/control/auth.h"
#include "src/control/controller.grpc.pb.h"
#include "src/control/diagnosis.h"
#include "src/store/keys.h"

namespace holdfast::control {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

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
                     Finish(ToGrpc(s));
                   });
  }
  void OnCancel() override { kv_->CancelWait(id_); }
  void OnDone() override { delete this; }

 private:
  KvStore* const kv_;
  const uint64_t id_;
};

// One member's heartbeat stream. Reads step reports into Membership; pushes
// what Membership queues, one write at a time, merging what piles up (so a
// slow reader costs one pending message, not a growing queue). Deletes
// itself when gRPC is done with it.
class HeartbeatReactor final
    : public grpc::ServerBidiReactor<HeartbeatRequest, HeartbeatResponse>,
      public MemberSink {
 public:
  HeartbeatReactor(Membership* membership, bool authorized)
      : membership_(membership) {
    if (!authorized) {
      CloseStream(absl::UnauthenticatedError("missing or wrong job token"));
      return;
    }
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The member closed its side, or the connection broke.
      Detach(leaving_ ? "left" : "stream ended without a goodbye");
      Close(absl::OkStatus());
      return;
    }
    absl::Status s = membership_->Heartbeat(req_, this, absl::Now());
    if (!s.ok()) {
      Detach(absl::StrCat("bad heartbeat: ", s.message()));
      Close(s);
      return;
    }
    member_id_ = req_.member_id();
    if (req_.has_checkpoint_ack()) {
      AckCheckpointRequest ack;
      ack.set_member_id(req_.member_id());
      ack.set_generation(req_.checkpoint_ack().generation());
      ack.set_step(req_.checkpoint_ack().step());
      s = membership_->AckCheckpoint(ack, absl::Now(), this).status();
      if (s.code() == absl::StatusCode::kInvalidArgument) {
        Detach(absl::StrCat("bad checkpoint ack: ", s.message()));
        Close(s);
        return;
      }
      // Else (FailedPrecondition) an ack of another generation, whose
      // news reaches the member on this stream, or a standby's: it counts
      // for nothing and the stream goes on.
    }
    if (req_.leaving()) {
      finished_ = req_.finished();
      leaving_ = true;
    }
    if (req_.want_ack()) {
      HeartbeatResponse ack;
      ack.set_ack_seq(req_.seq());
      Push(ack);
    }
    StartRead(&req_);
  }

  void OnCancel() override { Detach("connection lost"); }

  void OnWriteDone(bool ok) override {
    std::optional<absl::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (finish_pending_) {
        finish_pending_ = false;
        finish = finish_status_;
      } else if (!ok || !TakePendingLocked()) {
        return;  // a broken stream shows on the read side
      } else {
        writing_ = true;
      }
    }
    if (finish.has_value()) {
      FinishWith(*finish);
      return;
    }
    StartWrite(&out_);
  }

  void OnDone() override {
    Detach("stream done");
    delete this;
  }

  void Push(const HeartbeatResponse& msg) override {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      if (msg.has_membership()) {
        *pending_.mutable_membership() = msg.membership();
      }
      if (msg.has_abort()) *pending_.mutable_abort() = msg.abort();
      if (msg.has_committed_step() &&
          (!pending_.has_committed_step() ||
           msg.committed_step() > pending_.committed_step())) {
        pending_.set_committed_step(msg.committed_step());
      }
      if (msg.has_ack_seq()) pending_.set_ack_seq(msg.ack_seq());
      if (msg.has_job_end()) *pending_.mutable_job_end() = msg.job_end();
      has_pending_ = true;
      if (writing_ || !TakePendingLocked()) return;
      writing_ = true;
    }
    StartWrite(&out_);
  }

  // Membership drops its pointer to this sink whenever it calls Close, so
  // after a Close no detach is needed.
  void Close(const absl::Status& status) override { CloseStream(status); }

  bool Closed() const override {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  void CloseStream(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = true;
      detached_ = true;
      if (writing_) {
        finish_pending_ = true;
        finish_status_ = status;
        return;
      }
    }
    FinishWith(status);
  }

  // Moves pending_ into out_ for the next write; false if nothing pends.
  bool TakePendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!has_pending_) return false;
    out_.Clear();
    out_.Swap(&pending_);
    has_pending_ = false;
    return true;
  }

  void FinishWith(const absl::Status& s) {
    Finish(grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                        std::string(s.message())));
  }

  void Detach(absl::string_view why) {
    {
      absl::MutexLock lock(&mu_);
      if (detached_) return;
      detached_ = true;
    }
    if (member_id_ != 0) {
      membership_->Detach(member_id_, this, leaving_, finished_, why,
                          absl::Now());
    }
  }

  Membership* const membership_;
  HeartbeatRequest req_;  // read side only
  // Set by the read side, read by OnCancel too.
  std::atomic<uint64_t> member_id_{0};
  std::atomic<bool> leaving_{false};
  std::atomic<bool> finished_{false};

  mutable absl::Mutex mu_;
  HeartbeatResponse pending_ ABSL_GUARDED_BY(mu_);
  bool has_pending_ ABSL_GUARDED_BY(mu_) = false;
  HeartbeatResponse out_;  // owned by the one write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool detached_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_pending_ ABSL_GUARDED_BY(mu_) = false;
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
        kv_(o.limits),
        membership_(o.world_size, o.detection, absl::Now(), o.membership_limits,
                    o.recovery) {}

  Membership& membership() { return membership_; }
  KvStore& kv() { return kv_; }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const RegisterRequest* req,
                                     RegisterResponse* resp) override {
    return Reply(ctx, [&]() -> absl::Status {
      auto r = membership_.Register(*req, absl::Now());
      if (!r.ok()) return r.status();
      *resp = std::move(*r);
      return absl::OkStatus();
    });
  }

  grpc::ServerBidiReactor<HeartbeatRequest, HeartbeatResponse>* Heartbeat(
      grpc::CallbackServerContext* ctx) override {
    return new HeartbeatReactor(&membership_, Authorized(ctx));
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
    const auto& md = ctx->client_metadata();
    auto it = md.find(kTokenMetadataKey);
    return it != md.end() &&
           TokensEqual(absl::string_view(it->second.data(), it->second.size()),
                       token_);
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
      reactor->Finish(ToGrpc(handler()));
    }
    return reactor;
  }

  const std::string token_;
  KvStore kv_;
  Membership membership_;
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
  void Shutdown() override {
    if (server_ == nullptr) return;
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    detector_.join();
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
    exposer_.reset();
  }

 private:
  void DetectLoop() {
    absl::Time next_refresh = absl::InfinitePast();
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      mu_.AwaitWithTimeout(absl::Condition(&stop_), scan_interval_);
      if (stop_) break;
      const absl::Time now = absl::Now();
      service_->membership().Scan(now);
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
      for (SlotEvidence& s : c.slots) {
        if (s.liveness != SlotEvidence::Liveness::kAlive) continue;
        absl::StatusOr<std::optional<std::string>> notice =
            service_->kv().Get(keys::AbortNotice(c.generation, s.slot));
        if (notice.ok() && notice->has_value()) ReadNotice(**notice, &s);
        all = all && s.answered;
      }
      if (!all && now < c.since + settle_) continue;
      const Verdict v = m.SetDiagnosis(c.generation, Diagnose(c.slots), now);
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

absl::StatusOr<std::unique_ptr<ControllerServer>> ControllerServer::Start(
    const ControllerOptions& options) {
  config::ApplyMutexMode();
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
  auto service = std::make_unique<Service>(options);
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<prometheus::Exposer> exposer;
  if (options.metrics_port >= 0) {
    metrics = std::make_unique<Metrics>();
    const std::string where =
        absl::StrCat(options.bind_address, ":", options.metrics_port);
    try {
      exposer = std::make_unique<prometheus::Exposer>(where);
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
      grpc::InsecureServerCredentials(), &bound_port);
  builder.RegisterService(service.get());
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
