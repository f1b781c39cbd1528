// TLS on the control plane (docs/security.md): the job's certificates
// made by holdfast-run's private CA, a controller and a host agent that
// serve mutual TLS, and clients with a wrong certificate, a wrong token,
// or none, refused by name without changing the job.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "absl/time/clock.h"
#include "src/control/agent/agent.h"
#include "src/control/controller/server.h"
#include "src/control/member/client.h"
#include "src/control/member/member.h"
#include "src/control/wire/tls.h"
#include "test/support/process_group.h"
#include "tools/tls_ca.h"

using namespace holdfast;
using namespace holdfast::control;

namespace {

constexpr char kToken[] = "tls-test-token";

// A job's certificates, made in a fresh private directory.
TlsConfig Certificates() {
  const std::string dir = proc::MakeTempDir();
  absl::StatusOr<TlsFiles> files = run::MakeJobCertificates(dir, {});
  REQUIRE(files.ok());
  absl::StatusOr<std::optional<TlsConfig>> tls = LoadTls(*files);
  REQUIRE(tls.ok());
  REQUIRE(tls->has_value());
  return **tls;
}

std::unique_ptr<ControllerServer> Serve(const TlsConfig& tls) {
  ControllerOptions o;
  o.token = kToken;
  o.world_size = 2;
  o.tls = tls;
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  return *std::move(server);
}

absl::StatusOr<StatusResponse> Status(const std::string& address,
                                      std::optional<TlsConfig> tls,
                                      const std::string& token = kToken) {
  ClientOptions c;
  c.address = address;
  c.token = token;
  c.rpc_slack = absl::Seconds(5);
  c.tls = std::move(tls);
  StatusRequest req;
  req.set_include_members(true);
  return FetchStatus(c, req);
}

bool Has(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != absl::string_view::npos;
}

}  // namespace

