// Heartbeat-load benchmark for the controller. For each rank count N it
// starts a fresh holdfast-controller process pinned to one core, registers
// N simulated members from this process (other cores), and beats for them
// at --rate Hz each from --procs driver processes (other cores):
//   - by default as N / R simulated hosts of R ranks (--ranks-per-host),
//     each one host agent's stream (HostStream) that carries its R
//     members' beats in one message per period, as holdfast-agent does;
//   - with --ranks-per-host 0, as N streams of their own (Heartbeat), the
//     members' direct path and this benchmark's baseline.
// Beats ask for acks (latency probes) 1 in --ack-every. Besides the
// simulated ranks, real processes join (this binary in --member mode,
// using MemberClient): a victim worker behind a holdfast-agent of its own,
// and a real host of R standbys behind another (with --ranks-per-host 0,
// all directly). It reports:
//   - controller CPU per rank heartbeat and the fraction of its one core
//   - p50/p99 round trip of a probe (send to ack, measured here: an upper
//     bound on the controller's handling latency), and the ratio to the
//     same figure for a single idle stream measured first in the same run
//   - controller memory per rank (RSS growth / N)
//   - host loss: the real host's agent SIGKILLed (direct: all its member
//     processes), from the kill to the last of its members' incidents
//   - crash detection: the victim SIGKILLed, from the kill to the
//     controller's incident
//   - push: from that kill to the moment every simulated rank has received
//     the generation it opened.
//
// The JSON's goal_met: at least 99 % of the offered heartbeats handled, the
// controller under one core, p99 under 10 ms, crash, push and host loss
// under 1 s.
//
//   heartbeat_bench [--members 16000,64000,100000] [--ranks-per-host 8]
//                   [--seconds 10] [--rate 1] [--channels 64] [--procs 4]
//                   [--ack-every 10] [--json]
#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "src/common/config.h"
#include "src/control/member/client.h"
#include "src/control/member/member.h"
#include "src/control/wire/auth.h"
#include "src/control/wire/controller.grpc.pb.h"
#include "test/support/process_group.h"

using namespace holdfast;
using namespace holdfast::control;
using nlohmann::json;

namespace {

constexpr char kToken[] = "heartbeat-bench-token";

std::string SelfDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

std::string SelfExe() { return SelfDir() + "/heartbeat_bench"; }

// utime + stime of a process, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  // Fields after the command (which may hold spaces) start after ')'.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  long long utime = 0, stime = 0;
  for (int i = 3; rest >> field; ++i) {
    if (i == 14) utime = std::stoll(field);
    if (i == 15) {
      stime = std::stoll(field);
      break;
    }
  }
  return static_cast<double>(utime + stime) /
         static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Resident set size in bytes.
double RssBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      double kb = 0;
      in >> kb;
      return kb * 1024.0;
    }
    in.ignore(1 << 16, '\n');
  }
  return 0;
}

// Pins every thread of `pid` (now and, by inheritance, later) to `cpu`.
bool PinProcess(pid_t pid, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  bool ok = true;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  while (dirent* e = readdir(d)) {
    const int tid = std::atoi(e->d_name);
    if (tid > 0) ok = sched_setaffinity(tid, sizeof(set), &set) == 0 && ok;
  }
  closedir(d);
  return ok;
}

struct Latencies {
  absl::Mutex mu;
  std::vector<double> us ABSL_GUARDED_BY(mu);
  std::vector<int64_t> sent_ns ABSL_GUARDED_BY(mu);  // when each was sent
  bool recording ABSL_GUARDED_BY(mu) = false;
  void Record(int64_t sent, double v) {
    absl::MutexLock lock(&mu);
    if (!recording) return;
    us.push_back(v);
    sent_ns.push_back(sent);
  }
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1));
  return v[i];
}

// When the simulated ranks of one driver process first heard a generation
// newer than the job's first (each rank, and all of them).
struct PushWatch {
  std::atomic<int64_t> ranks{0};    // ranks that heard it
  std::atomic<int64_t> last_ns{0};  // when the last of them did
  void Heard(int n) {
    ranks += n;
    const int64_t now = absl::GetCurrentTimeNanos();
    int64_t prev = last_ns.load();
    while (prev < now && !last_ns.compare_exchange_weak(prev, now)) {
    }
  }
};

