// Checkpoint benchmark: what a snapshot and its backup cost, against the
// hardware floor measured in the same run.
//
// For each state size S (MiB of replicated state, two slots, one replica):
//   snapshot     Runtime::Snapshot() of the slot's piece (S/2 bytes: each of
//                the two slots keeps half of replicated state), against a
//                plain memcpy of the same bytes into another buffer, run
//                just before each snapshot; the ratio is the median of the
//                per-snapshot ratios, as the round's below. Goal: >= 80 %.
//                Both start from the same cache state: before each timed
//                copy every cache line of a 256 MiB buffer is written, so
//                neither copy finds its bytes in the last-level cache
//                (105 MiB on one host this ran on, which would otherwise
//                hold a repeated copy of up to ~50 MiB; see EvictCaches).
//   round        from the later of the two slots' Snapshot() returning (the
//                two pieces exist) to the step being committed: the
//                checksum, the agreement, sending S/2 to the buddy while
//                receiving its S/2 over the side communicator, the check,
//                the ack. Against a raw loopback exchange of the same bytes
//                (two threads, one TCP socket pair, both directions at
//                once), run after each round, between the rounds, from the
//                cache state a round starts with (the bytes to send just
//                written, the receive buffers out of the cache); the ratio
//                is the median of the per-round ratios, so the VM's drift
//                from minute to minute falls on both sides of each one.
//                Also the runtime's own time inside
//                the sends and receives ("transfer"), to tell the wire from
//                the protocol around it. Twice: with the buddy checking
//                what it received as it lands (verify_backups "arrival",
//                the default), and leaving that to a restore ("restore").
//                A third time with the copy during the next step
//                (RunOptions::SnapshotCopy::kDuringNextStep, which hashes
//                the piece as it copies it) and the check at restore, each
//                round timed by the runtime and followed by a raw exchange
//                in the step's idle time (MeasureOverlappedRound).
//   held         the replication itself: the same rounds, from the later
//                snapshot to the later of the two slots' acks
//                (BackupStats::last_acked), when each slot holds its own
//                piece and the other's (checked, with "arrival"), against
//                the same raw exchanges. Goal: >= 80 %. The round goes on
//                to the commit: the acks travel to the controller and the
//                commit back, a size-independent latency of the control
//                plane (the "ack to commit" below) that the commit adds to
//                a replication of any size.
// Before the sizes, two latencies that a round pays at every size and the
// raw exchange (which keeps streaming) does not: a byte's round trip
// between two threads after 5 ms asleep (two wake-ups of idle threads),
// and two members' acks to an embedded controller until both heard the
// commit. They are the round's fixed part, which decides the ratio at
// small pieces; the text output prints their p50 and p90.
// Both slots live in this process (two Runtimes, two threads) with an
// embedded controller, so the two measurements share one machine. All of
// a size's measurements run --trials times in turn; each figure is the
// median (the JSON also lists every trial's).
//
// Then the step-time overhead of every-step snapshots on the example
// trainer (holdfast-run, 2 workers, --step-ms of idle compute per step,
// --state-mb of state): training time from the first step to the last with
// a snapshot every step, against one snapshot at the end; the median of
// --trials alternating runs of each. Twice: with the copy on the training
// thread between the steps (the trainer's --snapshot-copy between-steps),
// and with it overlapped with the next step (its default, auto: the
// trainer fences its writes with BeginStateUpdate()).
// Goal: <= 3 % when the backup fits in the step's idle time.
//
//   shard_bench [--sizes-mb 16,64,256] [--reps 5] [--overhead-mb 64]
//               [--step-ms 50] [--steps 100] [--trials 3] [--json]
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "holdfast/runtime.h"
#include "holdfast/status.h"
#include "holdfast/testing/backup_stats.h"
#include "src/control/controller/server.h"
#include "src/control/member/member.h"
#include "test/support/process_group.h"

using nlohmann::json;

