#include "src/control/wire/tls.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "src/common/config.h"

namespace holdfast::control {
namespace {

// The contents of `path`, which `what` names in errors; it must hold a PEM
// block.
absl::StatusOr<std::string> ReadPem(const std::string& what,
                                    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS: cannot read the ", what, " file '", path, "'"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string pem = ss.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TLS: the ", what, " file '", path, "' holds no PEM block"));
  }
  return pem;
}

}  // namespace

TlsFiles TlsFilesFromEnv() {
  TlsFiles f;
  f.ca = config::StringParam("HOLDFAST_TLS_CA");
  f.cert = config::StringParam("HOLDFAST_TLS_CERT");
  f.key = config::StringParam("HOLDFAST_TLS_KEY");
  f.server_name = config::StringParam("HOLDFAST_TLS_SERVER_NAME");
  return f;
}

absl::StatusOr<std::optional<TlsConfig>> LoadTls(const TlsFiles& files) {
  if (files.empty()) return std::nullopt;
  const std::pair<const char*, const std::string*> parts[] = {
      {"CA (HOLDFAST_TLS_CA, --tls-ca)", &files.ca},
      {"certificate (HOLDFAST_TLS_CERT, --tls-cert)", &files.cert},
      {"key (HOLDFAST_TLS_KEY, --tls-key)", &files.key}};
  for (const auto& [what, path] : parts) {
    if (path->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TLS: give the CA, the certificate and the key together; the ", what,
          " is missing"));
    }
  }
  TlsConfig c;
  auto ca = ReadPem("CA", files.ca);
  if (!ca.ok()) return ca.status();
  auto cert = ReadPem("certificate", files.cert);
  if (!cert.ok()) return cert.status();
  auto key = ReadPem("key", files.key);
  if (!key.ok()) return key.status();
  c.ca_pem = *std::move(ca);
  c.cert_pem = *std::move(cert);
  c.key_pem = *std::move(key);
  c.server_name = files.server_name;
  return c;
}

std::shared_ptr<grpc::ChannelCredentials> ClientCredentials(
    const std::optional<TlsConfig>& tls) {
  if (!tls.has_value()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = tls->ca_pem;
  o.pem_private_key = tls->key_pem;
  o.pem_cert_chain = tls->cert_pem;
  return grpc::SslCredentials(o);
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    const std::optional<TlsConfig>& tls) {
  if (!tls.has_value()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = tls->ca_pem;
  o.pem_key_cert_pairs.push_back({tls->key_pem, tls->cert_pem});
  return grpc::SslServerCredentials(o);
}

void SetServerName(const std::optional<TlsConfig>& tls,
                   grpc::ChannelArguments* args) {
  if (tls.has_value() && !tls->server_name.empty()) {
    args->SetSslTargetNameOverride(tls->server_name);
  }
}

bool ClosedByPeer(const absl::Status& s) {
  const std::string m = absl::AsciiStrToLower(s.message());
  return absl::StrContains(m, "socket closed") ||
         absl::StrContains(m, "connection reset");
}

std::optional<absl::Status> TlsProblem(const absl::Status& s,
                                       const std::string& address) {
  const std::string m = absl::AsciiStrToLower(s.message());
  // TLS's own words only: gRPC names plain TCP's connect steps
  // "handshakers" too ("tcp handshaker shutdown" is a connect timeout).
  const bool tls = absl::StrContains(m, "ssl") ||
                   absl::StrContains(m, "certificate") ||
                   absl::StrContains(m, "tlsv1 alert");
  if (s.ok() || !tls) return std::nullopt;
  return absl::Status(
      s.code(),
      absl::StrCat("the TLS handshake with ", address,
                   " failed: both sides need certificates of the job's CA "
                   "(HOLDFAST_TLS_CA, HOLDFAST_TLS_CERT, HOLDFAST_TLS_KEY; "
                   "holdfast-run makes them for a one-machine job), and the "
                   "server's must name the address dialled or "
                   "HOLDFAST_TLS_SERVER_NAME (",
                   s.message(), ")"));
}

absl::Status ExplainTls(const absl::Status& s, const std::string& address,
                        bool tls) {
  if (std::optional<absl::Status> p = TlsProblem(s, address)) return *p;
  if (!ClosedByPeer(s)) return s;
  return absl::Status(
      s.code(),
      absl::StrCat(s.message(), " (", address,
                   tls ? " closed the connection after the TLS handshake: it "
                         "may refuse this process's certificate, which must "
                         "be signed by the job's CA (HOLDFAST_TLS_CERT)"
                       : " closed a plain-TCP connection: if it serves TLS, "
                         "give this process the job's HOLDFAST_TLS_CA, "
                         "HOLDFAST_TLS_CERT and HOLDFAST_TLS_KEY",
                   ")"));
}

}  // namespace holdfast::control
