// Failure detection on real processes: holdfast_test_member children (fake
// trainers with the real MemberClient) are SIGKILLed, SIGSTOPped, stalled
// or left uneven, and the tests check what the controller concluded, what
// the survivors were told, and that a frozen member that wakes is fenced.
// Also: a controller restart under running members, `holdfast status`, and
// the Prometheus endpoint. Nothing here asserts on speed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "src/control/agent/agent.h"
#include "src/control/controller/server.h"
#include "src/control/member/client.h"
#include "src/control/wire/controller.grpc.pb.h"
#include "test/support/process_group.h"

using namespace holdfast;
using namespace holdfast::control;

namespace {

constexpr char kToken[] = "detection-test-token";
const absl::Duration kLong = absl::Seconds(30);

ControllerOptions Options(int world) {
  ControllerOptions o;
  o.token = kToken;
  o.world_size = world;
  o.detection.heartbeat_interval = absl::Milliseconds(100);
  o.detection.silent_after = absl::Seconds(1);
  o.detection.stall_floor = absl::Seconds(1);
  o.detection.stall_factor = 5;
  o.detection.stall_max_factor = 2;
  o.detection.stall_min_history = 8;
  o.scan_interval = absl::Milliseconds(20);
  return o;
}

// A file holding `token`, for the child processes.
std::string TokenFile(const std::string& token) {
  const std::string path = proc::MakeTempDir() + "/token";
  std::ofstream(path) << token << "\n";
  return path;
}

std::vector<std::string> Member(const std::string& address,
                                std::vector<std::string> extra = {}) {
  static const std::string token_file = TokenFile(kToken);
  std::vector<std::string> argv = {HOLDFAST_TEST_MEMBER_BIN, "--controller",
                                   address, "--token-file", token_file};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

StatusResponse GetStatus(const std::string& address) {
  ClientOptions c;
  c.address = address;
  c.token = kToken;
  StatusRequest r;
  r.set_include_members(true);
  r.set_max_incidents(100);
  auto s = FetchStatus(c, r);
  REQUIRE(s.ok());
  return *s;
}

// Polls the controller until an incident for `member` shows up.
std::optional<Incident> WaitIncident(const std::string& address,
                                     uint64_t member, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    const StatusResponse s = GetStatus(address);
    for (const Incident& i : s.incidents()) {
      if (i.member_id() == member) return i;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return std::nullopt;
}

struct Registered {
  uint64_t member;
  int slot;
};

Registered WaitRegistered(proc::ProcessGroup& g, int rank) {
  auto e = g.WaitEvent(rank, "registered", kLong);
  INFO("member " << rank << ": " << g.Describe(rank));
  REQUIRE(e.has_value());
  return {std::stoull(e->at("member")), std::stoi(e->at("slot"))};
}

// A connection to 127.0.0.1:`port`, or -1.
int ConnectLocal(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The response to GET `path`, "" if none came; each read waits up to
// 30 s.
std::string HttpGet(int port, const std::string& path) {
  const int fd = ConnectLocal(port);
  if (fd < 0) return "";
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string req =
      "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// Three members of the controller at `addr` (the commands of `g`) step;
// member `victim` is SIGKILLed. Its incident: crashed, of its slot, and
// each survivor got an abort order naming it.
Incident KillOneOfThree(const std::string& addr, proc::ProcessGroup& g,
                        int victim) {
  std::vector<Registered> reg;
  for (int r = 0; r < 3; ++r) reg.push_back(WaitRegistered(g, r));
  for (int r = 0; r < 3; ++r) REQUIRE(g.WaitEvent(r, "step", kLong));
  g.Signal(victim, SIGKILL);
  const Registered& v = reg[static_cast<size_t>(victim)];
  std::optional<Incident> inc = WaitIncident(addr, v.member, kLong);
  REQUIRE(inc.has_value());
  CHECK(inc->kind() == INCIDENT_CRASHED);
  CHECK(inc->slot() == v.slot);
  for (int r = 0; r < 3; ++r) {
    if (r == victim) continue;
    auto abort = g.WaitEvent(r, "abort", kLong);
    REQUIRE(abort.has_value());
    CHECK(abort->at("failed_slot") == std::to_string(v.slot));
    CHECK(abort->at("failed_member") == std::to_string(v.member));
    CHECK(abort->at("msg").find("crashed") != std::string::npos);
  }
  return *inc;
}

}  // namespace

TEST_CASE(
    "detection: a SIGKILLed member on the controller's machine is declared "
    "crashed as its process begins to exit, named as seen in /proc") {
  ControllerOptions o = Options(3);  // the process watch on, by default
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  // The victim holds 1 GiB, as a trainer holds its state: its stream ends
  // only after the kernel tore that down (about 60 ms), its /proc entry
  // says it is exiting at once.
  proc::ProcessGroup g(
      {Member(addr), Member(addr), Member(addr, {"--hold-mb", "1024"})});
  const Incident inc = KillOneOfThree(addr, g, 2);
  CHECK_THAT(inc.evidence(),
             Catch::Contains("seen in /proc by the controller"));
  // Nobody else: the survivors and the job go on.
  const StatusResponse s = GetStatus(addr);
  CHECK(s.alive() == 2);
  CHECK(s.dead() == 1);
}

TEST_CASE(
    "detection: a SIGKILLed member behind a host agent is reported by the "
    "agent as its process begins to exit") {
  ControllerOptions o = Options(3);
  // As a controller on another machine than the members: only their
  // host agent sees their processes.
  o.detection.exit_watch_interval = absl::ZeroDuration();
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  AgentOptions a;
  a.controller = (*server)->address();
  a.token = kToken;
  a.host = "h1";
  auto agent = HostAgent::Start(a);
  REQUIRE(agent.ok());
  const std::string via = (*agent)->address();
  proc::ProcessGroup g(
      {Member(via), Member(via), Member(via, {"--hold-mb", "1024"})});
  const Incident inc = KillOneOfThree((*server)->address(), g, 2);
  CHECK_THAT(inc.evidence(), Catch::Contains("on host agent h1"));
  CHECK_THAT(inc.evidence(),
             Catch::Contains("seen in /proc by the host agent"));
}

TEST_CASE(
    "detection: a SIGKILLed member is declared crashed and the "
    "survivors get an abort order") {
  ControllerOptions o = Options(3);
  o.metrics_port = 0;
  // As a controller on another machine sees it: by the stream's end.
  o.detection.exit_watch_interval = absl::ZeroDuration();
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  proc::ProcessGroup g({Member(addr), Member(addr), Member(addr)});
  const Incident inc = KillOneOfThree(addr, g, 1);
  CHECK(inc.evidence().find("stream") != std::string::npos);
  const uint64_t victim = inc.member_id();
  const int victim_slot = inc.slot();
  StatusResponse s = GetStatus(addr);
  CHECK(s.alive() == 2);
  CHECK(s.dead() == 1);
  CHECK(s.generation() == 1);

  // The Prometheus endpoint counts it (gauges refresh every second).
  std::string text;
  for (int i = 0; i < 100; ++i) {
    text = HttpGet((*server)->metrics_port(), "/metrics");
    if (text.find("holdfast_members{state=\"dead\"} 1") != std::string::npos) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  CHECK(text.find("holdfast_incidents_total{kind=\"crashed\"} 1") !=
        std::string::npos);
  CHECK(text.find("holdfast_members{state=\"dead\"} 1") != std::string::npos);
  CHECK(text.find("holdfast_members{state=\"alive\"} 2") != std::string::npos);
  CHECK(text.find("holdfast_heartbeats_total") != std::string::npos);
  CHECK(text.find("holdfast_detection_latency_seconds_count{kind=\"crashed\"} "
                  "1") != std::string::npos);

  // The culprit analysis: these members keep no communicator, so they
  // leave no abort notice; after the settle time the verdict rests on the
  // dead process alone, and is counted by kind and action.
  std::optional<Incident> judged;
  for (int i = 0; i < 100 && !judged.has_value(); ++i) {
    const StatusResponse now = GetStatus(addr);
    for (const Incident& x : now.incidents()) {
      if (x.member_id() == victim && x.has_diagnosis()) judged = x;
    }
    if (!judged.has_value()) absl::SleepFor(absl::Milliseconds(50));
  }
  REQUIRE(judged.has_value());
  CHECK(judged->diagnosis().kind() == "dead");
  REQUIRE(judged->diagnosis().culprits_size() == 1);
  CHECK(judged->diagnosis().culprits(0) == victim_slot);
  CHECK(judged->diagnosis().victims_size() == 2);
  CHECK(judged->diagnosis().action() == "replace");
  CHECK(judged->evicted());
  text = HttpGet((*server)->metrics_port(), "/metrics");
  CHECK(text.find("holdfast_diagnoses_total{action=\"replace\",kind=\"dead\"} "
                  "1") != std::string::npos);
}

TEST_CASE("the metrics endpoint answers while silent connections hold it") {
  // Civetweb's defaults under prometheus-cpp (2 threads, a request awaited
  // 30 s): 4 connections that sent nothing kept a scrape waiting past 40 s.
  ControllerOptions o = Options(3);
  o.metrics_port = 0;
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  std::vector<int> silent;
  for (int i = 0; i < 16; ++i) {
    silent.push_back(ConnectLocal((*server)->metrics_port()));
  }
  absl::SleepFor(absl::Milliseconds(100));  // taken first
  const absl::Time t0 = absl::Now();
  const std::string text = HttpGet((*server)->metrics_port(), "/metrics");
  const absl::Duration took = absl::Now() - t0;
  for (int fd : silent) {
    if (fd >= 0) close(fd);
  }
  INFO(absl::FormatDuration(took));
  CHECK(text.find("holdfast_heartbeats_total") != std::string::npos);
  CHECK(took < absl::Seconds(5));
}

TEST_CASE(
    "detection: a frozen member goes silent and is fenced when it "
    "wakes") {
  auto server = ControllerServer::Start(Options(2));
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  proc::ProcessGroup g(
      {Member(addr, {"--hb-ms", "100"}), Member(addr, {"--hb-ms", "100"})});
  std::vector<Registered> reg = {WaitRegistered(g, 0), WaitRegistered(g, 1)};
  REQUIRE(g.WaitEvent(1, "step", kLong));

  g.Signal(1, SIGSTOP);
  auto inc = WaitIncident(addr, reg[1].member, kLong);
  REQUIRE(inc.has_value());
  CHECK(inc->kind() == INCIDENT_SILENT);
  CHECK(inc->evidence().find("no heartbeat for") != std::string::npos);
  REQUIRE(g.WaitEvent(0, "abort", kLong));

  // It wakes up with its old identity: refused, and it stops.
  g.Signal(1, SIGCONT);
  auto fenced = g.WaitEvent(1, "fenced", kLong);
  INFO(g.Describe(1));
  REQUIRE(fenced.has_value());
  CHECK(fenced->at("code") == "FAILED_PRECONDITION");
  CHECK(fenced->at("msg").find("declared dead") != std::string::npos);
  g.Signal(0, SIGKILL);
  auto exits = g.WaitAll(kLong);
  CHECK(exits[1].exited);
  CHECK(exits[1].code == 3);
  // Every call with the old id is refused, whoever makes it.
  auto stub = Controller::NewStub(
      grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("x-holdfast-token", kToken);
  AckCheckpointRequest ack;
  ack.set_member_id(reg[1].member);
  ack.set_step(1);
  AckCheckpointResponse resp;
  CHECK(stub->AckCheckpoint(&ctx, ack, &resp).error_code() ==
        grpc::StatusCode::FAILED_PRECONDITION);
  grpc::ClientContext ctx2;
  ctx2.AddMetadata("x-holdfast-token", kToken);
  RegisterRequest resume;
  resume.set_resume(true);
  resume.set_member_id(reg[1].member);
  resume.set_slot(reg[1].slot);
  RegisterResponse rr;
  CHECK(stub->Register(&ctx2, resume, &rr).error_code() ==
        grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_CASE(
    "detection: a member alive but stuck inside its step is declared "
    "stalled") {
  auto server = ControllerServer::Start(Options(3));
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  proc::ProcessGroup g({Member(addr, {"--step-ms", "20"}),
                        Member(addr, {"--step-ms", "20", "--stall-at", "25"}),
                        Member(addr, {"--step-ms", "20"})});
  std::vector<Registered> reg;
  for (int r = 0; r < 3; ++r) reg.push_back(WaitRegistered(g, r));
  REQUIRE(g.WaitEvent(1, "stalling", kLong));
  auto inc = WaitIncident(addr, reg[1].member, kLong);
  REQUIRE(inc.has_value());
  CHECK(inc->kind() == INCIDENT_STALLED);
  CHECK(inc->evidence().find("step 24 has not advanced") != std::string::npos);
  // It was alive (heartbeating) all along: silence is not what fired.
  auto fenced = g.WaitEvent(1, "fenced", kLong);
  REQUIRE(fenced.has_value());
  // No one else was blamed.
  const StatusResponse after = GetStatus(addr);
  for (const Incident& i : after.incidents()) {
    CHECK(i.member_id() == reg[1].member);
  }
}

TEST_CASE("detection: uneven step times raise no false stall") {
  // Steps of 50 ms with a 300 ms "rollout" every 4th. With a 200 ms floor a
  // median-only rule (3 x 50 ms) would fire on every rollout; the history
  // (8 steps before the rule applies) has seen rollouts by then.
  ControllerOptions o = Options(2);
  o.detection.stall_floor = absl::Milliseconds(200);
  o.detection.stall_factor = 3;
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  const std::vector<std::string> args = {"--step-ms", "50", "--uneven",
                                         "--steps", "40"};
  proc::ProcessGroup g({Member(addr, args), Member(addr, args)});
  for (int r = 0; r < 2; ++r) WaitRegistered(g, r);
  for (int r = 0; r < 2; ++r) {
    auto done = g.WaitEvent(r, "done", absl::Minutes(2));
    INFO(g.Describe(r));
    REQUIRE(done.has_value());
  }
  StatusResponse s = GetStatus(addr);
  CHECK(s.incidents_total() == 0);
  CHECK(s.dead() == 0);
  CHECK(s.left() == 2);  // both said goodbye: a clean leave is no incident
  CHECK(s.stall_threshold_ms() >= 600);  // 2 x the longest (300 ms) step
  auto exits = g.WaitAll(kLong);
  for (const auto& e : exits) CHECK((e.exited && e.code == 0));
}

TEST_CASE("detection: a standby takes the slot of a crashed worker") {
  auto server = ControllerServer::Start(Options(2));
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  proc::ProcessGroup g({Member(addr)});
  Registered w0 = WaitRegistered(g, 0);
  g.Spawn(Member(addr));
  Registered w1 = WaitRegistered(g, 1);
  g.Spawn(Member(addr));
  Registered sb = WaitRegistered(g, 2);
  CHECK(w0.slot == 0);
  CHECK(w1.slot == 1);
  CHECK(sb.slot == -1);
  g.Signal(0, SIGKILL);
  auto m = g.WaitEvent(2, "membership", kLong);
  REQUIRE(m.has_value());
  CHECK(m->at("slot") == "0");
  CHECK(m->at("standby") == "0");
  CHECK(m->at("generation") == "1");
  StatusResponse s = GetStatus(addr);
  CHECK(s.vacant_slots() == 0);
  CHECK(s.standbys() == 0);
}

TEST_CASE(
    "restart: members ride out a controller restart and resume their "
    "slots") {
  const std::string token_file = TokenFile(kToken);
  const int port = FreePort();
  const std::string addr = absl::StrCat("127.0.0.1:", port);
  const std::vector<std::string> controller = {HOLDFAST_CONTROLLER_BIN,
                                               "--world-size",
                                               "2",
                                               "--port",
                                               std::to_string(port),
                                               "--token-file",
                                               token_file,
                                               "--heartbeat-interval-ms",
                                               "100"};
  proc::ProcessGroup g({controller});  // rank 0: the controller
  const int a = g.Spawn(Member(addr, {"--step-ms", "20"}));
  const int b = g.Spawn(Member(addr, {"--step-ms", "20"}));
  Registered ra = WaitRegistered(g, a);
  Registered rb = WaitRegistered(g, b);

  g.Signal(0, SIGKILL);
  // Training goes on while the controller is away; the members notice.
  for (int r : {a, b}) {
    bool saw_unhealthy = false;
    for (int i = 0; i < 2000 && !saw_unhealthy; ++i) {
      auto e = g.WaitEvent(r, "step", kLong);
      REQUIRE(e.has_value());
      saw_unhealthy = e->at("healthy") == "0";
    }
    CHECK(saw_unhealthy);
  }
  const int c2 = g.Spawn(controller);
  for (int r : {a, b}) {
    auto e = g.WaitEvent(r, "reconnected", kLong);
    INFO(g.Describe(r) << " / controller " << g.Describe(c2));
    REQUIRE(e.has_value());
  }
  StatusResponse s = GetStatus(addr);
  CHECK(s.alive() == 2);
  CHECK(s.incidents_total() == 0);
  CHECK(s.generation() == 0);
  std::map<uint64_t, int> slots;
  for (const auto& m : s.members()) slots[m.member_id()] = m.slot();
  CHECK(slots[ra.member] == ra.slot);
  CHECK(slots[rb.member] == rb.slot);
  // Nobody was disrupted: both keep stepping, healthy again.
  for (int r : {a, b}) {
    bool healthy = false;
    for (int i = 0; i < 2000 && !healthy; ++i) {
      auto e = g.WaitEvent(r, "step", kLong);
      REQUIRE(e.has_value());
      healthy = e->at("healthy") == "1";
    }
    CHECK(healthy);
    CHECK(g.Describe(r) == "still running");
  }
}

TEST_CASE(
    "restart: members refuse a controller of a lower epoch (a deposed "
    "leader) and resume under a higher one") {
  const int port = FreePort();
  const std::string addr = absl::StrCat("127.0.0.1:", port);
  auto at_epoch = [&](int64_t epoch) {
    ControllerOptions o = Options(2);
    o.port = port;
    o.epoch = epoch;
    auto server = ControllerServer::Start(o);
    REQUIRE(server.ok());
    return std::move(*server);
  };
  auto leader = at_epoch(5);
  proc::ProcessGroup g(
      {Member(addr, {"--step-ms", "20"}), Member(addr, {"--step-ms", "20"})});
  Registered r0 = WaitRegistered(g, 0);
  Registered r1 = WaitRegistered(g, 1);
  leader->Shutdown();
  // A deposed leader (epoch 3) at the address: no member resumes under it.
  auto deposed = at_epoch(3);
  for (int r : {0, 1}) {
    CHECK(!g.WaitEvent(r, "reconnected", absl::Seconds(2)).has_value());
  }
  deposed->Shutdown();
  auto next = at_epoch(7);
  for (int r : {0, 1}) {
    auto e = g.WaitEvent(r, "reconnected", kLong);
    INFO(g.Describe(r));
    REQUIRE(e.has_value());
  }
  StatusResponse s = GetStatus(addr);
  CHECK(s.alive() == 2);
  CHECK(s.incidents_total() == 0);
  std::map<uint64_t, int> slots;
  for (const auto& m : s.members()) slots[m.member_id()] = m.slot();
  CHECK(slots[r0.member] == r0.slot);
  CHECK(slots[r1.member] == r1.slot);
  next->Shutdown();
}

TEST_CASE("holdfast status prints the members table and the incidents") {
  auto server = ControllerServer::Start(Options(2));
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  proc::ProcessGroup g(
      {Member(addr, {"--host", "node-a"}), Member(addr, {"--host", "node-b"})});
  for (int r = 0; r < 2; ++r) WaitRegistered(g, r);
  REQUIRE(g.WaitEvent(0, "step", kLong));
  g.Signal(1, SIGKILL);
  REQUIRE(g.WaitEvent(0, "abort", kLong));

  const std::string good = TokenFile(kToken);
  const int cli = g.Spawn(
      {HOLDFAST_CLI_BIN, "status", "--controller", addr, "--token-file", good});
  std::string out;
  while (auto line = g.ReadLine(cli, kLong)) out += *line + "\n";
  INFO(out);
  CHECK(out.find("SLOT") != std::string::npos);
  CHECK(out.find("node-a") != std::string::npos);
  CHECK(out.find("alive") != std::string::npos);
  CHECK(out.find("crashed") != std::string::npos);
  CHECK(out.find("loss=") != std::string::npos);

  const int js = g.Spawn({HOLDFAST_CLI_BIN, "status", "--controller", addr,
                          "--token-file", good, "--json"});
  std::string json;
  while (auto line = g.ReadLine(js, kLong)) json += *line + "\n";
  auto parsed = nlohmann::json::parse(json);
  CHECK(parsed["members"].size() == 2);
  CHECK(parsed["incidents"][0]["kind"] == "INCIDENT_CRASHED");

  const int bad = g.Spawn({HOLDFAST_CLI_BIN, "status", "--controller", addr,
                           "--token-file", TokenFile("wrong")});
  while (g.ReadLine(bad, kLong)) {
  }
  g.Signal(0, SIGKILL);
  auto exits = g.WaitAll(kLong);
  CHECK(exits[cli].code == 0);
  CHECK(exits[js].code == 0);
  CHECK(exits[bad].exited);
  CHECK(exits[bad].code == 1);  // Unauthenticated
}

TEST_CASE(
    "a member whose threads cannot start (a pids limit) leaves with "
    "ResourceExhausted or goes on unheard, never std::terminate") {
  if (geteuid() != 0) {
    WARN("skipped: running a member with no threads left needs root");
    return;
  }
  // Per limit, a fresh controller (a finished member ends the job) and one
  // member running as a user of its own with RLIMIT_NPROC `limit` (every
  // thread counts). It "trains" 2 s, longer than the 1 s after which a
  // silent member is declared dead. (With a limit of 1 gRPC's Register
  // never returns: nothing to see.)
  std::set<std::string> seen;
  for (int limit = 2; limit <= 12; ++limit) {
    auto server = ControllerServer::Start(Options(1));
    REQUIRE(server.ok());
    const std::string addr = (*server)->address();
    proc::ProcessGroup g({Member(
        addr, {"--steps", "100", "--nproc-limit", std::to_string(limit)})});
    const proc::ProcessGroup::Exit e = g.WaitAll(absl::Seconds(12))[0];
    std::map<std::string, std::string> last;  // the last line of each event
    while (auto line = g.ReadLine(0, absl::Milliseconds(100))) {
      auto r = proc::ParseReport(*line);
      last[r["event"]] = *line;
    }
    const StatusResponse st = GetStatus(addr);
    auto incident = [&st](IncidentKind kind) {
      for (const Incident& i : st.incidents()) {
        if (i.kind() == kind) return true;
      }
      return false;
    };
    const bool done = last.count("done") == 1;
    const bool healthy_at_end =
        last.count("step") == 1 &&
        last["step"].find("healthy=1") != std::string::npos;
    std::string outcome;
    if (e.exited && e.code == 0 && done && healthy_at_end) {
      outcome = "worked";
    } else if (e.exited && e.code == 1 && last.count("error") &&
               last["error"].find("RESOURCE_EXHAUSTED: member: cannot start "
                                  "the heartbeat thread") !=
                   std::string::npos &&
               !incident(INCIDENT_CRASHED) && !incident(INCIDENT_SILENT)) {
      // Its heartbeat thread could not start: it said goodbye on the
      // calling thread, so the controller saw it leave, not crash or go
      // silent, and Join returned the error.
      outcome = "refused";
    } else if (e.exited && e.code == 0 && done && !healthy_at_end &&
               incident(INCIDENT_SILENT)) {
      // Its heartbeat stream could not start a reader: the client kept
      // trying with a back-off and said why in health(), the controller
      // heard nothing and declared it dead, and the process went on to
      // its end.
      outcome = "unheard";
    } else if (e.timed_out && (last.empty() || done)) {
      // Stuck in gRPC, whose own threads could not start: Register whose
      // deadline needs gRPC's timer thread (nothing printed), or gRPC's
      // teardown at exit (after "done"). Nothing of holdfast's.
      outcome = "grpc-stuck";
    }
    std::string lines;
    for (const auto& kv : last) lines += kv.second + "\n";
    INFO("RLIMIT_NPROC " << limit << ": exited " << e.exited << " code "
                         << e.code << " signal " << e.signal << " timed out "
                         << e.timed_out << "\n"
                         << lines);
    CHECK(!outcome.empty());
    seen.insert(outcome);
  }
  // The limit bit in the client's heartbeat thread (the case that used to
  // end in std::terminate), and with enough threads the member worked. In
  // between, most runs also have a limit that bites in a stream's reader
  // (which also ended in std::terminate), but where gRPC's own threads
  // bite first varies from run to run, so that one is not required.
  CHECK(seen.count("refused") == 1);
  CHECK(seen.count("worked") == 1);
  if (seen.count("unheard") == 0) {
    WARN("no limit bit in a heartbeat stream's reader this time");
  }
}
