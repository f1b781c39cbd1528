#include "src/control/member/client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "src/control/wire/controller.grpc.pb.h"
#include "src/control/wire/rpc_util.h"

namespace holdfast::control {
namespace {

int64_t ToMillis(absl::Duration d) {
  return std::max<int64_t>(0, absl::ToInt64Milliseconds(d));
}

class ControllerStoreImpl final : public ControllerStore {
 public:
  // Connects at once, in the background: a standby's first call comes in
  // a recovery, which should not wait for a TLS handshake.
  explicit ControllerStoreImpl(const ClientOptions& o) : options_(o) {
    auto channel = ControllerChannel(o.address, o.tls);
    channel->GetState(/*try_to_connect=*/true);
    stub_ = Controller::NewStub(channel);
  }

  absl::Status Set(absl::string_view key, absl::string_view value) override {
    SetRequest req;
    req.set_key(std::string(key));
    req.set_value(std::string(value));
    SetResponse resp;
    auto ctx = Context(absl::ZeroDuration());
    return FromGrpc(stub_->Set(ctx.get(), req, &resp), "Set");
  }

  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override {
    GetRequest req;
    req.set_key(std::string(key));
    req.set_timeout_ms(std::max<int64_t>(1, ToMillis(timeout)));
    GetResponse resp;
    auto ctx = Context(timeout);
    absl::Status s = FromGrpc(stub_->Get(ctx.get(), req, &resp), "Get");
    if (!s.ok()) return s;
    return resp.value();
  }

  absl::StatusOr<std::optional<std::string>> TryGet(
      absl::string_view key) override {
    GetRequest req;
    req.set_key(std::string(key));
    req.set_timeout_ms(0);
    GetResponse resp;
    auto ctx = Context(absl::ZeroDuration());
    grpc::Status s = stub_->Get(ctx.get(), req, &resp);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      return std::optional<std::string>();
    }
    if (!s.ok()) return FromGrpc(s, "Get");
    return std::optional<std::string>(resp.value());
  }

  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override {
    WaitRequest req;
    for (const auto& k : keys) req.add_keys(k);
    req.set_timeout_ms(ToMillis(timeout));
    WaitResponse resp;
    auto ctx = Context(timeout);
    return FromGrpc(stub_->Wait(ctx.get(), req, &resp), "Wait");
  }

  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override {
    AddRequest req;
    req.set_key(std::string(key));
    req.set_delta(delta);
    AddResponse resp;
    auto ctx = Context(absl::ZeroDuration());
    absl::Status s = FromGrpc(stub_->Add(ctx.get(), req, &resp), "Add");
    if (!s.ok()) return s;
    return resp.value();
  }

  absl::StatusOr<std::pair<bool, std::string>> CompareAndSet(
      absl::string_view key, absl::string_view expected, bool expect_absent,
      absl::string_view desired) override {
    CompareAndSetRequest req;
    req.set_key(std::string(key));
    req.set_expected(std::string(expected));
    req.set_expect_absent(expect_absent);
    req.set_desired(std::string(desired));
    CompareAndSetResponse resp;
    auto ctx = Context(absl::ZeroDuration());
    absl::Status s =
        FromGrpc(stub_->CompareAndSet(ctx.get(), req, &resp), "CompareAndSet");
    if (!s.ok()) return s;
    return std::make_pair(resp.swapped(), resp.value());
  }

  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix) override {
    DeletePrefixRequest req;
    req.set_prefix(std::string(prefix));
    DeletePrefixResponse resp;
    auto ctx = Context(absl::ZeroDuration());
    absl::Status s =
        FromGrpc(stub_->DeletePrefix(ctx.get(), req, &resp), "DeletePrefix");
    if (!s.ok()) return s;
    return resp.deleted();
  }

 private:
  // A context with the token and a deadline of `wait` plus the slack.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration wait) const {
    return TokenContext(options_.token,
                        absl::Now() + wait + options_.rpc_slack);
  }

  const ClientOptions options_;
  std::unique_ptr<Controller::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<ControllerStore>> ControllerStore::Connect(
    const ClientOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("controller client: empty address");
  }
  if (options.token.empty()) {
    return absl::InvalidArgumentError("controller client: empty job token");
  }
  return std::shared_ptr<ControllerStore>(
      std::make_shared<ControllerStoreImpl>(options));
}

absl::StatusOr<StatusResponse> FetchStatus(const ClientOptions& options,
                                           const StatusRequest& request) {
  if (options.address.empty() || options.token.empty()) {
    return absl::InvalidArgumentError(
        "status: a controller address and a job token are required");
  }
  auto stub =
      Controller::NewStub(ControllerChannel(options.address, options.tls));
  auto ctx = TokenContext(options.token, absl::Now() + options.rpc_slack);
  StatusResponse resp;
  absl::Status s = FromGrpc(stub->Status(ctx.get(), request, &resp), "Status");
  if (!s.ok()) {
    return ExplainTls(s, options.address, options.tls.has_value());
  }
  return resp;
}

}  // namespace holdfast::control
