// Helpers shared by the controller's clients and servers: status
// translation, call contexts that carry the job token, the channel to the
// controller and the token check. Thread-safe (pure functions).
#ifndef HOLDFAST_SRC_CONTROL_WIRE_RPC_UTIL_H_
#define HOLDFAST_SRC_CONTROL_WIRE_RPC_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "src/control/wire/auth.h"
#include "src/control/wire/controller.grpc.pb.h"
#include "src/control/wire/target.h"
#include "src/control/wire/tls.h"

namespace holdfast::control {

// A gRPC status as an absl::Status whose message says which call failed.
inline absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(
      static_cast<absl::StatusCode>(s.error_code()),
      absl::StrCat("controller ", what, ": ", s.error_message()));
}

// A call context with the token and `deadline` (infinite: none).
inline std::unique_ptr<grpc::ClientContext> TokenContext(
    const std::string& token, absl::Time deadline) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata(kTokenMetadataKey, token);
  if (deadline != absl::InfiniteFuture()) {
    ctx->set_deadline(absl::ToChronoTime(deadline));
  }
  return ctx;
}

// A channel to the controller, for a member or a host agent: it finds a
// restarted controller quickly (gRPC's default back-off reaches two
// minutes), and notices a frozen one without traffic.
// A list of addresses (several controllers, of which the leader listens;
// src/control/wire/target.h) expects a failover: it is retried faster, and
// pinged every second, so that a leader cut off (whose connections see no
// error) is left within two seconds, when its lease runs out too.
// `tls`: mutual TLS with the job's certificates (tls.h); nullopt: plain TCP.
inline std::shared_ptr<grpc::Channel> ControllerChannel(
    const std::string& address, const std::optional<TlsConfig>& tls) {
  const bool list = IsAddressList(address);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // gRPC takes this as the least time a connection attempt gets (TCP, the
  // TLS handshake, HTTP/2's settings): at 100 ms a TLS handshake on a
  // loaded machine timed out, and a rendezvous' store call failed. A list
  // keeps 100 ms, so that an address that does not answer (a leader cut
  // off) is left fast for the next.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, list ? 100 : 2000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(
                  ReconnectCap(address, absl::Seconds(2)))));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, list ? 1000 : 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, list ? 1000 : 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Never idle: a channel that went idle (gRPC's default: after 30 min
  // without a call, a standby's store) would reconnect, TLS handshake
  // included, in the recovery that uses it next.
  args.SetInt(GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS, INT_MAX);
  SetServerName(tls, &args);
  return grpc::CreateCustomChannel(ChannelTarget(address),
                                   ClientCredentials(tls), args);
}

// Waits until `channel` (to `address`, with TLS or not) connects, or
// `deadline`. A connection that fails its TLS handshake, or that the
// server closes as it is made three times in a row (it refuses this
// process's certificate, or a plain-TCP client), ends the wait at once
// with an error that says what to check (ExplainTls); any other failure
// (nobody listens yet) is waited out. OK when connected or at the deadline
// (the caller's next call reports that).
inline absl::Status AwaitChannel(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& address, bool tls,
                                 absl::Time deadline) {
  auto stub = Controller::NewStub(channel);
  int closed = 0;
  for (;;) {
    const grpc_connectivity_state state = channel->GetState(true);
    if (state == GRPC_CHANNEL_READY) return absl::OkStatus();
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      // A call that does not wait fails with the last attempt's error (a
      // probe: it reaches no server while the channel is down).
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
      GetRequest req;
      req.set_key("holdfast/connect-probe");
      req.set_timeout_ms(1);
      GetResponse resp;
      const absl::Status s = FromGrpc(stub->Get(&ctx, req, &resp), "connect");
      if (std::optional<absl::Status> p = TlsProblem(s, address)) return *p;
      closed = ClosedByPeer(s) ? closed + 1 : 0;
      if (closed == 3) return ExplainTls(s, address, tls);
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) return absl::OkStatus();
    channel->WaitForStateChange(
        state, absl::ToChronoTime(std::min(deadline, now + absl::Seconds(1))));
  }
}

// Whether a call on the serving side carries `token`.
inline bool HasToken(const grpc::CallbackServerContext& ctx,
                     const std::string& token) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(kTokenMetadataKey);
  return it != md.end() &&
         TokensEqual(absl::string_view(it->second.data(), it->second.size()),
                     token);
}

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_WIRE_RPC_UTIL_H_
