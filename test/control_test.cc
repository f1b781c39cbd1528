// The controller's key-value store: semantics (including Wait timeouts),
// the gRPC service with token checks and bad requests, and communicators
// that rendezvous through a real holdfast-controller process.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <spdlog/sinks/ostream_sink.h>
#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <thread>

#include "holdfast/communicator.h"
#include "src/common/logging.h"
#include "src/control/controller/kv_store.h"
#include "src/control/controller/server.h"
#include "src/control/member/client.h"
#include "src/control/member/member.h"
#include "src/control/wire/auth.h"
#include "src/control/wire/controller.grpc.pb.h"
#include "test/support/process_group.h"

extern char** environ;

using namespace holdfast;
using namespace holdfast::control;

namespace {

// Waits for `done` to be called and returns its status.
struct WaitResult {
  absl::Mutex mu;
  bool done = false;
  absl::Status status;
  KvStore::WaitDone Callback() {
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu);
      status = s;
      done = true;
    };
  }
  absl::Status Get() {
    absl::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(30));
    return done ? status : absl::InternalError("callback never ran");
  }
};

}  // namespace

TEST_CASE(
    "kv store: set and get and counters and compare-and-set and delete by "
    "prefix") {
  KvStore kv;
  REQUIRE(kv.Set("g1/a", "x").ok());
  CHECK(**kv.Get("g1/a") == "x");
  CHECK(!kv.Get("g1/b")->has_value());
  CHECK(*kv.Add("g1/n", 5) == 5);
  CHECK(*kv.Add("g1/n", -2) == 3);
  CHECK(**kv.Get("g1/n") == "3");
  CHECK(kv.Add("g1/a", 1).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(kv.Add("g1/n", INT64_MAX).status().code() ==
        absl::StatusCode::kOutOfRange);
  auto cas = kv.CompareAndSet("g1/c", "", /*expect_absent=*/true, "first");
  CHECK(cas->first);
  cas = kv.CompareAndSet("g1/c", "", true, "second");
  CHECK(!cas->first);
  CHECK(cas->second == "first");
  cas = kv.CompareAndSet("g1/c", "first", false, "third");
  CHECK(cas->first);
  CHECK(**kv.Get("g1/c") == "third");
  REQUIRE(kv.Set("g2/a", "y").ok());
  CHECK(*kv.DeletePrefix("g1/") == 3);
  CHECK(!kv.Get("g1/a")->has_value());
  CHECK(kv.Get("g2/a")->has_value());
  CHECK(kv.DeletePrefix("").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "kv store: waits complete or time out or are cancelled or fail on "
    "shutdown") {
  auto kv = std::make_unique<KvStore>();
  {
    WaitResult now;  // keys already present
    REQUIRE(kv->Set("k0", "v").ok());
    kv->WaitAsync(kv->NewWaitId(), {"k0"}, absl::Seconds(5), now.Callback());
    CHECK(now.Get().ok());
  }
  {
    WaitResult later;
    kv->WaitAsync(kv->NewWaitId(), {"k1", "k2"}, absl::Seconds(30),
                  later.Callback());
    REQUIRE(kv->Set("k1", "v").ok());
    CHECK(!later.done);
    REQUIRE(kv->Add("k2", 1).ok());
    CHECK(later.Get().ok());
  }
  {
    WaitResult timeout;
    kv->WaitAsync(kv->NewWaitId(), {"k1", "never"}, absl::Milliseconds(50),
                  timeout.Callback());
    absl::Status s = timeout.Get();
    CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(s.message().find("never") != absl::string_view::npos);
    CHECK(s.message().find("k1") == absl::string_view::npos);  // only missing
  }
  {
    WaitResult cancelled;
    const uint64_t id = kv->NewWaitId();
    kv->WaitAsync(id, {"never"}, absl::Seconds(30), cancelled.Callback());
    kv->CancelWait(id);
    CHECK(cancelled.Get().code() == absl::StatusCode::kCancelled);
    kv->CancelWait(id);  // a second cancel is a no-op
  }
  {
    WaitResult bad;
    kv->WaitAsync(kv->NewWaitId(), {}, absl::Seconds(1), bad.Callback());
    CHECK(bad.Get().code() == absl::StatusCode::kInvalidArgument);
  }
  WaitResult orphan;
  kv->WaitAsync(kv->NewWaitId(), {"never"}, absl::Seconds(30),
                orphan.Callback());
  kv.reset();
  CHECK(orphan.Get().code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("kv store: limits give InvalidArgument naming the limit") {
  KvLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 16;
  KvStore kv(limits);
  CHECK(kv.Set("", "v").code() == absl::StatusCode::kInvalidArgument);
  absl::Status s = kv.Set("123456789", "v");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("limit of 8") != absl::string_view::npos);
  CHECK(kv.Set("k", std::string(17, 'x')).code() ==
        absl::StatusCode::kInvalidArgument);
  WaitResult w;
  kv.WaitAsync(kv.NewWaitId(), {"k"}, absl::Hours(2), w.Callback());
  CHECK(w.Get().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("controller service: the store over gRPC") {
  ControllerOptions o;
  o.token = "s3cret-token";
  o.world_size = 2;
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  auto store = ControllerStore::Connect({(*server)->address(), o.token});
  REQUIRE(store.ok());
  ControllerStore& s = **store;

  REQUIRE(s.Set("holdfast/g0/a", "1").ok());
  CHECK(*s.Get("holdfast/g0/a", absl::Seconds(1)) == "1");
  CHECK(!s.TryGet("holdfast/g0/missing")->has_value());
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    (void)s.Set("holdfast/g0/late", "2");
  });
  CHECK(*s.Get("holdfast/g0/late", absl::Seconds(10)) == "2");
  setter.join();
  auto late = s.Get("holdfast/g0/never", absl::Milliseconds(100));
  CHECK(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(s.Wait({"holdfast/g0/a", "holdfast/g0/never"}, absl::Milliseconds(100))
            .code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(s.Wait({"holdfast/g0/a", "holdfast/g0/late"}, absl::Seconds(1)).ok());
  CHECK(*s.Add("holdfast/g0/n", 3) == 3);
  CHECK(s.CompareAndSet("holdfast/g0/n", "3", false, "10")->first);
  CHECK(*s.DeletePrefix("holdfast/g0/") == 3);

  // Bad requests: clear errors, and the controller keeps serving.
  CHECK(s.Set("", "v").code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.Set(std::string(2000, 'k'), "v").code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(s.Set("big", std::string((4 << 20) + 1, 'v')).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(s.Wait({}, absl::Seconds(1)).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(s.DeletePrefix("").status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(s.Set("still", "serving").ok());
}

TEST_CASE("controller service: a wrong or missing token is refused") {
  ControllerOptions o;
  o.token = "right-token";
  o.world_size = 2;
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  auto wrong = ControllerStore::Connect({(*server)->address(), "wrong-token"});
  REQUIRE(wrong.ok());
  for (absl::Status st :
       {(*wrong)->Set("k", "v"), (*wrong)->Get("k", absl::Seconds(1)).status(),
        (*wrong)->TryGet("k").status(), (*wrong)->Wait({"k"}, absl::Seconds(1)),
        (*wrong)->Add("n", 1).status(),
        (*wrong)->CompareAndSet("k", "", true, "v").status(),
        (*wrong)->DeletePrefix("k").status()}) {
    CHECK(st.code() == absl::StatusCode::kUnauthenticated);
    CHECK(st.message().find("right-token") == absl::string_view::npos);
  }
  // No token at all (a raw stub without the metadata).
  auto stub = Controller::NewStub(grpc::CreateChannel(
      (*server)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  SetRequest req;
  req.set_key("k");
  SetResponse resp;
  CHECK(stub->Set(&ctx, req, &resp).error_code() ==
        grpc::StatusCode::UNAUTHENTICATED);
  // Tokens compare equal only when identical.
  CHECK(TokensEqual("abc", "abc"));
  CHECK(!TokensEqual("abc", "abd"));
  CHECK(!TokensEqual("abc", "abcd"));
  // The server refuses to start without a token.
  ControllerOptions none;
  CHECK(ControllerServer::Start(none).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the controller refuses a lease not shorter than the grace") {
  ControllerOptions o;
  o.token = "t";
  o.port = 0;
  o.world_size = 2;
  o.detection.silent_after = absl::Seconds(3);
  o.detection.lease = absl::Seconds(3);
  absl::Status s = ControllerServer::Start(o).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("lease 3s must be shorter than the silence "
                         "threshold (3s)") != absl::string_view::npos);
  o.detection.lease = absl::Milliseconds(-1);
  CHECK(ControllerServer::Start(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.detection.lease = absl::ZeroDuration();  // no lease
  auto server = ControllerServer::Start(o);
  INFO(server.status().ToString());
  CHECK(server.ok());
}

TEST_CASE("an unreachable controller gives Unavailable and no hang") {
  ClientOptions c;
  c.address = "127.0.0.1:1";  // nothing listens on port 1
  c.token = "t";
  c.rpc_slack = absl::Seconds(2);
  auto store = ControllerStore::Connect(c);
  REQUIRE(store.ok());
  absl::Status s = (*store)->Set("k", "v");
  CHECK((s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded));
}

TEST_CASE("communicators rendezvous through a holdfast-controller process") {
  const std::string dir = proc::MakeTempDir();
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << "job-token-123\n";
  const std::string port_file = dir + "/port";
  std::vector<std::string> args = {
      HOLDFAST_CONTROLLER_BIN, "--world-size", "3",           "--port", "0",
      "--token-file",          token_file,     "--port-file", port_file};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t controller = 0;
  REQUIRE(posix_spawn(&controller, argv[0], nullptr, nullptr, argv.data(),
                      environ) == 0);
  // Never leave the controller behind, whatever fails below: an orphan would
  // keep the test's output pipe open.
  struct Reaper {
    pid_t& pid;
    ~Reaper() {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } reaper{controller};
  int port = 0;
  for (int i = 0; i < 500 && port == 0; ++i) {
    std::ifstream in(port_file);
    if (!(in >> port)) port = 0;
    if (port == 0) absl::SleepFor(absl::Milliseconds(20));
  }
  REQUIRE(port > 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);

  // Ranks are threads: gRPC is not fork-safe once a process has used it,
  // and earlier cases of this binary may have.
  const int n = 3;
  std::vector<std::string> results(n);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < n; ++rank) {
    ranks.emplace_back([&, rank] {
      auto store = ControllerStore::Connect({address, "job-token-123"});
      if (!store.ok()) {
        results[rank] = store.status().ToString();
        return;
      }
      CommunicatorOptions o;
      o.rank = rank;
      o.size = n;
      o.generation = 7;
      o.timeout = absl::Seconds(30);
      o.connect_timeout = absl::Seconds(30);
      auto comm = Communicator::Create(*store, o);
      if (!comm.ok()) {
        results[rank] = comm.status().ToString();
        return;
      }
      std::vector<int64_t> v(100, rank + 1);
      absl::Status s =
          (*comm)
              ->AllReduce(v.data(), v.size(), DataType::kInt64, ReduceOp::kSum)
              ->Wait();
      results[rank] = s.ok() && v[0] == 6 && v[99] == 6 ? "ok" : s.ToString();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(results[r] == "ok");
  }
  // The rendezvous keys were namespaced by generation.
  auto store = ControllerStore::Connect({address, "job-token-123"});
  REQUIRE(store.ok());
  CHECK(*(*store)->DeletePrefix("holdfast/g7/") > 0);
  kill(controller, SIGTERM);
  int status = 0;
  waitpid(controller, &status, 0);
  controller = 0;  // reaped
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("holdfast-controller refuses to start without a token") {
  std::vector<std::string> args = {HOLDFAST_CONTROLLER_BIN, "--world-size", "2",
                                   "--port", "0"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("HOLDFAST_JOB_TOKEN=", 0) != 0) env.push_back(*e);
  }
  env.push_back(nullptr);
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(),
                      env.data()) == 0);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 2);
}

TEST_CASE("controller service: membership RPCs refuse a wrong token") {
  ControllerOptions o;
  o.token = "member-token";
  o.world_size = 2;
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  MemberOptions m;
  m.client = {(*server)->address(), "not-the-token"};
  m.connect_timeout = absl::Seconds(5);
  auto member = MemberClient::Join(m);
  CHECK(member.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(member.status().message().find("member-token") ==
        absl::string_view::npos);
  ClientOptions c{(*server)->address(), "not-the-token"};
  CHECK(FetchStatus(c, {}).status().code() ==
        absl::StatusCode::kUnauthenticated);
  // A heartbeat stream without the token ends at once, Unauthenticated.
  auto stub = Controller::NewStub(grpc::CreateChannel(
      (*server)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Heartbeat(&ctx);
  HeartbeatResponse resp;
  CHECK(!stream->Read(&resp));
  CHECK(stream->Finish().error_code() == grpc::StatusCode::UNAUTHENTICATED);
}

TEST_CASE("controller service: bad membership requests get InvalidArgument") {
  ControllerOptions o;
  o.token = "t";
  o.world_size = 2;
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  auto stub = Controller::NewStub(grpc::CreateChannel(
      (*server)->address(), grpc::InsecureChannelCredentials()));
  auto call = [&](auto method, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kTokenMetadataKey, "t");
    return (stub.get()->*method)(&ctx, req, resp).error_code();
  };
  RegisterRequest reg;
  reg.set_resume(true);
  reg.set_member_id(5);
  reg.set_slot(7);  // out of range for a world of 2
  RegisterResponse rr;
  CHECK(call(&Controller::Stub::Register, reg, &rr) ==
        grpc::StatusCode::INVALID_ARGUMENT);
  ReportFailureRequest rf;
  rf.set_member_id(99);  // unknown
  rf.set_peer_slot(0);
  ReportFailureResponse rfr;
  CHECK(call(&Controller::Stub::ReportFailure, rf, &rfr) ==
        grpc::StatusCode::INVALID_ARGUMENT);
  AckCheckpointRequest ack;
  ack.set_member_id(99);
  ack.set_step(-1);
  AckCheckpointResponse ackr;
  CHECK(call(&Controller::Stub::AckCheckpoint, ack, &ackr) ==
        grpc::StatusCode::INVALID_ARGUMENT);
  StatusRequest sr;
  sr.set_max_incidents(-1);
  StatusResponse srr;
  CHECK(call(&Controller::Stub::Status, sr, &srr) ==
        grpc::StatusCode::INVALID_ARGUMENT);
  // A heartbeat for an unknown member ends its stream with InvalidArgument.
  grpc::ClientContext ctx;
  ctx.AddMetadata(kTokenMetadataKey, "t");
  auto stream = stub->Heartbeat(&ctx);
  HeartbeatRequest hb;
  hb.set_member_id(424242);
  stream->Write(hb);
  HeartbeatResponse resp;
  CHECK(!stream->Read(&resp));
  grpc::Status st = stream->Finish();
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message().find("unknown member id") != std::string::npos);
  // The controller is still serving.
  ClientOptions c{(*server)->address(), "t"};
  CHECK(FetchStatus(c, {}).ok());
  // And it refuses to start with a bad world size.
  ControllerOptions bad = o;
  bad.world_size = 0;
  CHECK(ControllerServer::Start(bad).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

// The newest commit each of two members heard of (on_committed).
struct CommitWatch {
  absl::Mutex mu;
  int64_t committed[2] = {-1, -1};

  absl::StatusOr<std::unique_ptr<MemberClient>> Join(const MemberOptions& m,
                                                     int i) {
    MemberCallbacks cb;
    cb.on_committed = [this, i](int64_t s) {
      absl::MutexLock lock(&mu);
      committed[i] = std::max(committed[i], s);
    };
    return MemberClient::Join(m, cb);
  }
  int64_t Of(int i) {
    absl::MutexLock lock(&mu);
    return committed[i];
  }
  // Whether both heard of `step` within `timeout`.
  bool BothAt(int64_t step, absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto done = [&] { return committed[0] == step && committed[1] == step; };
    return mu.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
};

TEST_CASE(
    "member client: checkpoint acks on the heartbeat stream commit, and a "
    "stale or bad one is dropped or named") {
  ControllerOptions o;
  o.token = "t";
  o.world_size = 2;
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  MemberOptions m;
  m.client = {(*server)->address(), "t"};
  m.heartbeat_interval = absl::Milliseconds(20);
  CommitWatch w;
  auto a = w.Join(m, 0);
  REQUIRE(a.ok());
  auto b = w.Join(m, 1);
  REQUIRE(b.ok());
  ClientOptions co{(*server)->address(), "t"};
  auto both_at = [&](int64_t step) {
    return w.BothAt(step, absl::Seconds(10));
  };
  // One slot's ack commits nothing (its stream carried it: heartbeats
  // are 20 ms apart and the ack goes at once).
  (*a)->SendCheckpointAck(3, 0);
  absl::SleepFor(absl::Milliseconds(300));
  {
    auto st = FetchStatus(co, {});
    REQUIRE(st.ok());
    CHECK(st->committed_step() == -1);
    CHECK(w.Of(0) == -1);
  }
  // The second one does, and both members hear of it on their streams.
  (*b)->SendCheckpointAck(3, 0);
  CHECK(both_at(3));
  CHECK((*a)->assignment().committed_step == 3);
  // An ack of a generation the job is not at is dropped; the stream and
  // the member stay as they were.
  (*a)->SendCheckpointAck(4, 9);
  (*b)->SendCheckpointAck(4, 9);
  absl::SleepFor(absl::Milliseconds(300));
  {
    auto st = FetchStatus(co, {});
    REQUIRE(st.ok());
    CHECK(st->committed_step() == 3);
    CHECK(st->incidents_total() == 0);
    CHECK((*a)->health().ok());
    CHECK((*b)->health().ok());
    CHECK((*a)->reconnects() == 0);
  }
  (*a)->SendCheckpointAck(4, 0);
  (*b)->SendCheckpointAck(4, 0);
  CHECK(both_at(4));
  // A malformed ack ends its stream with InvalidArgument naming it.
  auto stub = Controller::NewStub(grpc::CreateChannel(
      (*server)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata(kTokenMetadataKey, "t");
  auto stream = stub->Heartbeat(&ctx);
  HeartbeatRequest hb;
  hb.set_member_id((*a)->assignment().member_id);
  hb.mutable_checkpoint_ack()->set_step(-2);
  stream->Write(hb);
  HeartbeatResponse resp;
  while (stream->Read(&resp)) {
  }
  grpc::Status st = stream->Finish();
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message().find("checkpoint ack step -2 is negative") !=
        std::string::npos);
  // It was named before it could take a's place: a's own stream goes on.
  absl::SleepFor(absl::Milliseconds(100));
  CHECK((*a)->reconnects() == 0);
  CHECK((*a)->health().ok());
  (*b)->Leave(/*finished=*/true);
  (*a)->Leave(/*finished=*/true);
}

TEST_CASE(
    "member client: an ack made while the controller is away goes with the "
    "next stream") {
  ControllerOptions o;
  o.token = "t";
  o.world_size = 2;
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  const int port = (*server)->port();
  MemberOptions m;
  m.client = {(*server)->address(), "t"};
  m.heartbeat_interval = absl::Milliseconds(20);
  m.reconnect_max = absl::Milliseconds(200);
  CommitWatch w;
  std::vector<std::unique_ptr<MemberClient>> members;
  for (int i = 0; i < 2; ++i) {
    auto c = w.Join(m, i);
    REQUIRE(c.ok());
    members.push_back(std::move(*c));
  }
  (*server)->Shutdown();
  // Both members notice, then ack while nobody listens.
  for (auto& c : members) {
    for (int i = 0; i < 500 && c->health().ok(); ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    CHECK(!c->health().ok());
    c->SendCheckpointAck(5, 0);
  }
  o.port = port;
  auto again = ControllerServer::Start(o);
  REQUIRE(again.ok());
  CHECK(w.BothAt(5, absl::Seconds(20)));
  for (auto& c : members) CHECK(c->reconnects() == 1);
  auto st = FetchStatus({(*again)->address(), "t"}, {});
  REQUIRE(st.ok());
  CHECK(st->committed_step() == 5);
  for (auto& c : members) c->Leave(/*finished=*/true);
}

TEST_CASE(
    "member client: slots and step reports and commits and a clean leave") {
  ControllerOptions o;
  o.token = "t";
  o.world_size = 2;
  auto server = ControllerServer::Start(o);
  REQUIRE(server.ok());
  MemberOptions m;
  m.client = {(*server)->address(), "t"};
  m.heartbeat_interval = absl::Milliseconds(50);
  absl::Mutex mu;
  int64_t committed = -1;
  MemberCallbacks cb;
  cb.on_committed = [&](int64_t s) {
    absl::MutexLock lock(&mu);
    committed = s;
  };
  auto a = MemberClient::Join(m, cb);
  auto b = MemberClient::Join(m);
  auto c = MemberClient::Join(m);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  CHECK((*a)->assignment().slot == 0);
  CHECK((*b)->assignment().slot == 1);
  CHECK((*c)->assignment().standby);
  CHECK((*a)->ReportStep(-1, absl::ZeroDuration()).code() ==
        absl::StatusCode::kInvalidArgument);
  REQUIRE((*a)->ReportStep(0, absl::Milliseconds(5), {{"loss", 2.5}}).ok());
  REQUIRE((*b)->ReportStep(0, absl::Milliseconds(5)).ok());
  CHECK(*(*a)->AckCheckpoint(0) == -1);
  CHECK(*(*b)->AckCheckpoint(0) == 0);
  {
    absl::MutexLock lock(&mu);
    CHECK(mu.AwaitWithTimeout(
        absl::Condition(
            +[](int64_t* v) { return *v == 0; }, &committed),
        absl::Seconds(10)));
  }
  // The report arrives with its metric.
  ClientOptions co{(*server)->address(), "t"};
  StatusRequest req;
  req.set_include_members(true);
  bool seen = false;
  for (int i = 0; i < 200 && !seen; ++i) {
    auto s = FetchStatus(co, req);
    REQUIRE(s.ok());
    for (const auto& mi : s->members()) {
      seen = seen || (mi.slot() == 0 && mi.step() == 0 &&
                      mi.metrics().count("loss") == 1 &&
                      mi.metrics().at("loss") == 2.5);
    }
    if (!seen) absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK(seen);
  (*c)->Leave();
  (*b)->Leave(/*finished=*/true);
  (*a)->Leave(/*finished=*/true);
  auto s = FetchStatus(co, {});
  REQUIRE(s.ok());
  CHECK(s->left() == 3);
  CHECK(s->incidents_total() == 0);
  CHECK(s->committed_step() == 0);
}

TEST_CASE(
    "controller service: an abandoned controller (a deposed leader) orders "
    "nothing: the streams it cuts are not taken for crashes") {
  // Abandon cancels every stream at once. Were each cut stream a crash,
  // the deposed leader would open generations and push them (and the
  // job's end) on the streams not yet cut, to members that the next
  // leader is about to adopt.
  // Its log says what it made of them.
  std::ostringstream log;
  auto& sinks = holdfast::log::Get().sinks();
  sinks.push_back(std::make_shared<spdlog::sinks::ostream_sink_mt>(log));
  {
    ControllerOptions o;
    o.token = "t";
    o.world_size = 4;
    o.epoch = 2;
    auto server = ControllerServer::Start(o);
    REQUIRE(server.ok());
    MemberOptions m;
    m.client = {(*server)->address(), "t"};
    m.heartbeat_interval = absl::Milliseconds(20);
    m.reconnect_max = absl::Milliseconds(200);
    std::atomic<int> orders{0};
    MemberCallbacks cb;
    cb.on_membership = [&](const MembershipUpdate&) { ++orders; };
    cb.on_abort = [&](const AbortOrder&) { ++orders; };
    cb.on_job_end = [&](const JobEnd&) { ++orders; };
    cb.on_fenced = [&](const absl::Status&) { ++orders; };
    std::vector<std::unique_ptr<MemberClient>> members;
    for (int i = 0; i < 6; ++i) {
      auto c = MemberClient::Join(m, cb);
      REQUIRE(c.ok());
      members.push_back(std::move(*c));
    }
    absl::SleepFor(absl::Milliseconds(100));
    const int before = orders.load();
    (*server)->Abandon();
    absl::SleepFor(absl::Milliseconds(300));
    CHECK(orders.load() == before);
    for (auto& c : members) CHECK(c->assignment().generation == 0);
    server->reset();
    members.clear();
  }
  sinks.pop_back();
  const std::string text = log.str();
  INFO(text);
  CHECK(text.find("incident") == std::string::npos);
  CHECK(text.find("generation 1") == std::string::npos);
  CHECK(text.find("job stopped") == std::string::npos);
}
