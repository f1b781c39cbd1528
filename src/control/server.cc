#include "src/control/server.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "src/common/logging.h"
#include "src/control/auth.h"
#include "src/control/controller.grpc.pb.h"

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

class Service final : public Controller::CallbackService {
 public:
  Service(std::string token, KvLimits limits)
      : token_(std::move(token)), kv_(limits) {}

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
};

class ServerImpl final : public ControllerServer {
 public:
  ServerImpl(std::unique_ptr<Service> service,
             std::unique_ptr<grpc::Server> server, std::string host, int port)
      : service_(std::move(service)),
        server_(std::move(server)),
        host_(std::move(host)),
        port_(port) {}
  ~ServerImpl() override { Shutdown(); }

  int port() const override { return port_; }
  std::string address() const override {
    return absl::StrCat(host_, ":", port_);
  }
  void Shutdown() override {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
  }

 private:
  std::unique_ptr<Service> service_;  // outlives server_ (declared first)
  std::unique_ptr<grpc::Server> server_;
  const std::string host_;
  const int port_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ControllerServer>> ControllerServer::Start(
    const ControllerOptions& options) {
  if (options.token.empty()) {
    return absl::InvalidArgumentError(
        "controller: a job token is required (--token-file or "
        "HOLDFAST_JOB_TOKEN)");
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("controller: port ", options.port, " is out of range"));
  }
  auto service = std::make_unique<Service>(options.token, options.limits);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(
      absl::StrCat(options.bind_address, ":", options.port),
      grpc::InsecureServerCredentials(), &bound_port);
  builder.RegisterService(service.get());
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
  return std::unique_ptr<ControllerServer>(new ServerImpl(
      std::move(service), std::move(server), options.bind_address, bound_port));
}

}  // namespace holdfast::control