// One simulated member's stream. A ticker thread calls TrySend; the ack's
// round trip goes into `lat`.
class SimStream final
    : public grpc::ClientBidiReactor<HeartbeatRequest, HeartbeatResponse> {
 public:
  // Asks for an ack on one heartbeat in `ack_every` (the acks are this
  // benchmark's latency probes).
  SimStream(Controller::Stub* stub, uint64_t id, Latencies* lat,
            int ack_every = 1, PushWatch* push = nullptr)
      : id_(id), lat_(lat), ack_every_(ack_every), push_(push) {
    ctx_.AddMetadata(kTokenMetadataKey, kToken);
    stub->async()->Heartbeat(&ctx_, this);
    StartRead(&resp_);
    StartCall();
  }

  // False if the previous write is still in flight (then skipped).
  bool TrySend(int64_t step) {
    if (writing_.exchange(true)) return false;
    ++seq_;
    req_.set_member_id(id_);
    req_.set_seq(seq_);
    req_.set_want_ack((seq_ + id_) % static_cast<uint64_t>(ack_every_) == 0);
    req_.mutable_report()->set_step(step);
    req_.mutable_report()->set_phase(PHASE_COMPUTING);
    sent_ns_[seq_ % kRing].store(absl::GetCurrentTimeNanos());
    StartWrite(&req_);
    return true;
  }

  void OnWriteDone(bool ok) override {
    if (!ok) failed_ = true;
    writing_ = false;
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (resp_.has_ack_seq()) {
      const int64_t sent = sent_ns_[resp_.ack_seq() % kRing].load();
      lat_->Record(
          sent, static_cast<double>(absl::GetCurrentTimeNanos() - sent) / 1e3);
    }
    if (resp_.has_membership() && resp_.membership().generation() > 0 &&
        push_ != nullptr && !heard_) {
      heard_ = true;
      push_->Heard(1);
    }
    StartRead(&resp_);
  }
  void OnDone(const grpc::Status&) override {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  void AwaitDone() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }
  bool failed() const { return failed_; }

 private:
  static constexpr int kRing = 64;
  const uint64_t id_;
  Latencies* const lat_;
  const int ack_every_;
  PushWatch* const push_;
  bool heard_ = false;  // read side only
  grpc::ClientContext ctx_;
  HeartbeatRequest req_;
  HeartbeatResponse resp_;
  std::atomic<bool> writing_{false};
  std::atomic<bool> failed_{false};
  uint64_t seq_ = 0;
  std::atomic<int64_t> sent_ns_[kRing] = {};
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// One simulated host: a host agent's stream carrying its ranks' beats, one
// message per period with a beat of each (as holdfast-agent batches them).
// A message whose beats ask for an ack is a latency probe: from its send
// to the first ack of it.
class SimHost final
    : public grpc::ClientBidiReactor<HostRequest, HostResponse> {
 public:
  SimHost(Controller::Stub* stub, std::string host, std::vector<uint64_t> ids,
          Latencies* lat, int ack_every, PushWatch* push)
      : ids_(std::move(ids)), lat_(lat), ack_every_(ack_every), push_(push) {
    ctx_.AddMetadata(kTokenMetadataKey, kToken);
    req_.set_host(std::move(host));
    stub->async()->HostStream(&ctx_, this);
    StartRead(&resp_);
    StartCall();
  }

  bool TrySend(int64_t step) {
    if (writing_.exchange(true)) return false;
    ++seq_;
    if (seq_ > 1) req_.clear_host();
    req_.clear_beats();
    for (uint64_t id : ids_) {
      HeartbeatRequest* b = req_.add_beats();
      b->set_member_id(id);
      b->set_seq(seq_);
      b->set_want_ack((seq_ + id) % static_cast<uint64_t>(ack_every_) == 0);
      b->mutable_report()->set_step(step);
      b->mutable_report()->set_phase(PHASE_COMPUTING);
    }
    sent_ns_[seq_ % kRing].store(absl::GetCurrentTimeNanos());
    StartWrite(&req_);
    return true;
  }

  void OnWriteDone(bool ok) override {
    if (!ok) failed_ = true;
    writing_ = false;
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    int heard = 0;
    for (const MemberPush& p : resp_.pushes()) {
      if (p.msg().has_ack_seq() && p.msg().ack_seq() > last_acked_) {
        last_acked_ = p.msg().ack_seq();
        const int64_t sent = sent_ns_[last_acked_ % kRing].load();
        lat_->Record(
            sent,
            static_cast<double>(absl::GetCurrentTimeNanos() - sent) / 1e3);
      }
      if (p.msg().has_membership() && p.msg().membership().generation() > 0 &&
          heard_.insert(p.member_id()).second) {
        ++heard;
      }
    }
    if (heard > 0 && push_ != nullptr) push_->Heard(heard);
    StartRead(&resp_);
  }
  void OnDone(const grpc::Status&) override {}

 private:
  static constexpr int kRing = 64;
  const std::vector<uint64_t> ids_;
  Latencies* const lat_;
  const int ack_every_;
  PushWatch* const push_;
  grpc::ClientContext ctx_;
  HostRequest req_;
  HostResponse resp_;
  std::atomic<bool> writing_{false};
  std::atomic<bool> failed_{false};
  uint64_t seq_ = 0;
  uint64_t last_acked_ = 0;   // read side only
  std::set<uint64_t> heard_;  // read side only
  std::atomic<int64_t> sent_ns_[kRing] = {};
};

struct RunResult {
  int members = 0;
  int ranks_per_host = 0;  // 0: direct streams
  double seconds = 0;
  uint64_t heartbeats = 0;
  double cpu_us_per_hb = 0;
  double core_fraction = 0;
  double p50_ms = 0, p99_ms = 0;
  double idle_p50_ms = 0, idle_p99_ms = 0;
  double rss_per_member_bytes = 0;
  double crash_detect_ms = -1;
  double push_ms = -1;  // -1: not every simulated rank heard it
  int64_t push_ranks = 0;
  double host_loss_ms = -1;
  uint64_t skipped = 0;
  bool pinned = false;
};

StatusResponse Status(const std::string& addr, int incidents) {
  ClientOptions c{addr, kToken};
  StatusRequest r;
  r.set_max_incidents(incidents);
  auto s = FetchStatus(c, r);
  return s.ok() ? *s : StatusResponse();
}

// Sends heartbeats from `senders` (SimStream or SimHost) for `d` at `rate`
// Hz each, sender k (of global index first + k * stride of n) at offset
// index/n of each period, from `threads` ticker threads. Returns how many
// sends were skipped because the sender's previous write was in flight.
template <typename Sender>
uint64_t Drive(std::vector<std::unique_ptr<Sender>>& senders, double rate,
               absl::Duration d, int threads, size_t first = 0,
               size_t stride = 1, size_t n = 0) {
  std::atomic<uint64_t> skipped{0};
  const absl::Time start = absl::Now();
  const absl::Duration period = absl::Seconds(1.0 / rate);
  if (n == 0) n = senders.size();
  const size_t count = senders.size();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::vector<size_t> mine;
      for (size_t i = static_cast<size_t>(t); i < count;
           i += static_cast<size_t>(threads)) {
        mine.push_back(i);
      }
      size_t cursor = 0;
      int64_t cycle = 0;
      auto fire = [&](size_t k) {
        if (!senders[mine[k]]->TrySend(cycle)) ++skipped;
      };
      for (;;) {
        const absl::Duration el = absl::Now() - start;
        if (el >= d) {
          // The period's last senders, if a late wake-up passed their time.
          while (cursor < mine.size()) fire(cursor++);
          break;
        }
        // FDivDuration: Duration / Duration is integer division.
        const double cycles = absl::FDivDuration(el, period);
        const int64_t now_cycle = static_cast<int64_t>(cycles);
        if (now_cycle != cycle) {
          while (cursor < mine.size()) fire(cursor++);  // catch up
          cursor = 0;
          cycle = now_cycle;
        }
        const double frac = cycles - static_cast<double>(now_cycle);
        while (cursor < mine.size() &&
               static_cast<double>(first + mine[cursor] * stride) /
                       static_cast<double>(n) <=
                   frac) {
          fire(cursor++);
        }
        absl::SleepFor(absl::Microseconds(500));
      }
    });
  }
  for (auto& t : ts) t.join();
  return skipped;
}