TEST_CASE("tls: the job's certificates are private files the CA signed") {
  const std::string dir = proc::MakeTempDir();
  absl::StatusOr<TlsFiles> files =
      run::MakeJobCertificates(dir, {"10.0.0.7", "node-a"});
  REQUIRE(files.ok());
  for (const std::string& path : {files->ca, files->cert, files->key}) {
    struct stat st;
    REQUIRE(stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
  }
  // The CA's own key is not written: only the job's three files.
  CHECK_FALSE(std::ifstream(dir + "/ca-key.pem").good());
  auto tls = LoadTls(*files);
  REQUIRE(tls.ok());
  CHECK((*tls)->key_pem.find("PRIVATE KEY") != std::string::npos);
}

TEST_CASE("tls: bad TLS settings are refused by name") {
  CHECK_FALSE(LoadTls(TlsFiles{})->has_value());  // none: plain TCP
  const std::string dir = proc::MakeTempDir();
  auto files = run::MakeJobCertificates(dir, {});
  REQUIRE(files.ok());
  TlsFiles no_key = *files;
  no_key.key.clear();
  auto s = LoadTls(no_key);
  CHECK(s.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Has(s.status(), "the key (HOLDFAST_TLS_KEY, --tls-key) is missing"));
  TlsFiles missing = *files;
  missing.cert = dir + "/nope.pem";
  CHECK(Has(LoadTls(missing).status(),
            "cannot read the certificate file '" + dir + "/nope.pem'"));
  std::ofstream(dir + "/junk.pem") << "not a certificate\n";
  TlsFiles junk = *files;
  junk.ca = dir + "/junk.pem";
  CHECK(Has(LoadTls(junk).status(), "holds no PEM block"));
}

TEST_CASE(
    "tls: the controller takes only clients with the job's certificate and "
    "token: the others are refused by name and change nothing") {
  const TlsConfig job = Certificates();
  const TlsConfig other = Certificates();  // another job's CA
  auto server = Serve(job);
  const std::string addr = server->address();

  auto ok = Status(addr, job);
  REQUIRE(ok.ok());
  CHECK(ok->members_size() == 0);

  // The right certificates and a wrong token: the token still counts.
  auto bad_token = Status(addr, job, "not-the-token");
  CHECK(bad_token.status().code() == absl::StatusCode::kUnauthenticated);

  // Another CA's certificate and CA: this client does not trust the
  // controller's certificate.
  auto s = Status(addr, other);
  CHECK(Has(s.status(), "the TLS handshake with " + addr + " failed"));

  // The job's CA but another CA's certificate: the controller refuses it.
  TlsConfig mixed = other;
  mixed.ca_pem = job.ca_pem;
  s = Status(addr, mixed);
  CHECK_FALSE(s.ok());
  CHECK(Has(s.status(), "may refuse this process's certificate"));

  // Plain TCP: refused, with a hint.
  s = Status(addr, std::nullopt);
  CHECK_FALSE(s.ok());
  CHECK(Has(s.status(), "if it serves TLS"));

  // A member with another CA's certificate fails at once, long before its
  // connect timeout, and never joins.
  MemberOptions m;
  m.client.address = addr;
  m.client.token = kToken;
  m.client.tls = other;
  m.connect_timeout = absl::Seconds(30);
  const absl::Time t0 = absl::Now();
  auto member = MemberClient::Join(m);
  CHECK_FALSE(member.ok());
  CHECK(Has(member.status(), "the TLS handshake with " + addr + " failed"));
  CHECK(absl::Now() - t0 < absl::Seconds(10));

  // A member with the job's certificate joins; the job has it alone.
  m.client.tls = job;
  auto good = MemberClient::Join(m);
  REQUIRE(good.ok());
  auto after = Status(addr, job);
  REQUIRE(after.ok());
  CHECK(after->members_size() == 1);
  CHECK(after->incidents_total() == 0);
  (*good)->Leave(/*finished=*/false);
}

TEST_CASE("tls: a host agent serves its members over TLS too") {
  const TlsConfig job = Certificates();
  auto server = Serve(job);
  AgentOptions a;
  a.controller = server->address();
  a.token = kToken;
  a.tls = job;
  auto agent = HostAgent::Start(a);
  REQUIRE(agent.ok());
  MemberOptions m;
  m.client.address = (*agent)->address();
  m.client.token = kToken;
  m.client.tls = job;
  m.connect_timeout = absl::Seconds(30);
  auto member = MemberClient::Join(m);
  REQUIRE(member.ok());
  // Without a certificate, the agent refuses the member at once.
  m.client.tls = std::nullopt;
  const absl::Time t0 = absl::Now();
  auto plain = MemberClient::Join(m);
  CHECK_FALSE(plain.ok());
  CHECK(Has(plain.status(), "if it serves TLS"));
  CHECK(absl::Now() - t0 < absl::Seconds(10));
  auto st = Status(server->address(), job);
  REQUIRE(st.ok());
  CHECK(st->members_size() == 1);
  (*member)->Leave(/*finished=*/false);
}

TEST_CASE("tls: only TLS's own words make a failure a TLS problem") {
  // gRPC calls plain TCP's connect steps handshakers too: a connect that
  // timed out is no certificate problem, and a member must wait it out.
  const absl::Status timeout = absl::UnavailableError(
      "failed to connect to all addresses; last error: UNKNOWN: "
      "ipv4:10.0.0.1:29400: tcp handshaker shutdown");
  CHECK_FALSE(TlsProblem(timeout, "10.0.0.1:29400").has_value());
  const absl::Status tls = absl::UnavailableError(
      "failed to connect to all addresses; last error: UNKNOWN: "
      "ipv4:10.0.0.1:29400: Ssl handshake failed: SSL_ERROR_SSL: "
      "error:0A000086:SSL routines::certificate verify failed");
  auto p = TlsProblem(tls, "10.0.0.1:29400");
  REQUIRE(p.has_value());
  CHECK(Has(*p, "the TLS handshake with 10.0.0.1:29400 failed"));
}
