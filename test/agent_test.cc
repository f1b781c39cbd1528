// Host agents (src/control/agent/agent.h) in process: members behind an agent
// register, report, commit, renew their leases and use the store as they
// would with the controller; a generation change reaches them merged per
// host; bad input on either side is named. The process-level faults (a
// member killed, an agent killed or restarted) are in test/agent.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "src/control/agent/agent.h"
#include "src/control/controller/server.h"
#include "src/control/member/client.h"
#include "src/control/member/member.h"
#include "src/control/wire/auth.h"
#include "src/control/wire/controller.grpc.pb.h"

using namespace holdfast;
using namespace holdfast::control;

namespace {

constexpr char kToken[] = "agent-token";

std::unique_ptr<ControllerServer> StartController(int world) {
  ControllerOptions o;
  o.token = kToken;
  o.world_size = world;
  o.detection.heartbeat_interval = absl::Milliseconds(100);
  o.scan_interval = absl::Milliseconds(20);
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  return std::move(*server);
}

std::unique_ptr<HostAgent> StartAgent(const ControllerServer& c,
                                      const std::string& host,
                                      const std::string& listen = "") {
  AgentOptions a;
  a.controller = c.address();
  a.token = kToken;
  a.host = host;
  if (!listen.empty()) a.listen = listen;
  auto agent = HostAgent::Start(a);
  REQUIRE(agent.ok());
  return std::move(*agent);
}

// What each member heard: the newest generation and commit.
struct Heard {
  absl::Mutex mu;
  std::vector<int64_t> generation, committed;
  explicit Heard(int n) : generation(n, -1), committed(n, -1) {}
  MemberCallbacks For(int i) {
    MemberCallbacks cb;
    cb.on_membership = [this, i](const MembershipUpdate& u) {
      absl::MutexLock lock(&mu);
      generation[i] = std::max(generation[i], u.generation());
    };
    cb.on_committed = [this, i](int64_t s) {
      absl::MutexLock lock(&mu);
      committed[i] = std::max(committed[i], s);
    };
    return cb;
  }
  // Whether members `who` all heard `want` or newer within `timeout`.
  bool All(std::vector<int64_t> Heard::*what, int64_t want,
           std::vector<int> who, absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto done = [&] {
      for (int i : who) {
        if ((this->*what)[static_cast<size_t>(i)] < want) return false;
      }
      return true;
    };
    return mu.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
};

}  // namespace

TEST_CASE(
    "host agent: members behind it register and report and commit and "
    "renew their leases and use the store and hear a new generation") {
  auto controller = StartController(3);
  auto agent = StartAgent(*controller, "hostA");
  MemberOptions m;
  m.client = {agent->address(), kToken};
  m.host = "hostA";
  Heard heard(4);
  std::vector<std::unique_ptr<MemberClient>> members;
  for (int i = 0; i < 4; ++i) {  // 3 workers and a standby
    auto c = MemberClient::Join(m, heard.For(i));
    REQUIRE(c.ok());
    members.push_back(std::move(*c));
  }
  CHECK(members[3]->assignment().standby);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(
        members[i]->ReportStep(0, absl::Milliseconds(5), {{"loss", 1.5}}).ok());
  }
  // One ack through a call passed on, then two on the streams (batched
  // by the agent): the commit reaches every worker.
  CHECK(*members[2]->AckCheckpoint(0, 0) == -1);
  members[0]->SendCheckpointAck(0, 0);
  members[1]->SendCheckpointAck(0, 0);
  CHECK(heard.All(&Heard::committed, 0, {0, 1, 2}, absl::Seconds(10)));
  // Every member is bound; its reports arrived with their metric.
  ClientOptions co{controller->address(), kToken};
  StatusRequest req;
  req.set_include_members(true);
  bool seen = false;
  for (int i = 0; i < 300 && !seen; ++i) {
    auto s = FetchStatus(co, req);
    REQUIRE(s.ok());
    int reported = 0;
    for (const auto& mi : s->members()) {
      if (mi.connected() && mi.host() == "hostA" && mi.step() == 0 &&
          mi.slot() >= 0 && mi.metrics().count("loss") == 1) {
        ++reported;
      }
    }
    seen = reported == 3 && agent->members() == 4 && agent->connected();
    if (!seen) absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK(seen);
  // The lease is renewed through the agent (the controller acks members'
  // beats; the acks come back in the host's messages).
  const absl::Duration lease = members[0]->lease();
  REQUIRE(lease > absl::ZeroDuration());
  absl::SleepFor(lease);
  for (auto& c : members) CHECK(c->Unheard(absl::Now()) < lease);
  // The store, through the agent.
  auto store = ControllerStore::Connect({agent->address(), kToken});
  REQUIRE(store.ok());
  REQUIRE((*store)->Set("holdfast/agent/k", "v").ok());
  CHECK(*(*store)->Get("holdfast/agent/k", absl::Seconds(1)) == "v");
  CHECK((*store)
            ->Get("holdfast/agent/none", absl::Milliseconds(50))
            .status()
            .code() == absl::StatusCode::kDeadlineExceeded);
  // A worker leaves unfinished: the others, and the standby that takes
  // its slot, hear generation 1.
  members[2]->Leave(false);
  CHECK(heard.All(&Heard::generation, 1, {0, 1, 3}, absl::Seconds(10)));
  CHECK(members[3]->assignment().slot == 2);
  for (auto& c : members) c->Leave(true);
  auto end = FetchStatus(co, {});
  REQUIRE(end.ok());
  CHECK(end->incidents_total() == 1);
}

TEST_CASE(
    "host agent: restarts under a storm of beats lose no member and a "
    "generation opened meanwhile reaches the members that were away") {
  auto controller = StartController(3);
  const std::string listen =
      absl::StrCat("unix:/tmp/holdfast-agent-test-", getpid(), ".sock");
  auto agent = StartAgent(*controller, "hostR", listen);
  Heard heard(4);
  MemberOptions behind;
  behind.client = {agent->address(), kToken};
  behind.host = "hostR";
  behind.reconnect_max = absl::Milliseconds(200);
  MemberOptions direct;
  direct.client = {controller->address(), kToken};
  direct.host = "hostD";
  std::vector<std::unique_ptr<MemberClient>> members;
  for (int i = 0; i < 4; ++i) {  // slots 0 and 1 behind it, 2 and a standby
    auto c = MemberClient::Join(i < 2 ? behind : direct, heard.For(i));
    REQUIRE(c.ok());
    members.push_back(std::move(*c));
  }
  REQUIRE(members[3]->assignment().standby);
  // The members behind the agent report as fast as they can, so that
  // beats arrive while it stops.
  std::atomic<bool> done{false};
  std::vector<std::thread> storm;
  for (int i = 0; i < 2; ++i) {
    storm.emplace_back([&, i] {
      for (int64_t step = 0; !done; ++step) {
        (void)members[i]->ReportStep(step, absl::Microseconds(200));
        absl::SleepFor(absl::Microseconds(200));
      }
    });
  }
  ClientOptions co{controller->address(), kToken};
  for (int round = 0; round < 8; ++round) {
    absl::SleepFor(absl::Milliseconds(50));
    agent->Handover();
    agent = StartAgent(*controller, "hostR", listen);
  }
  // Once more, and while nobody is behind it, slot 2 is lost: the standby
  // takes it in generation 1, which slots 0 and 1 must still hear.
  agent->Handover();
  agent.reset();
  members[2]->Leave(false);
  CHECK(heard.All(&Heard::generation, 1, {3}, absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(300));
  agent = StartAgent(*controller, "hostR", listen);
  CHECK(heard.All(&Heard::generation, 1, {0, 1}, absl::Seconds(10)));
  done = true;
  for (auto& t : storm) t.join();
  auto st = FetchStatus(co, {});
  REQUIRE(st.ok());
  // The one incident is slot 2's leaving: no member behind the agent was
  // declared lost.
  CHECK(st->incidents_total() == 1);
  for (const Incident& i : st->incidents()) {
    CHECK(i.slot() == 2);
    CHECK(i.host() == "hostD");
  }
  for (auto& c : members) c->Leave(true);
}

TEST_CASE("host agent: bad input is named and nothing else is lost") {
  auto controller = StartController(2);
  auto agent = StartAgent(*controller, "hostB");
  // A member with a wrong token, through the agent.
  MemberOptions wrong;
  wrong.client = {agent->address(), "not-the-token"};
  wrong.connect_timeout = absl::Seconds(5);
  CHECK(MemberClient::Join(wrong).status().code() ==
        absl::StatusCode::kUnauthenticated);
  // Host streams: an agent takes none; the controller takes none without
  // the token.
  {
    auto stub = Controller::NewStub(grpc::CreateChannel(
        agent->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.AddMetadata(kTokenMetadataKey, kToken);
    auto s = stub->HostStream(&ctx);
    HostResponse r;
    CHECK(!s->Read(&r));
    CHECK(s->Finish().error_code() == grpc::StatusCode::UNIMPLEMENTED);
  }
  auto stub = Controller::NewStub(grpc::CreateChannel(
      controller->address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kTokenMetadataKey, "wrong");
    auto s = stub->HostStream(&ctx);
    HostResponse r;
    CHECK(!s->Read(&r));
    CHECK(s->Finish().error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
  // On a host stream, a beat of an unknown member closes that member
  // only (InvalidArgument, named); a good member on the same stream goes
  // on, and its ack comes back.
  MemberOptions m;
  m.client = {controller->address(), kToken};
  RegisterRequest reg;
  reg.set_host("hostC");
  RegisterResponse good;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kTokenMetadataKey, kToken);
    REQUIRE(stub->Register(&ctx, reg, &good).ok());
  }
  grpc::ClientContext ctx;
  ctx.AddMetadata(kTokenMetadataKey, kToken);
  auto s = stub->HostStream(&ctx);
  HostRequest hr;
  hr.set_host("hostC");
  hr.add_beats()->set_member_id(12345);
  HeartbeatRequest* b = hr.add_beats();
  b->set_member_id(good.member_id());
  b->set_want_ack(true);
  b->set_seq(7);
  REQUIRE(s->Write(hr));
  bool closed = false, acked = false;
  HostResponse r;
  while ((!closed || !acked) && s->Read(&r)) {
    for (const MemberClose& c : r.closes()) {
      CHECK(c.member_id() == 12345);
      CHECK(c.code() == static_cast<int>(absl::StatusCode::kInvalidArgument));
      CHECK(c.message().find("unknown member id 12345") != std::string::npos);
      closed = true;
    }
    for (const MemberPush& p : r.pushes()) {
      if (p.member_id() == good.member_id() && p.msg().ack_seq() == 7) {
        acked = true;
      }
    }
  }
  CHECK(closed);
  CHECK(acked);
  // A clean goodbye for the good member: it left, nobody crashed.
  HostRequest bye;
  MemberGone* g = bye.add_gone();
  g->set_member_id(good.member_id());
  g->set_leaving(true);
  g->set_finished(true);
  REQUIRE(s->Write(bye));
  s->WritesDone();
  while (s->Read(&r)) {
  }
  CHECK(s->Finish().ok());
  auto st = FetchStatus({controller->address(), kToken}, {});
  REQUIRE(st.ok());
  CHECK(st->left() == 1);
  CHECK(st->dead() == 0);
  // Bad options.
  AgentOptions a;
  CHECK(HostAgent::Start(a).status().code() ==
        absl::StatusCode::kInvalidArgument);
  a.controller = controller->address();
  CHECK(HostAgent::Start(a).status().code() ==
        absl::StatusCode::kInvalidArgument);
  a.token = kToken;
  a.listen = "256.0.0.1:99999";
  CHECK(HostAgent::Start(a).status().code() == absl::StatusCode::kUnavailable);
}