// Polls the controller until each of `ids` has an incident (or `timeout`);
// returns the latest detection time in unix ms, or -1.
int64_t AwaitIncidents(const std::string& addr,
                       const std::vector<uint64_t>& ids,
                       absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    StatusRequest req;
    req.set_max_incidents(1024);  // all the controller keeps
    // A controller busy with a push to every rank answers late.
    auto got = FetchStatus({addr, kToken, absl::Seconds(60)}, req);
    if (!got.ok()) {
      std::fprintf(stderr, "heartbeat_bench: status: %s\n",
                   got.status().ToString().c_str());
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    const StatusResponse& s = *got;
    int64_t latest = -1;
    size_t found = 0;
    for (uint64_t id : ids) {
      for (const Incident& i : s.incidents()) {
        if (i.member_id() == id) {
          ++found;
          latest = std::max(latest, i.detected_unix_ms());
          break;
        }
      }
    }
    if (found == ids.size()) return latest;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return -1;
}

RunResult RunOne(int members, int per_host, double seconds, double rate,
                 int channels, int cpus, int ack_every, int procs) {
  RunResult r;
  r.members = members;
  r.ranks_per_host = per_host;
  const int real_ranks = std::max(per_host, 8);
  const std::string dir = proc::MakeTempDir();
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << kToken << "\n";
  const std::string port_file = dir + "/port";
  // Workers: the idle-baseline stream, the N simulated ranks and the
  // victim; the real host's ranks are standbys.
  proc::ProcessGroup g(
      {{SelfDir() + "/holdfast-controller", "--world-size",
        std::to_string(members + 2), "--port", "0", "--token-file", token_file,
        "--port-file", port_file, "--heartbeat-interval-ms",
        std::to_string(static_cast<int>(1000 / rate)),
        // Registering 100k members takes a while before their streams
        // start beating.
        "--silent-after-ms", "60000"}});
  int port = 0;
  for (int i = 0; i < 1000 && port == 0; ++i) {
    std::ifstream in(port_file);
    if (!(in >> port)) port = 0;
    if (port == 0) absl::SleepFor(absl::Milliseconds(10));
  }
  if (port == 0) {
    std::fprintf(stderr, "controller did not start: %s\n",
                 g.Describe(0).c_str());
    std::exit(1);
  }
  const std::string addr = absl::StrCat("127.0.0.1:", port);
  // The controller gets core 0; this process the others.
  r.pinned = cpus > 1 && PinProcess(g.pid(0), 0);
  if (cpus > 1) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c = 1; c < cpus; ++c) CPU_SET(c, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  const double rss0 = RssBytes(g.pid(0));

  std::vector<std::shared_ptr<grpc::Channel>> chans;
  std::vector<std::unique_ptr<Controller::Stub>> stubs;
  for (int c = 0; c < channels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("holdfast.bench.channel", c);  // distinct connections
    chans.push_back(grpc::CreateCustomChannel(
        addr, grpc::InsecureChannelCredentials(), args));
    stubs.push_back(Controller::NewStub(chans.back()));
  }

  // Baseline: one stream on an idle controller, acks one at a time. The
  // stream stays open (a worker) until the end.
  Latencies idle;
  std::unique_ptr<SimStream> idle_stream;
  {
    RegisterRequest req;
    req.set_host("idle");
    RegisterResponse resp;
    grpc::ClientContext ctx;
    ctx.AddMetadata(kTokenMetadataKey, kToken);
    if (!stubs[0]->Register(&ctx, req, &resp).ok()) std::exit(1);
    idle_stream =
        std::make_unique<SimStream>(stubs[0].get(), resp.member_id(), &idle);
    {
      absl::MutexLock lock(&idle.mu);
      idle.recording = true;
    }
    for (int i = 0; i < 300; ++i) {
      while (!idle_stream->TrySend(i)) absl::SleepFor(absl::Microseconds(50));
      absl::SleepFor(absl::Milliseconds(3));
    }
    absl::SleepFor(absl::Milliseconds(50));
    absl::MutexLock lock(&idle.mu);
    r.idle_p50_ms = Percentile(idle.us, 0.5) / 1e3;
    r.idle_p99_ms = Percentile(idle.us, 0.99) / 1e3;
  }

  // Register N members (from a few threads), then open their streams.
  const int host_size = per_host > 0 ? per_host : 8;
  std::vector<uint64_t> ids(static_cast<size_t>(members));
  {
    std::vector<std::thread> ts;
    const int nt = 8;
    for (int t = 0; t < nt; ++t) {
      ts.emplace_back([&, t] {
        for (int i = t; i < members; i += nt) {
          RegisterRequest req;
          req.set_host(absl::StrCat("sim-", i / host_size));
          req.set_failure_domain(req.host());
          req.set_pid(i);
          RegisterResponse resp;
          grpc::ClientContext ctx;
          ctx.AddMetadata(kTokenMetadataKey, kToken);
          grpc::Status s = stubs[static_cast<size_t>(i % channels)]->Register(
              &ctx, req, &resp);
          if (!s.ok()) {
            std::fprintf(stderr, "register: %s\n", s.error_message().c_str());
            std::exit(1);
          }
          ids[static_cast<size_t>(i)] = resp.member_id();
        }
      });
    }
    for (auto& t : ts) t.join();
  }
  // The simulated streams live in `procs` driver processes (real members
  // and agents are processes of their own; one process holding every
  // stream would pay gRPC costs that grow with its number of pending
  // operations). They beat until the stop file appears, then write their
  // samples.
  const std::string ids_file = dir + "/ids";
  {
    std::ofstream f(ids_file);
    for (uint64_t id : ids) f << id << "\n";
  }
  const std::string stop_file = dir + "/stop";
  std::vector<int> drivers;
  for (int k = 0; k < procs; ++k) {
    drivers.push_back(g.Spawn({SelfExe(),
                               "--driver",
                               addr,
                               "--ids",
                               ids_file,
                               "--part",
                               std::to_string(k),
                               "--procs",
                               std::to_string(procs),
                               "--rate",
                               absl::StrCat(rate),
                               "--channels",
                               std::to_string(std::max(1, channels / procs)),
                               "--ack-every",
                               std::to_string(ack_every),
                               "--ranks-per-host",
                               std::to_string(per_host),
                               "--stop-file",
                               stop_file,
                               "--out",
                               absl::StrCat(dir, "/driver-", k)}));
  }
  // The idle stream beats with the rest, from here.
  std::atomic<bool> stop_idle{false};
  std::vector<std::unique_ptr<SimStream>> idle_streams;
  idle_streams.push_back(std::move(idle_stream));
  std::thread idle_load([&] {
    while (!stop_idle) Drive(idle_streams, rate, absl::Seconds(1), 1);
  });
  for (int d : drivers) {
    if (!g.WaitEvent(d, "ready", absl::Seconds(300)).has_value()) {
      std::fprintf(stderr, "driver: %s\n", g.Describe(d).c_str());
      std::exit(1);
    }
  }
  // Real processes: the victim (the last worker slot) behind an agent of
  // its own, then a real host of `real_ranks` standbys behind another
  // (with --ranks-per-host 0, all directly). Standbys, so that the host's
  // loss opens no generation: the push measured is the victim's.
  auto start_agent =
      [&](const std::string& name) -> std::pair<int, std::string> {
    if (per_host == 0) return {-1, addr};
    const std::string addr_file = absl::StrCat(dir, "/", name, "-address");
    const int pid = g.Spawn(
        {SelfDir() + "/holdfast-agent", "--controller", addr, "--listen",
         absl::StrCat("unix:", dir, "/", name, ".sock"), "--token-file",
         token_file, "--host", name, "--address-file", addr_file});
    for (int i = 0; i < 1000; ++i) {
      std::ifstream in(addr_file);
      std::string a;
      if (in >> a) return {pid, a};
      absl::SleepFor(absl::Milliseconds(10));
    }
    std::fprintf(stderr, "agent %s: %s\n", name.c_str(),
                 g.Describe(pid).c_str());
    std::exit(1);
  };
  auto start_member = [&](const std::string& at) -> std::pair<int, uint64_t> {
    const int m =
        g.Spawn({SelfExe(), "--member", at, "--token-file", token_file});
    auto ready = g.WaitEvent(m, "ready", absl::Seconds(60));
    if (!ready.has_value()) {
      std::fprintf(stderr, "member: %s\n", g.Describe(m).c_str());
      std::exit(1);
    }
    return {m, std::stoull(ready->at("member"))};
  };
  const auto [victim_agent, victim_at] = start_agent("victim-host");
  const auto [victim, victim_id] = start_member(victim_at);
  (void)victim_agent;
  const auto [agent, host_at] = start_agent("real-host");
  std::vector<int> real;
  std::vector<uint64_t> real_ids;
  for (int i = 0; i < real_ranks; ++i) {
    const auto [m, id] = start_member(host_at);
    real.push_back(m);
    real_ids.push_back(id);
  }
  // Warm up: every member sends, the streams bind.
  absl::SleepFor(absl::Seconds(2.0 / rate));

  const StatusResponse before = Status(addr, 0);
  const double cpu0 = CpuSeconds(g.pid(0));
  const absl::Time t0 = absl::Now();
  absl::SleepFor(absl::Seconds(seconds));
  const double cpu1 = CpuSeconds(g.pid(0));
  const absl::Time t1 = absl::Now();
  r.seconds = absl::ToDoubleSeconds(t1 - t0);
  const StatusResponse after = Status(addr, 0);
  r.heartbeats = after.heartbeats_total() - before.heartbeats_total();
  r.cpu_us_per_hb =
      r.heartbeats > 0 ? (cpu1 - cpu0) * 1e6 / static_cast<double>(r.heartbeats)
                       : 0;
  r.core_fraction = (cpu1 - cpu0) / r.seconds;
  r.rss_per_member_bytes = (RssBytes(g.pid(0)) - rss0) / members;

  // The real host's loss, while the simulated ranks keep beating: its
  // agent, or (direct) all its processes, SIGKILLed.
  const int64_t lost_ms = absl::ToUnixMillis(absl::Now());
  if (agent >= 0) {
    g.Signal(agent, SIGKILL);
  } else {
    for (int m : real) g.Signal(m, SIGKILL);
  }
  const int64_t lost = AwaitIncidents(addr, real_ids, absl::Seconds(30));
  if (lost >= 0) r.host_loss_ms = static_cast<double>(lost - lost_ms);
  absl::SleepFor(absl::Seconds(1));
  // A worker's crash: its detection, and the generation it opens reaching
  // every simulated rank.
  const int64_t kill_ms = absl::ToUnixMillis(absl::Now());
  const int64_t kill_ns = absl::GetCurrentTimeNanos();
  g.Signal(victim, SIGKILL);
  const int64_t seen = AwaitIncidents(addr, {victim_id}, absl::Seconds(120));
  if (seen >= 0) r.crash_detect_ms = static_cast<double>(seen - kill_ms);
  absl::SleepFor(absl::Seconds(2));

  std::ofstream(stop_file) << "stop\n";
  // The round trips of heartbeats sent inside the measured window, the
  // sends skipped in it, and the push, from every driver.
  std::vector<double> us;
  const int64_t from = absl::ToUnixNanos(t0), to = absl::ToUnixNanos(t1);
  int64_t push_last = 0;
  for (int k = 0; k < procs; ++k) {
    if (!g.WaitEvent(drivers[static_cast<size_t>(k)], "done", absl::Seconds(60))
             .has_value()) {
      std::fprintf(stderr, "driver %d: %s\n", k,
                   g.Describe(drivers[static_cast<size_t>(k)]).c_str());
      std::exit(1);
    }
    std::ifstream in(absl::StrCat(dir, "/driver-", k));
    std::string kind;
    int64_t at = 0;
    double v = 0;
    while (in >> kind >> at >> v) {
      if (kind == "push") {
        r.push_ranks += static_cast<int64_t>(v);
        push_last = std::max(push_last, at);
      }
      if (at < from || at >= to) continue;
      if (kind == "lat") us.push_back(v);
      if (kind == "skip") r.skipped += static_cast<uint64_t>(v);
    }
  }
  if (r.push_ranks == members && push_last > 0) {
    r.push_ms = static_cast<double>(push_last - kill_ns) / 1e6;
  }
  r.p50_ms = Percentile(us, 0.5) / 1e3;
  r.p99_ms = Percentile(us, 0.99) / 1e3;
  stop_idle = true;
  idle_load.join();
  g.Signal(0, SIGKILL);  // ends every stream at once
  idle_streams[0]->AwaitDone();
  for (int i = 1; i < g.size(); ++i) g.Signal(i, SIGKILL);
  g.WaitAll(absl::Seconds(10));
  return r;
}

// One driver process: the streams (or simulated hosts, of `per_host` ranks
// each) of part, part + parts, ... of the ids in `ids_file`, beating at
// `rate` until `stop_file` exists. Then writes "lat <sent unix ns> <round
// trip us>" per probe, "skip <unix ns> <count>" per second and "push
// <unix ns> <ranks>" (when the last of its ranks heard a new generation,
// and how many did) to `out`, reports done, and exits.
int DriverMode(const std::string& addr, const std::string& ids_file, int part,
               int parts, double rate, int channels, int ack_every,
               int per_host, const std::string& stop_file,
               const std::string& out) {
  std::vector<uint64_t> ids;
  {
    std::ifstream in(ids_file);
    uint64_t id = 0;
    while (in >> id) ids.push_back(id);
  }
  std::vector<std::shared_ptr<grpc::Channel>> chans;
  std::vector<std::unique_ptr<Controller::Stub>> stubs;
  for (int c = 0; c < channels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("holdfast.bench.channel", part * 4096 + c);
    chans.push_back(grpc::CreateCustomChannel(
        addr, grpc::InsecureChannelCredentials(), args));
    stubs.push_back(Controller::NewStub(chans.back()));
  }
  Latencies lat;
  {
    absl::MutexLock lock(&lat.mu);
    lat.recording = true;
  }
  PushWatch push;
  std::vector<std::unique_ptr<SimStream>> streams;
  std::vector<std::unique_ptr<SimHost>> hosts;
  size_t units = 0;  // senders across all drivers
  if (per_host > 0) {
    units = (ids.size() + static_cast<size_t>(per_host) - 1) /
            static_cast<size_t>(per_host);
    for (size_t h = static_cast<size_t>(part); h < units;
         h += static_cast<size_t>(parts)) {
      const size_t b = h * static_cast<size_t>(per_host);
      const size_t e = std::min(ids.size(), b + static_cast<size_t>(per_host));
      hosts.push_back(std::make_unique<SimHost>(
          stubs[hosts.size() % stubs.size()].get(), absl::StrCat("sim-", h),
          std::vector<uint64_t>(ids.begin() + static_cast<ptrdiff_t>(b),
                                ids.begin() + static_cast<ptrdiff_t>(e)),
          &lat, ack_every, &push));
    }
  } else {
    units = ids.size();
    for (size_t j = static_cast<size_t>(part); j < ids.size();
         j += static_cast<size_t>(parts)) {
      streams.push_back(std::make_unique<SimStream>(
          stubs[streams.size() % stubs.size()].get(), ids[j], &lat, ack_every,
          &push));
    }
  }
  std::printf("event=ready\n");  // stdout is the report pipe
  std::fflush(stdout);
  std::vector<std::pair<int64_t, uint64_t>> skips;
  for (;;) {
    std::ifstream stop(stop_file);
    if (stop.good()) break;
    const int64_t at = absl::GetCurrentTimeNanos();
    const uint64_t n = per_host > 0 ? Drive(hosts, rate, absl::Seconds(1), 1,
                                            static_cast<size_t>(part),
                                            static_cast<size_t>(parts), units)
                                    : Drive(streams, rate, absl::Seconds(1), 1,
                                            static_cast<size_t>(part),
                                            static_cast<size_t>(parts), units);
    skips.emplace_back(at, n);
  }
  {
    std::ofstream f(out);
    absl::MutexLock lock(&lat.mu);
    for (size_t i = 0; i < lat.us.size(); ++i) {
      f << "lat " << lat.sent_ns[i] << " " << lat.us[i] << "\n";
    }
    for (const auto& [at, n] : skips) f << "skip " << at << " " << n << "\n";
    f << "push " << push.last_ns.load() << " " << push.ranks.load() << "\n";
  }
  std::printf("event=done\n");
  std::fflush(stdout);
  // The streams are still open; the controller's end closes them.
  std::_Exit(0);
}

int MemberMode(const std::string& addr, const std::string& token_file) {
  auto token = LoadToken(token_file);
  if (!token.ok()) return 1;
  MemberOptions o;
  o.client = {addr, *token};
  auto m = MemberClient::Join(o);
  if (!m.ok()) {
    std::fprintf(stderr, "member: %s\n", m.status().ToString().c_str());
    return 1;
  }
  std::printf("event=ready member=%llu\n",
              static_cast<unsigned long long>((*m)->assignment().member_id));
  std::fflush(stdout);
  for (;;) absl::SleepFor(absl::Seconds(1));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"controller heartbeat-load benchmark"};
  std::string members_list = "16000,64000,100000";
  double seconds = 10, rate = 1;
  int channels = 64;
  int ack_every = 10;
  int per_host = 8;
  bool as_json = false;
  std::string member_addr, token_file;
  app.add_option("--members", members_list,
                 "comma-separated rank counts (simulated members)");
  app.add_option("--ranks-per-host", per_host,
                 "ranks per simulated host, whose agent carries their beats "
                 "on one stream (0: a stream per rank, the direct path)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--seconds", seconds, "measured window per count")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--rate", rate, "heartbeats per second per member")
      ->check(CLI::Range(0.1, 100.0));
  app.add_option("--channels", channels, "client connections to spread over")
      ->check(CLI::Range(1, 4096));
  app.add_option("--ack-every", ack_every,
                 "ask for an ack (a latency probe) on 1 heartbeat in N")
      ->check(CLI::Range(1, 1000000));
  app.add_flag("--json", as_json, "print JSON");
  int procs = 4;
  app.add_option("--procs", procs,
                 "driver processes the members are spread over")
      ->check(CLI::Range(1, 64));
  app.add_option("--member", member_addr, "(internal) run as one member");
  app.add_option("--token-file", token_file, "(internal)");
  std::string driver_addr, ids_file, stop_file, out_file;
  int part = 0;
  app.add_option("--driver", driver_addr, "(internal) run as a driver");
  app.add_option("--ids", ids_file, "(internal)");
  app.add_option("--part", part, "(internal)");
  app.add_option("--stop-file", stop_file, "(internal)");
  app.add_option("--out", out_file, "(internal)");
  CLI11_PARSE(app, argc, argv);
  // The load generator's gRPC locks, like the controller's, without the
  // debug-build deadlock detector (see config::ApplyMutexMode).
  config::ApplyMutexMode();
  if (!member_addr.empty()) return MemberMode(member_addr, token_file);
  if (!driver_addr.empty()) {
    return DriverMode(driver_addr, ids_file, part, procs, rate, channels,
                      ack_every, per_host, stop_file, out_file);
  }

  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(members_list, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1 || n > 1000000) {
      std::fprintf(stderr, "--members: bad count '%s'\n",
                   std::string(part).c_str());
      return 2;
    }
    counts.push_back(n);
  }
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  json out = json::array();
  if (!as_json) {
    std::printf(
        "controller pinned to 1 core; %d cores here; %g Hz per rank; %s; "
        "%d client connections from %d driver processes; latency probes on "
        "1 heartbeat in %d\n",
        cpus, rate,
        per_host > 0
            ? absl::StrCat(per_host, " ranks per host, one agent stream each")
                  .c_str()
            : "a stream per rank (direct)",
        channels, procs, ack_every);
    std::printf("%8s %10s %9s %9s %9s %9s %10s %10s %9s %9s %9s %9s\n", "ranks",
                "hb/s", "cpu us/hb", "core use", "p50 ms", "p99 ms", "idle p99",
                "p99/idle", "B/rank", "crash ms", "push ms", "host ms");
  }
  for (int m : counts) {
    RunResult r =
        RunOne(m, per_host, seconds, rate, channels, cpus, ack_every, procs);
    const double ratio = r.idle_p99_ms > 0 ? r.p99_ms / r.idle_p99_ms : 0;
    // Of the offered load (M members at the rate), the share handled.
    const double handled = r.heartbeats / r.seconds / (m * rate);
    const bool fast = r.crash_detect_ms >= 0 && r.crash_detect_ms < 1000 &&
                      r.push_ms >= 0 && r.push_ms < 1000 &&
                      r.host_loss_ms >= 0 && r.host_loss_ms < 1000;
    if (as_json) {
      out.push_back({{"ranks", r.members},
                     {"ranks_per_host", r.ranks_per_host},
                     {"seconds", r.seconds},
                     {"heartbeats", r.heartbeats},
                     {"heartbeats_per_s", r.heartbeats / r.seconds},
                     {"handled_fraction", handled},
                     {"cpu_us_per_heartbeat", r.cpu_us_per_hb},
                     {"controller_core_fraction", r.core_fraction},
                     {"p50_ms", r.p50_ms},
                     {"p99_ms", r.p99_ms},
                     {"idle_p50_ms", r.idle_p50_ms},
                     {"idle_p99_ms", r.idle_p99_ms},
                     {"p99_over_idle_p99", ratio},
                     {"rss_bytes_per_rank", r.rss_per_member_bytes},
                     {"crash_detect_ms", r.crash_detect_ms},
                     {"push_ms", r.push_ms},
                     {"push_ranks", r.push_ranks},
                     {"host_loss_ms", r.host_loss_ms},
                     {"skipped_sends", r.skipped},
                     {"controller_pinned", r.pinned},
                     {"driver_processes", procs},
                     {"goal_met", handled >= 0.99 && r.core_fraction < 1.0 &&
                                      r.p99_ms < 10.0 && fast}});
    } else {
      std::printf(
          "%8d %10.0f %9.1f %9.3f %9.2f %9.2f %10.2f %10.2f %9.0f %9.0f %9.0f "
          "%9.0f\n",
          r.members, r.heartbeats / r.seconds, r.cpu_us_per_hb, r.core_fraction,
          r.p50_ms, r.p99_ms, r.idle_p99_ms, ratio, r.rss_per_member_bytes,
          r.crash_detect_ms, r.push_ms, r.host_loss_ms);
      if (r.push_ranks != m) {
        std::printf("         (push: %lld of %d ranks heard the generation)\n",
                    static_cast<long long>(r.push_ranks), m);
      }
      if (r.skipped > 0) {
        std::printf("         (%llu sends skipped: previous write in flight)\n",
                    static_cast<unsigned long long>(r.skipped));
      }
    }
    std::fflush(stdout);
  }
  if (as_json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
