// TLS on the control plane: gRPC's own, with mutual authentication. The
// controller, the host agents, the members and the CLI load the same kind
// of files (holdfast/tls.h); the job token stays as a second check.
// Thread-safe (pure functions).
#ifndef HOLDFAST_SRC_CONTROL_WIRE_TLS_H_
#define HOLDFAST_SRC_CONTROL_WIRE_TLS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "holdfast/tls.h"

namespace holdfast::control {

// The files' contents.
struct TlsConfig {
  std::string ca_pem, cert_pem, key_pem;
  std::string server_name;  // "": the dialled host's
};

// HOLDFAST_TLS_CA, HOLDFAST_TLS_CERT, HOLDFAST_TLS_KEY and
// HOLDFAST_TLS_SERVER_NAME.
TlsFiles TlsFilesFromEnv();

// nullopt when `files` names none; InvalidArgument naming the file that is
// missing, unreadable or not PEM.
absl::StatusOr<std::optional<TlsConfig>> LoadTls(const TlsFiles& files);

// Plain TCP for nullopt.
std::shared_ptr<grpc::ChannelCredentials> ClientCredentials(
    const std::optional<TlsConfig>& tls);
// With TLS, a client must present a certificate the CA signed.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    const std::optional<TlsConfig>& tls);
// Sets the name the server's certificate is checked against, if given.
void SetServerName(const std::optional<TlsConfig>& tls,
                   grpc::ChannelArguments* args);

// When `s` (a failed call to a controller or agent at `address`) shows a
// failed TLS handshake: `s` with what to check; nullopt otherwise.
std::optional<absl::Status> TlsProblem(const absl::Status& s,
                                       const std::string& address);
// Whether `s` says the peer closed the connection as it was made (what a
// server that refuses a client's certificate, or a plain-TCP client,
// shows to the client).
bool ClosedByPeer(const absl::Status& s);
// TlsProblem's status, else `s`; a peer that closed the connection gets a
// hint: that it may refuse this process's certificate (`tls`), or serve
// TLS to a plain-TCP client.
absl::Status ExplainTls(const absl::Status& s, const std::string& address,
                        bool tls);

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_WIRE_TLS_H_