namespace {

// The p-th percentile (0..1) of `v`; 0 if empty.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

// Writes every cache line of a buffer larger than the last-level cache
// with ordinary stores (a read, an add, a write), so what was cached before
// is out of it. A memset does not do that everywhere: on an AMD EPYC with
// 32 MiB of L3 (2026-11-24) glibc's memset of 256 MiB went past the cache,
// and a copy of 8 MiB after it ran at 50 GB/s, its bytes still cached,
// against 20 GB/s after this loop.
void EvictCaches() {
  static std::vector<uint8_t> scratch(size_t{256} << 20);
  static uint8_t value = 0;
  ++value;
  uint8_t* p = scratch.data();
  const size_t n = scratch.size();
  for (size_t i = 0; i < n; i += 64) p[i] = static_cast<uint8_t>(p[i] + value);
}

// Writes `n` bytes with ordinary stores, so they are in the cache after
// (as a piece Snapshot() just copied is); see EvictCaches on memset.
void WriteCached(uint8_t* p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(seed + i);
}

// Seconds of a plain memcpy of `n` bytes from `src` into `dst` (pages
// already touched), from the cache state of a snapshot: caches evicted.
double MemcpySeconds(uint8_t* dst, const uint8_t* src, size_t n) {
  EvictCaches();
  const absl::Time t0 = absl::Now();
  std::memcpy(dst, src, n);
  const double t = absl::ToDoubleSeconds(absl::Now() - t0);
  dst[n / 2] ^= src[0];  // keep it alive
  return t;
}

// Two threads exchanging `bytes` each way over one loopback TCP
// connection: the raw transfer a backup round is compared with.
class RawExchange {
 public:
  explicit RawExchange(size_t bytes)
      : bytes_(bytes),
        out_a_(bytes, 3),
        in_a_(bytes),
        out_b_(bytes, 4),
        in_b_(bytes) {
    const int lfd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(lfd, 1);
    getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
    c_ = socket(AF_INET, SOCK_STREAM, 0);
    connect(c_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    s_ = accept(lfd, nullptr, nullptr);
    close(lfd);
    int one = 1;
    setsockopt(c_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(s_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~RawExchange() {
    close(c_);
    close(s_);
  }
  RawExchange(const RawExchange&) = delete;
  RawExchange& operator=(const RawExchange&) = delete;

  // Seconds of one exchange; 0 if a socket failed. It starts from the
  // cache state of a backup round: the caches evicted, then the bytes to
  // send written (as Snapshot() writes a piece just before its round),
  // the receive buffers out of the cache (as a buddy's pooled buffers).
  double Once() {
    EvictCaches();
    WriteCached(out_a_.data(), bytes_, ++fill_);
    WriteCached(out_b_.data(), bytes_, ++fill_);
    auto pump = [&](int fd, const uint8_t* out, uint8_t* in) {
      // Send and receive at once, as the backup does.
      bool sent = true;
      std::thread sender([&] {
        size_t done = 0;
        while (done < bytes_) {
          const ssize_t n = write(fd, out + done, bytes_ - done);
          if (n <= 0) {
            sent = false;
            return;
          }
          done += static_cast<size_t>(n);
        }
      });
      size_t got = 0;
      while (got < bytes_) {
        const ssize_t n = read(fd, in + got, bytes_ - got);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      sender.join();
      return sent && got == bytes_;
    };
    const absl::Time t0 = absl::Now();
    bool peer_ok = false;
    std::thread peer([&] { peer_ok = pump(s_, out_b_.data(), in_b_.data()); });
    const bool ok = pump(c_, out_a_.data(), in_a_.data());
    peer.join();
    const double t = absl::ToDoubleSeconds(absl::Now() - t0);
    return ok && peer_ok ? t : 0;
  }

 private:
  const size_t bytes_;
  std::vector<uint8_t> out_a_, in_a_, out_b_, in_b_;
  int c_ = -1, s_ = -1;
  uint8_t fill_ = 0;
};

// Microseconds of `n` round trips of a byte between two threads over
// pipes, each after 5 ms asleep: two wake-ups of idle threads, the unit a
// backup round's protocol pays for at every hop (agreement, checksum,
// ack, commit), which a raw exchange that keeps streaming does not.
std::vector<double> WakeupRoundTripsUs(int n) {
  int there[2], back[2];
  std::vector<double> us;
  if (pipe(there) != 0) return us;
  if (pipe(back) != 0) {
    close(there[0]);
    close(there[1]);
    return us;
  }
  std::thread echo([&] {
    char c;
    while (read(there[0], &c, 1) == 1 && c != 'q') {
      if (write(back[1], &c, 1) != 1) return;
    }
  });
  for (int i = 0; i < n; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
    char c = 'x';
    const absl::Time t0 = absl::Now();
    if (write(there[1], &c, 1) != 1 || read(back[0], &c, 1) != 1) break;
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  const char q = 'q';
  if (write(there[1], &q, 1) != 1) close(there[1]);
  echo.join();
  for (int fd : {there[0], there[1], back[0], back[1]}) close(fd);
  return us;
}

// Microseconds from two members acking a step on their heartbeat streams
// to both hearing it committed, `n` times, 5 ms apart: the controller's
// part of a backup round (an embedded controller, as the rounds use).
// Empty (and `error` set) on failure.
std::vector<double> AckCommitUs(int n, std::string* error) {
  using namespace holdfast::control;
  std::vector<double> us;
  ControllerOptions co;
  co.token = "shard-bench-token";
  co.world_size = 2;
  auto server = ControllerServer::Start(co);
  if (!server.ok()) {
    *error = std::string(server.status().message());
    return us;
  }
  absl::Mutex mu;
  int64_t heard[2] = {-1, -1};
  std::unique_ptr<MemberClient> members[2];
  for (int i = 0; i < 2; ++i) {
    MemberOptions m;
    m.client = {(*server)->address(), co.token};
    m.host = absl::StrCat("bench-host-", i);
    m.preferred_slot = i;
    MemberCallbacks cb;
    cb.on_committed = [&mu, &heard, i](int64_t s) {
      absl::MutexLock lock(&mu);
      heard[i] = std::max(heard[i], s);
    };
    auto c = MemberClient::Join(m, cb);
    if (!c.ok()) {
      *error = std::string(c.status().message());
      break;
    }
    members[i] = std::move(*c);
  }
  for (int64_t s = 1; s <= n && error->empty(); ++s) {
    absl::SleepFor(absl::Milliseconds(5));
    const absl::Time t0 = absl::Now();
    for (auto& m : members) m->SendCheckpointAck(s, 0);
    absl::MutexLock lock(&mu);
    auto both = [&] { return heard[0] >= s && heard[1] >= s; };
    if (!mu.AwaitWithTimeout(absl::Condition(&both), absl::Seconds(10))) {
      *error = absl::StrCat("step ", s, " was not committed within 10 s");
      break;
    }
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  for (auto& m : members) {
    if (m != nullptr) m->Leave(true);
  }
  (*server)->Shutdown();
  if (!error->empty()) us.clear();
  return us;
}

struct Pair {
  double snapshot_s = 0;
  double memcpy_s = 0;            // the memcpy before each snapshot
  double snapshot_vs_memcpy = 0;  // median of the per-snapshot ratios
  double replicate_s = 0;         // from Snapshot() returning to the commit
  double held_s = 0;              // from Snapshot() returning to the last ack
  double transfer_s = 0;  // the runtime's own send+receive time, per round
  double raw_s = 0;       // the raw exchange run after each round
  // Medians of the per-round ratios raw / round, raw / held and raw /
  // transfer.
  double replicate_vs_raw = 0;
  double held_vs_raw = 0;
  double transfer_vs_raw = 0;
  size_t piece_bytes = 0;
  std::string error;
};

// Runs `body(slot, runtime, state)` on slots 0 and 1 of a two-slot job:
// an embedded controller, and a Runtime per thread with `bytes` of
// registered replicated state whose buddies check copies at `verify`.
// Returns the first error ("" if none).
using SlotBody =
    std::function<absl::Status(int, holdfast::Runtime&, std::vector<uint8_t>&)>;
std::string RunPair(size_t bytes, const char* verify, const SlotBody& body) {
  holdfast::control::ControllerOptions co;
  co.token = "shard-bench-token";
  co.world_size = 2;
  auto server = holdfast::control::ControllerServer::Start(co);
  if (!server.ok()) return std::string(server.status().message());
  std::string errors[2];
  auto slot_main = [&](int want) {
    holdfast::RuntimeOptions o;
    o.controller = (*server)->address();
    o.token = co.token;
    o.host = absl::StrCat("bench-host-", want);
    o.preferred_slot = want;
    o.verify_backups = std::string(verify) == "restore"
                           ? holdfast::VerifyBackups::kRestore
                           : holdfast::VerifyBackups::kArrival;
    auto rt = holdfast::Runtime::Create(o);
    if (!rt.ok()) {
      errors[want] = std::string(rt.status().message());
      return;
    }
    // Replicated state: the same bytes on both slots.
    std::vector<uint8_t> state(bytes, uint8_t{1});
    absl::Status s = (*rt)->RegisterState("state", state.data(), bytes);
    if (s.ok()) s = body(want, **rt, state);
    if (!s.ok()) errors[want] = std::string(s.message());
    (*rt)->Leave(true);
  };
  std::thread t0([&] { slot_main(0); });
  std::thread t1([&] { slot_main(1); });
  t0.join();
  t1.join();
  (*server)->Shutdown();
  return errors[0].empty() ? errors[1] : errors[0];
}

// `reps` timed snapshots of each slot, each waited for until committed;
// buddies verify at `verify`. After each round, once both slots saw the
// commit, slot 0 runs the raw exchange of a piece's bytes.
Pair MeasureRuntime(size_t bytes, int reps, const char* verify) {
  Pair out;
  std::vector<double> snap[2];
  std::vector<double> copy;  // slot 0's memcpy before each timed snapshot
  // Per timed round and slot: Snapshot() returned, the slot acked (its
  // BackupStats::last_acked; InfinitePast if its stats came late), the
  // commit was seen.
  std::vector<absl::Time> taken_at[2], acked_at[2], committed_at[2];
  // Per timed round: slot 0's transfer time, the raw exchange after it.
  std::vector<double> transfer, raw;
  RawExchange exchange(bytes / 2);
  // The first two rounds are not timed: each allocates a receive buffer
  // and faults its pages in (a buddy holds the last committed copy while
  // the next one arrives; from the third round on, buffers are reused).
  constexpr int kWarmup = 2;
  // Slot 1 snapshots after slot 0's copy is done, so the timed copy (slot
  // 0's) has the memory bus to itself, as the memcpy baseline does.
  absl::Mutex mu;
  int64_t copied = 0;
  auto body = [&](int want, holdfast::Runtime& rt,
                  std::vector<uint8_t>& state) -> absl::Status {
    HOLDFAST_RETURN_IF_ERROR(rt.communicator().status());
    holdfast::testing::BackupStats before =
        holdfast::testing::BackupStatsOf(rt);
    // Slot 0's piece: the first half of the state.
    std::vector<uint8_t> baseline(want == 0 ? bytes / 2 : 0, 2);
    for (int i = 0; i < kWarmup + reps; ++i) {
      const int64_t step = i + 1;
      state[static_cast<size_t>(i) % bytes] ^= 1;
      if (want == 1) {
        absl::MutexLock lock(&mu);
        auto ready = [&] { return copied >= step; };
        mu.Await(absl::Condition(&ready));
      }
      double copy_s = 0;
      if (want == 0) {
        copy_s = MemcpySeconds(baseline.data(), state.data(), baseline.size());
        EvictCaches();
      }
      const absl::Time t0 = absl::Now();
      absl::StatusOr<bool> taken = rt.Snapshot(step);
      const absl::Time t1 = absl::Now();
      if (want == 0) {
        absl::MutexLock lock(&mu);
        copied = step;
      }
      if (!taken.ok()) return taken.status();
      if (!*taken) return absl::InternalError("snapshot skipped");
      HOLDFAST_RETURN_IF_ERROR(rt.AwaitCommit(step, absl::Seconds(60)));
      const absl::Time t2 = absl::Now();
      if (i >= kWarmup) {
        snap[want].push_back(absl::ToDoubleSeconds(t1 - t0));
        if (want == 0) copy.push_back(copy_s);
        taken_at[want].push_back(t1);
        committed_at[want].push_back(t2);
      }
      // Let the other slot see the commit too before the next round (and
      // the round's stats be complete).
      absl::SleepFor(absl::Milliseconds(20));
      const holdfast::testing::BackupStats after =
          holdfast::testing::BackupStatsOf(rt);
      if (i >= kWarmup) {
        acked_at[want].push_back(after.rounds == before.rounds + 1
                                     ? after.last_acked
                                     : absl::InfinitePast());
      }
      if (want == 1) {
        before = after;
        continue;  // slot 1 waits for slot 0's next copy meanwhile
      }
      const double raw_s = exchange.Once();
      if (raw_s <= 0) return absl::InternalError("the raw exchange failed");
      if (i >= kWarmup) {
        // (Uncounted, -1, if the round's stats came late.)
        transfer.push_back(after.rounds == before.rounds + 1
                               ? (after.transfer_us - before.transfer_us) / 1e6
                               : -1);
        raw.push_back(raw_s);
      }
      before = after;
    }
    return absl::OkStatus();
  };
  out.error = RunPair(bytes, verify, body);
  out.snapshot_s = Median(snap[0]);
  out.memcpy_s = Median(copy);
  std::vector<double> copy_ratio;
  for (size_t i = 0; i < copy.size() && i < snap[0].size(); ++i) {
    copy_ratio.push_back(copy[i] / snap[0][i]);
  }
  out.snapshot_vs_memcpy = Median(copy_ratio);
  // Slot 1 copies after slot 0 (see above), so a round starts when the
  // later copy is done, and ends when both slots saw the commit; the
  // copies are held (and checked, with "arrival") once both slots acked.
  std::vector<double> repl, repl_ratio, held, held_ratio, transfer_ratio;
  for (size_t i = 0;
       i < taken_at[0].size() && i < taken_at[1].size() && out.error.empty();
       ++i) {
    repl.push_back(
        absl::ToDoubleSeconds(std::max(committed_at[0][i], committed_at[1][i]) -
                              std::max(taken_at[0][i], taken_at[1][i])));
    if (i < raw.size()) repl_ratio.push_back(raw[i] / repl.back());
    if (i < acked_at[0].size() && i < acked_at[1].size() &&
        acked_at[0][i] != absl::InfinitePast() &&
        acked_at[1][i] != absl::InfinitePast()) {
      held.push_back(
          absl::ToDoubleSeconds(std::max(acked_at[0][i], acked_at[1][i]) -
                                std::max(taken_at[0][i], taken_at[1][i])));
      if (i < raw.size()) held_ratio.push_back(raw[i] / held.back());
    }
    if (i < raw.size() && transfer[i] > 0) {
      transfer_ratio.push_back(raw[i] / transfer[i]);
    }
  }
  transfer.erase(std::remove(transfer.begin(), transfer.end(), -1.0),
                 transfer.end());
  out.replicate_s = Median(repl);
  out.transfer_s = Median(transfer);
  out.raw_s = Median(raw);
  out.replicate_vs_raw = Median(repl_ratio);
  out.held_s = Median(held);
  out.held_vs_raw = Median(held_ratio);
  out.transfer_vs_raw = Median(transfer_ratio);
  out.piece_bytes = bytes / 2;
  return out;
}

// Rounds of snapshots copied during the next step
// (RunOptions::SnapshotCopy::kDuringNextStep) and checked at restore: the
// owner hashes its piece as it copies it, so the round itself moves bytes
// only. Two slots run the step loop; each step fences after 2 ms (by then
// the backup thread has the copy under way, so the copy waits for no
// compute), then idles long enough for the round. Each round is timed by
// the runtime (BackupStats::round_us: from the end of the copy to the
// commit, less gate_us: the time it waited, with its bytes moved, for the
// fence, which comes when the trainer calls it, not when the bytes have
// moved), read at the next step's start when one round ended meanwhile;
// of the two slots' times for a round, that of the slot whose copy ended
// last (the smaller). The round's held time runs from the later of the
// two starts (a slot's start: its BackupStats::last_acked less the part of
// round_us before the ack, round_us - commit_wait_us) to the later of the
// two acks, each less its slot's gate_us. After the round, at the end of
// the step's idle time, slot 0 runs the raw exchange, as MeasureRuntime
// does after each round, while slot 1 waits for it before it ends its
// step (else slot 1 would copy its next snapshot meanwhile and slow the
// exchange down). The rounds of the first three steps (they fault pages
// in) are left out, and the last step's (its snapshot is copied between
// the steps).
struct Overlapped {
  double round_s = 0;       // median
  double round_vs_raw = 0;  // median of the per-round ratios raw / round
  double held_s = 0;        // median, from the later copy to the later ack
  double held_vs_raw = 0;   // median of the per-round ratios raw / held
  std::string error;
};
Overlapped MeasureOverlappedRound(size_t bytes, int reps) {
  const int64_t steps = reps + 4;
  const absl::Duration idle = absl::Milliseconds(30) +
                              absl::Seconds(static_cast<double>(bytes) / 0.3e9);
  RawExchange exchange(bytes / 2);
  absl::Mutex mu;
  // Keyed by the step during which the round ran.
  std::map<int64_t, double> round_s[2], raw_s;
  // When each slot's round started (its copy done) and when it would have
  // acked without the wait for the fence (its ack less gate_us).
  std::map<int64_t, std::pair<absl::Time, absl::Time>> span[2];
  auto body = [&](int want, holdfast::Runtime& rt,
                  std::vector<uint8_t>& state) -> absl::Status {
    holdfast::testing::BackupStats prev;
    holdfast::RunOptions ro;
    ro.steps = steps;
    ro.snapshot_copy = holdfast::RunOptions::SnapshotCopy::kDuringNextStep;
    auto r = rt.Run(
        [&](const holdfast::StepContext& ctx) -> absl::Status {
          const holdfast::testing::BackupStats now =
              holdfast::testing::BackupStatsOf(rt);
          // The round of the step before: the snapshot of the step before
          // it, copied and backed up during it.
          if (ctx.step >= 5 && now.rounds == prev.rounds + 1) {
            const int64_t round_us = now.round_us - prev.round_us;
            const int64_t gate_us = now.gate_us - prev.gate_us;
            const int64_t wait_us = now.commit_wait_us - prev.commit_wait_us;
            absl::MutexLock lock(&mu);
            round_s[want][ctx.step - 1] =
                static_cast<double>(round_us - gate_us) / 1e6;
            // round_us runs from the start to the commit seen, wait_us from
            // the ack to it.
            span[want][ctx.step - 1] = {
                now.last_acked - absl::Microseconds(round_us - wait_us),
                now.last_acked - absl::Microseconds(gate_us)};
          }
          prev = now;
          int64_t x = ctx.step;
          HOLDFAST_RETURN_IF_ERROR(ctx.comm
                                       ->AllReduce(&x, 1,
                                                   holdfast::DataType::kInt64,
                                                   holdfast::ReduceOp::kSum)
                                       ->Wait());
          absl::SleepFor(absl::Milliseconds(2));
          ctx.runtime->BeginStateUpdate();
          state[static_cast<size_t>(ctx.step) % bytes] ^= 1;
          absl::SleepFor(idle);
          if (ctx.step < 4 || ctx.step == steps) return absl::OkStatus();
          // This step's round (of the step before's snapshot) is over on
          // both slots once they saw its commit (the sleep lets the other
          // slot see it too).
          HOLDFAST_RETURN_IF_ERROR(
              rt.AwaitCommit(ctx.step - 1, absl::Seconds(60)));
          absl::SleepFor(absl::Milliseconds(20));
          if (want == 0) {
            const double t = exchange.Once();
            absl::MutexLock lock(&mu);
            raw_s[ctx.step] = t;
          } else {
            // Slot 1 ends its step (and starts copying its next snapshot)
            // only after the raw exchange, which then has the machine to
            // itself.
            absl::MutexLock lock(&mu);
            auto done = [&] { return raw_s.count(ctx.step) > 0; };
            if (!mu.AwaitWithTimeout(absl::Condition(&done),
                                     absl::Seconds(60))) {
              return absl::InternalError("slot 0 ran no raw exchange");
            }
          }
          absl::MutexLock lock(&mu);
          if (raw_s[ctx.step] <= 0) {
            return absl::InternalError("the raw exchange failed");
          }
          return absl::OkStatus();
        },
        ro);
    return r.status();
  };
  Overlapped out;
  out.error = RunPair(bytes, "restore", body);
  std::vector<double> rounds, ratios, held, held_ratios;
  for (const auto& [step, raw] : raw_s) {
    auto a = round_s[0].find(step);
    auto b = round_s[1].find(step);
    if (a == round_s[0].end() || b == round_s[1].end()) continue;
    rounds.push_back(std::min(a->second, b->second));
    ratios.push_back(raw / rounds.back());
    const auto& [start0, ready0] = span[0][step];
    const auto& [start1, ready1] = span[1][step];
    held.push_back(absl::ToDoubleSeconds(std::max(ready0, ready1) -
                                         std::max(start0, start1)));
    held_ratios.push_back(raw / held.back());
  }
  if (out.error.empty() && rounds.empty()) {
    out.error = "no overlapped round was timed";
  }
  out.round_s = Median(rounds);
  out.round_vs_raw = Median(ratios);
  out.held_s = Median(held);
  out.held_vs_raw = Median(held_ratios);
  return out;
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str(), nullptr, false);
}

// Training wall time of the example trainer (first step start to last step
// end), in ms; -1 on failure.
double TrainerWallMs(int64_t steps, int64_t step_ms, int64_t state_mb,
                     int64_t snapshot_every, const char* snapshot_copy) {
  const std::string dir = holdfast::proc::MakeTempDir();
  const std::string cmd = absl::StrCat(
      HOLDFAST_RUN_BIN, " -n 2 --no-disk-tier --log-dir ", dir, " -- ",
      HOLDFAST_DP_TRAINER_BIN, " --steps ", steps, " --step-ms ", step_ms,
      " --state-mb ", state_mb, " --snapshot-every ", snapshot_every,
      " --snapshot-copy ", snapshot_copy, " > /dev/null 2>&1");
  const int st = std::system(cmd.c_str());
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
  json j = ReadJson(dir + "/summary.json");
  return j.is_object() ? j.value("train_wall_ms", -1.0) : -1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"holdfast checkpoint benchmark"};
  std::string sizes = "16,64,256";
  int reps = 5;
  int64_t overhead_mb = 64, step_ms = 50, steps = 100;
  bool as_json = false;
  int trials = 3;
  app.add_option("--sizes-mb", sizes, "state sizes, MiB (comma-separated)");
  app.add_option("--reps", reps, "timed rounds per size")
      ->check(CLI::Range(1, 1000));
  app.add_option("--overhead-mb", overhead_mb,
                 "trainer state for the step overhead, MiB (0: skip)")
      ->check(CLI::Range(int64_t{0}, int64_t{65536}));
  app.add_option("--step-ms", step_ms, "idle compute per trainer step, ms")
      ->check(CLI::Range(int64_t{1}, int64_t{60000}));
  app.add_option("--steps", steps, "trainer steps")
      ->check(CLI::Range(int64_t{10}, int64_t{100000}));
  app.add_option("--trials", trials,
                 "runs of every measurement, in turn (medians)")
      ->check(CLI::Range(1, 100));
  app.add_flag("--json", as_json, "print JSON");
  CLI11_PARSE(app, argc, argv);
  setenv("HOLDFAST_LOG_LEVEL", "warn", 0);

  json out;
  {
    // This machine's latencies that a backup round pays and a raw
    // exchange does not (see WakeupRoundTripsUs and AckCommitUs).
    json m;
    const std::vector<double> wake = WakeupRoundTripsUs(200);
    m["wakeup_round_trip_us_p50"] = Percentile(wake, 0.5);
    m["wakeup_round_trip_us_p90"] = Percentile(wake, 0.9);
    std::string error;
    const std::vector<double> ack = AckCommitUs(200, &error);
    if (!error.empty()) {
      m["ack_commit_error"] = error;
    } else {
      m["ack_commit_us_p50"] = Percentile(ack, 0.5);
      m["ack_commit_us_p90"] = Percentile(ack, 0.9);
    }
    out["latency"] = m;
  }
  out["sizes"] = json::array();
  for (absl::string_view tok : absl::StrSplit(sizes, ',')) {
    int64_t mb = 0;
    if (!absl::SimpleAtoi(tok, &mb) || mb <= 0) {
      std::fprintf(stderr, "shard_bench: bad size '%s'\n",
                   std::string(tok).c_str());
      return 2;
    }
    const size_t bytes = static_cast<size_t>(mb) << 20;
    json r;
    r["state_mb"] = mb;
    // Every measurement of a size, `trials` times in turn, and the median
    // of each figure: this shared VM's speed drifts from minute to minute,
    // which alternation spreads over all of them alike.
    std::map<std::string, std::vector<double>> fig;
    std::string error;
    for (int t = 0; t < trials && error.empty(); ++t) {
      Pair p = MeasureRuntime(bytes, reps, "arrival");
      Pair q = MeasureRuntime(bytes, reps, "restore");
      Overlapped o = MeasureOverlappedRound(bytes, reps);
      for (const std::string* e : {&p.error, &q.error, &o.error}) {
        if (error.empty()) error = *e;
      }
      if (!error.empty()) break;
      const double mem_s = p.memcpy_s;
      // The raw exchanges of both runs: the mean of their medians.
      const double raw_s = (p.raw_s + q.raw_s) / 2;
      const double gb = static_cast<double>(p.piece_bytes) / 1e9;
      r["piece_mb"] = static_cast<double>(p.piece_bytes) / (1 << 20);
      fig["snapshot_gbps"].push_back(gb / p.snapshot_s);
      fig["memcpy_gbps"].push_back(gb / mem_s);
      fig["snapshot_vs_memcpy"].push_back(p.snapshot_vs_memcpy);
      fig["replication_gbps"].push_back(gb / p.replicate_s);
      fig["raw_exchange_gbps"].push_back(gb / raw_s);
      fig["replication_vs_raw"].push_back(p.replicate_vs_raw);
      fig["replication_verify_at_restore_gbps"].push_back(gb / q.replicate_s);
      fig["replication_verify_at_restore_vs_raw"].push_back(q.replicate_vs_raw);
      fig["replication_overlapped_gbps"].push_back(gb / o.round_s);
      fig["replication_overlapped_vs_raw"].push_back(o.round_vs_raw);
      fig["held_gbps"].push_back(gb / p.held_s);
      fig["held_vs_raw"].push_back(p.held_vs_raw);
      fig["held_verify_at_restore_gbps"].push_back(gb / q.held_s);
      fig["held_verify_at_restore_vs_raw"].push_back(q.held_vs_raw);
      fig["held_overlapped_gbps"].push_back(gb / o.held_s);
      fig["held_overlapped_vs_raw"].push_back(o.held_vs_raw);
      fig["transfer_gbps"].push_back(p.transfer_s > 0 ? gb / p.transfer_s : 0);
      fig["transfer_vs_raw"].push_back(p.transfer_vs_raw);
    }
    if (!error.empty()) {
      r["error"] = error;
      out["sizes"].push_back(r);
      continue;
    }
    for (const auto& [key, values] : fig) {
      r[key] = Median(values);
      if (values.size() > 1) r[key + "_all"] = values;
    }
    out["sizes"].push_back(r);
  }
  if (overhead_mb > 0) {
    // Alternating runs, medians: a shared VM drifts by a few percent.
    std::vector<double> withs, overlapped, withouts;
    for (int t = 0; t < trials; ++t) {
      withs.push_back(
          TrainerWallMs(steps, step_ms, overhead_mb, 1, "between-steps"));
      overlapped.push_back(
          TrainerWallMs(steps, step_ms, overhead_mb, 1, "auto"));
      withouts.push_back(
          TrainerWallMs(steps, step_ms, overhead_mb, steps + 1, "auto"));
    }
    auto median_or_fail = [](const std::vector<double>& v) {
      return std::find(v.begin(), v.end(), -1.0) != v.end() ? -1 : Median(v);
    };
    const double with = median_or_fail(withs);
    const double over = median_or_fail(overlapped);
    const double without = median_or_fail(withouts);
    auto ratio = [without](double w) {
      return w > 0 && without > 0 ? w / without - 1 : -1;
    };
    json o;
    o["state_mb"] = overhead_mb;
    o["step_ms"] = step_ms;
    o["steps"] = steps;
    o["trials"] = trials;
    o["wall_ms_every_step"] = with;
    o["wall_ms_every_step_overlapped"] = over;
    o["wall_ms_no_snapshots"] = without;
    o["overhead"] = ratio(with);
    o["overhead_overlapped"] = ratio(over);
    out["overhead"] = o;
  }
  if (as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf(
      "%-8s %-9s %-12s %-12s %-7s %-13s %-13s %-13s %-13s %-13s %-7s %-7s "
      "%-7s %-7s %-7s %-7s %-7s\n",
      "state", "piece", "snapshot", "memcpy", "ratio", "round", "transfer",
      "round@rest.", "round@ovl.", "raw exchange", "round", "xfer", "@rest.",
      "@ovl.", "held", "@rest.", "@ovl.");
  for (const json& r : out["sizes"]) {
    if (r.contains("error")) {
      std::printf("%-6lld MiB: %s\n",
                  static_cast<long long>(r.value("state_mb", 0)),
                  r.value("error", "").c_str());
      continue;
    }
    std::printf(
        "%-4lld MiB %-5.0f MiB %6.2f GB/s  %6.2f GB/s  %5.2f   %6.2f GB/s   "
        "%6.2f GB/s   %6.2f GB/s   %6.2f GB/s   %6.2f GB/s   %5.2f   %5.2f   "
        "%5.2f   %5.2f   %5.2f   %5.2f   %5.2f\n",
        static_cast<long long>(r.value("state_mb", 0)),
        r.value("piece_mb", 0.0), r.value("snapshot_gbps", 0.0),
        r.value("memcpy_gbps", 0.0), r.value("snapshot_vs_memcpy", 0.0),
        r.value("replication_gbps", 0.0), r.value("transfer_gbps", 0.0),
        r.value("replication_verify_at_restore_gbps", 0.0),
        r.value("replication_overlapped_gbps", 0.0),
        r.value("raw_exchange_gbps", 0.0), r.value("replication_vs_raw", 0.0),
        r.value("transfer_vs_raw", 0.0),
        r.value("replication_verify_at_restore_vs_raw", 0.0),
        r.value("replication_overlapped_vs_raw", 0.0),
        r.value("held_vs_raw", 0.0),
        r.value("held_verify_at_restore_vs_raw", 0.0),
        r.value("held_overlapped_vs_raw", 0.0));
  }
  {
    const json& m = out["latency"];
    std::printf(
        "latencies a round pays and a raw exchange does not: thread wake-up "
        "round trip p50 %.0f us, p90 %.0f us; ",
        m.value("wakeup_round_trip_us_p50", 0.0),
        m.value("wakeup_round_trip_us_p90", 0.0));
    if (m.contains("ack_commit_error")) {
      std::printf("ack to commit: %s\n",
                  m.value("ack_commit_error", "").c_str());
    } else {
      std::printf("ack to commit p50 %.0f us, p90 %.0f us\n",
                  m.value("ack_commit_us_p50", 0.0),
                  m.value("ack_commit_us_p90", 0.0));
    }
  }
  if (out.contains("overhead")) {
    const json& o = out["overhead"];
    std::printf(
        "every-step snapshots, %lld MiB state, %lld steps of %lld ms, %.0f ms "
        "without snapshots:\n"
        "  copied between the steps:               %.0f ms, overhead %.1f "
        "%%\n"
        "  copied during the next step (default):  %.0f ms, overhead %.1f "
        "%%\n",
        static_cast<long long>(o.value("state_mb", 0)),
        static_cast<long long>(o.value("steps", 0)),
        static_cast<long long>(o.value("step_ms", 0)),
        o.value("wall_ms_no_snapshots", 0.0),
        o.value("wall_ms_every_step", 0.0), 100 * o.value("overhead", 0.0),
        o.value("wall_ms_every_step_overlapped", 0.0),
        100 * o.value("overhead_overlapped", 0.0));
  }
  return 0;
}
