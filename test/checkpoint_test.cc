// Checkpoint pieces, buddies and the disk tier. The placement and the
// on-disk format are tested as functions; the rest end to end: holdfast-run
// with the example trainer in ZeRO-1 mode (sharded momentum, replicated
// parameters), real faults (SIGKILL, a corrupted copy, an exit), and the
// survivors' final parameter hashes compared with a fault-free run.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "src/checkpoint/peer_memory.h"
#include "src/checkpoint/pieces.h"
#include "src/checkpoint/xxh3_variants.h"
#include "src/common/host_key.h"
#include "src/fault/fault.h"
#include "test/support/job_run.h"
#include "test/support/process_group.h"
#include "test/support/scoped_env.h"

namespace {

using holdfast::test::JobRun;
using holdfast::test::Launch;
namespace pieces = holdfast::pieces;

constexpr int kSteps = 40;

std::vector<std::string> Trainer(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--steps", std::to_string(kSteps),
                                   "--zero1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The fault-free run's hash for `n` slots (ZeRO-1 or plain).
std::string Reference(int n, bool zero1 = true) {
  std::vector<std::string> args = {"--steps", std::to_string(kSteps)};
  if (zero1) args.push_back("--zero1");
  JobRun r = Launch({"-n", std::to_string(n)}, args);
  REQUIRE(r.rc == 0);
  REQUIRE(r.hashes.size() == static_cast<size_t>(n));
  for (const std::string& h : r.hashes) REQUIRE(h == r.hashes[0]);
  return r.hashes[0];
}

void CheckFinished(const JobRun& r, int world) {
  INFO("summary: " << r.summary.dump(1));
  CHECK(r.rc == 0);
  holdfast::test::CheckFinished(r, world, kSteps);
}

// The newest step directory of `dir` holding all `world` pieces (-1: none).
int64_t NewestOnDisk(const std::string& dir, int world) {
  int64_t newest = -1;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    const int64_t step = std::stoll(name.substr(5));
    bool complete = true;
    for (int slot = 0; slot < world; ++slot) {
      complete &=
          std::filesystem::exists(pieces::PiecePath(dir, step, world, slot));
    }
    if (complete) newest = std::max(newest, step);
  }
  return newest;
}

// The step the disk tier restored (-1: none), from the trainers' logs.
int64_t DiskStep(const JobRun& r) {
  static const std::regex kDisk(R"(restored step (\d+) from the disk tier)");
  std::smatch m;
  if (!std::regex_search(r.err, m, kDisk)) return -1;
  return std::stoll(m[1]);
}

// Trainer arguments for a kill gated on a commit (kill:...:committed=N):
// steps long enough for every backup round to finish within its step.
// With the trainer's default steps (well under a millisecond) most
// snapshots are skipped, and slots may skip different ones; a round whose
// slots offer different steps backs up nothing. While the gated slot
// waits at its step (and the others wait for it inside theirs) no new
// snapshot can set that right, and on a loaded machine the gate ran out
// (60 s) with the wanted step never committed.
const std::vector<std::string> kRoundsKeepUp = {"--step-ms", "20"};

// A 4-slot ZeRO-1 job under these launcher arguments finishes with the
// fault-free run's hash.
JobRun ExpectFaultFreeHash(const std::vector<std::string>& args,
                           const std::vector<std::string>& extra = {}) {
  const std::string ref = Reference(4);
  JobRun r = Launch(args, Trainer(extra));
  CheckFinished(r, 4);
  CHECK(r.hashes[0] == ref);
  return r;
}

// ExpectFaultFreeHash with HOLDFAST_SAME_HOST_RESTORE=`same_host` ("on" or
// "off") for the job.
JobRun ExpectFaultFreeHashSameHost(const char* same_host,
                                   const std::vector<std::string>& args,
                                   const std::vector<std::string>& extra) {
  setenv("HOLDFAST_SAME_HOST_RESTORE", same_host, 1);
  absl::Cleanup unset = [] { unsetenv("HOLDFAST_SAME_HOST_RESTORE"); };
  return ExpectFaultFreeHash(args, extra);
}

// Lost steps of the kill's incident, -1 if none (a loaded machine may
// add a spurious incident beside it).
int64_t CrashLostSteps(const JobRun& r) {
  int64_t lost = -1;
  for (const auto& i : r.summary["incidents"]) {
    if (i.value("kind", "") == "crashed") lost = i.value("lost_steps", -1);
  }
  return lost;
}

std::vector<int> Received(const pieces::Placement& p, int world) {
  std::vector<int> n(static_cast<size_t>(world), 0);
  for (const auto& b : p.buddies) {
    for (int c : b) ++n[static_cast<size_t>(c)];
  }
  return n;
}

}  // namespace

// ---- Partitions and placement ----------------------------------------------

TEST_CASE("checkpoint: partitions cover the array once in whole units") {
  for (size_t total : {size_t{0}, size_t{4}, size_t{36}, size_t{2324}}) {
    for (int parts : {1, 2, 3, 4, 7}) {
      size_t next = 0;
      size_t lo = SIZE_MAX, hi = 0;
      for (int p = 0; p < parts; ++p) {
        const pieces::Range r = pieces::Partition(total, 4, parts, p);
        CHECK(r.offset == next);
        CHECK(r.bytes % 4 == 0);
        next = r.end();
        lo = std::min(lo, r.bytes);
        hi = std::max(hi, r.bytes);
      }
      CHECK(next == total);
      CHECK(hi - lo <= 4);
    }
  }
  CHECK(pieces::Partition(100, 1, 4, 4).bytes == 0);  // out of range
  CHECK(pieces::Intersect({0, 10}, {10, 5}).bytes == 0);
  CHECK(pieces::Intersect({0, 10}, {5, 10}).offset == 5);
  CHECK(pieces::Intersect({0, 10}, {5, 10}).bytes == 5);
}

TEST_CASE("checkpoint: buddies sit evenly in another failure domain") {
  for (int hosts : {2, 4}) {
    for (int r : {1, 2}) {
      pieces::PlacementInput in;
      const int world = 8;
      for (int s = 0; s < world; ++s) {
        in.domain.push_back(static_cast<uint64_t>(100 + s * hosts / world));
      }
      in.replicas = r;
      const pieces::Placement p = pieces::Place(in);
      INFO("hosts " << hosts << " replicas " << r);
      CHECK(p.warnings.empty());
      for (int s = 0; s < world; ++s) {
        const auto& b = p.buddies[static_cast<size_t>(s)];
        REQUIRE(b.size() == static_cast<size_t>(r));
        CHECK(std::set<int>(b.begin(), b.end()).size() == b.size());
        for (int c : b) {
          CHECK(c != s);
          CHECK(in.domain[static_cast<size_t>(c)] !=
                in.domain[static_cast<size_t>(s)]);
        }
      }
      // Every slot holds exactly r copies: nobody is a hot spot.
      for (int n : Received(p, world)) CHECK(n == r);
      // Deterministic.
      CHECK(pieces::Place(in).buddies == p.buddies);
    }
  }
}

TEST_CASE("checkpoint: buddies are placed outside the slot's parallel groups") {
  // 8 slots, TP 2 x PP 2 x DP 2, one host per DP replica.
  pieces::PlacementInput in;
  for (int s = 0; s < 8; ++s) in.domain.push_back(s < 4 ? 1 : 2);
  in.tp = 2;
  in.pp = 2;
  const pieces::Placement p = pieces::Place(in);
  CHECK(p.warnings.empty());
  for (int s = 0; s < 8; ++s) {
    const int c = p.buddies[static_cast<size_t>(s)].at(0);
    const int same =
        (s % 2 == c % 2) + ((s / 2) % 2 == (c / 2) % 2) + (s / 4 == c / 4);
    INFO("slot " << s << " buddy " << c);
    CHECK(same <= 1);  // shares no TP, PP or DP group
    CHECK(in.domain[static_cast<size_t>(c)] !=
          in.domain[static_cast<size_t>(s)]);
  }
}

TEST_CASE("checkpoint: one failure domain still gets buddies and a warning") {
  pieces::PlacementInput in;
  in.domain.assign(3, 7);
  in.replicas = 5;  // more than the other slots: capped at world - 1
  const pieces::Placement p = pieces::Place(in);
  CHECK(!p.warnings.empty());
  CHECK(p.warnings[0].find("failure domain") != std::string::npos);
  for (const auto& b : p.buddies) CHECK(b.size() == 2);
  in.domain.assign(1, 7);
  CHECK(pieces::Place(in).buddies.at(0).empty());
}

// ---- Checksums
// ---------------------------------------------------------------

TEST_CASE(
    "checkpoint: a process on this host is read in place, and a gone one is "
    "named") {
  CHECK(holdfast::HostKey() != 0);
  // The child's copy of `word` sits at the same address as the parent's.
  static uint64_t word = 0x5eedf00dcafe1234;
  int gate[2];
  REQUIRE(pipe(gate) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    word = 0x0123456789abcdef;  // the child's own value from here on
    char c;
    (void)!read(gate[0], &c, 1);
    _exit(0);
  }
  const auto address =
      static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&word));
  // The child may not have written its value yet: wait for it.
  uint64_t got = 0;
  for (int i = 0; i < 2000 && got != 0x0123456789abcdef; ++i) {
    REQUIRE(
        holdfast::peer_memory::Read(child, address, &got, sizeof(got)).ok());
    if (got != 0x0123456789abcdef) usleep(1000);
  }
  CHECK(got == 0x0123456789abcdef);
  CHECK(holdfast::peer_memory::Probe(child, address, 0x0123456789abcdef));
  CHECK(!holdfast::peer_memory::Probe(child, address, word));
  CHECK(!holdfast::peer_memory::Probe(child, 0, 0x0123456789abcdef));
  // An address the child does not map.
  absl::Status unmapped =
      holdfast::peer_memory::Read(child, 8, &got, sizeof(got));
  CHECK(unmapped.code() == absl::StatusCode::kUnavailable);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(gate[0]);
  close(gate[1]);
  absl::Status gone =
      holdfast::peer_memory::Read(child, address, &got, sizeof(got));
  CHECK(gone.code() == absl::StatusCode::kUnavailable);
  CHECK(gone.message().find(absl::StrCat("process ", child)) !=
        std::string::npos);
  CHECK(!holdfast::peer_memory::Probe(child, address, 0x0123456789abcdef));
}

TEST_CASE(
    "checkpoint: a process the kernel does not let this one read fails the "
    "probe") {
  // The probe is what sends a restore over the communicator where reads
  // in place are not allowed. Root may read any process, so as root a
  // child that dropped to another user tries to read this process; as
  // another user, this process tries to read a child that made itself
  // non-dumpable.
  static uint64_t word = 0x1122334455667788;
  const auto address =
      static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&word));
  auto refused = [&](pid_t pid) {
    uint64_t got = 0;
    const absl::Status s =
        holdfast::peer_memory::Read(pid, address, &got, sizeof(got));
    return !holdfast::peer_memory::Probe(pid, address, word) &&
           s.code() == absl::StatusCode::kUnavailable &&
           s.message().find("not permitted") != std::string::npos;
  };
  if (getuid() == 0) {
    const pid_t parent = getpid();
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
      _exit(refused(parent) ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  } else {
    int gate[2], ready[2];
    REQUIRE(pipe(gate) == 0);
    REQUIRE(pipe(ready) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
      (void)!write(ready[1], "r", 1);
      char c;
      (void)!read(gate[0], &c, 1);
      _exit(0);
    }
    char c;
    REQUIRE(read(ready[0], &c, 1) == 1);
    CHECK(refused(child));
    (void)!write(gate[1], "x", 1);
    waitpid(child, nullptr, 0);
    for (int fd : {gate[0], gate[1], ready[0], ready[1]}) close(fd);
  }
}

TEST_CASE("checkpoint: every checksum variant gives libxxhash's XXH3 value") {
  std::vector<const HfXxh3Variant*> variants = {&hf_xxh3_baseline};
#ifdef HOLDFAST_XXH3_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) variants.push_back(&hf_xxh3_avx2);
  if (__builtin_cpu_supports("avx512f")) variants.push_back(&hf_xxh3_avx512);
#endif
  // The best variant is one of those this CPU runs.
  CHECK(std::find(variants.begin(), variants.end(), hf_xxh3_best()) !=
        variants.end());
  std::vector<uint8_t> data((size_t{1} << 20) + 4099);
  uint64_t x = 0x9e3779b97f4a7c15;
  for (uint8_t& b : data) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  // Each of XXH3's code paths: empty, short inputs, one stripe block, many
  // blocks, and a tail.
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{16}, size_t{17},
                   size_t{128}, size_t{129}, size_t{240}, size_t{241},
                   size_t{1024}, size_t{65536} + 7, data.size()}) {
    const uint64_t want = XXH3_64bits(data.data(), n);
    CHECK(pieces::Checksum(data.data(), n) == want);
    for (const HfXxh3Variant* v : variants) {
      INFO(v->name << " on " << n << " bytes");
      CHECK(v->hash(data.data(), n) == want);
      // Streamed in uneven pieces.
      void* st = v->new_state();
      REQUIRE(st != nullptr);
      for (size_t off = 0, k = 1; off < n; k = k * 3 + 1) {
        const size_t m = std::min(k, n - off);
        v->update(st, data.data() + off, m);
        off += m;
      }
      CHECK(v->digest(st) == want);
      v->free_state(st);
    }
  }
  // CopyHasher copies while it hashes.
  std::vector<uint8_t> copy(data.size());
  pieces::CopyHasher h;
  uint8_t* end = h.Copy(copy.data(), data.data(), 1000);
  end = h.Copy(end, data.data() + 1000, data.size() - 1000);
  CHECK(end == copy.data() + copy.size());
  CHECK(copy == data);
  CHECK(h.Digest() == XXH3_64bits(data.data(), data.size()));
}

// ---- The disk format
// ---------------------------------------------------------

TEST_CASE(
    "checkpoint: disk pieces round-trip with their ledger, and damage or an "
    "old format is refused by name") {
  const std::string dir = holdfast::proc::MakeTempDir();
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
  pieces::PieceHeader h;
  h.step = 30;
  h.world = 2;
  h.layout_hash = 42;
  h.bytes = data.size();
  h.checksum = pieces::Checksum(data.data(), data.size());
  h.ledger = {1700000000000, 123456, 789};
  for (int slot = 0; slot < 2; ++slot) {
    h.slot = slot;
    REQUIRE(pieces::WritePiece(dir, h, data.data()).ok());
  }
  // A newer step with one piece of two is not complete.
  h.step = 40;
  h.slot = 0;
  REQUIRE(pieces::WritePiece(dir, h, data.data()).ok());
  auto found = pieces::FindNewest(dir, 42);
  REQUIRE(found.ok());
  REQUIRE(found->has_value());
  CHECK((*found)->step == 30);
  CHECK((*found)->world == 2);

  pieces::PieceHeader got;
  std::vector<uint8_t> back;
  const std::string path = pieces::PiecePath(dir, 30, 2, 1);
  REQUIRE(pieces::ReadPiece(path, 42, &got, &back).ok());
  CHECK(back == data);
  CHECK(got.slot == 1);
  CHECK(got.ledger == h.ledger);

  absl::Status s = pieces::ReadPiece(path, 43, &got, &back);
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message().find("another state layout") != absl::string_view::npos);

  {  // One flipped byte.
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(80 + 500);  // past the header
    f.put(static_cast<char>(0xff));
  }
  s = pieces::ReadPiece(path, 42, &got, &back);
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message().find("failed its checksum") != absl::string_view::npos);
  CHECK(s.message().find(path) != absl::string_view::npos);

  {  // Format 1, from before pieces carried the ledger.
    const std::string old_path = pieces::PiecePath(dir, 30, 2, 0);
    std::fstream f(old_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(7);
    f.put('1');
    f.close();
    s = pieces::ReadPiece(old_path, 42, &got, &back);
    CHECK(s.code() == absl::StatusCode::kDataLoss);
    CHECK(s.message().find("format 1") != absl::string_view::npos);
  }

  std::filesystem::resize_file(path, 300);
  s = pieces::ReadPiece(path, 42, &got, &back);
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message().find("truncated") != absl::string_view::npos);

  // Only another layout on disk: refused, naming the directory.
  auto other = pieces::FindNewest(dir, 7);
  CHECK(other.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(other.status().message().find(dir) != absl::string_view::npos);
  // No directory at all: nothing, no error.
  auto none = pieces::FindNewest(dir + "/absent", 42);
  REQUIRE(none.ok());
  CHECK(!none->has_value());
}

TEST_CASE("checkpoint: the corrupt-piece fault parses and needs its step") {
  auto f = holdfast::fault::Parse("corrupt-piece:slot=1:step=20");
  REQUIRE(f.ok());
  CHECK(f->at(0).kind == holdfast::fault::Kind::kCorruptPiece);
  CHECK(f->at(0).step == 20);
  CHECK(!holdfast::fault::Parse("corrupt-piece:slot=1").ok());
  CHECK(!holdfast::fault::Parse("corrupt-piece:slot=1:recovery=1").ok());
  auto b = holdfast::fault::Parse("corrupt-backup:slot=2:step=10");
  REQUIRE(b.ok());
  CHECK(b->at(0).kind == holdfast::fault::Kind::kCorruptBackup);
  CHECK(!holdfast::fault::Parse("corrupt-backup:slot=1").ok());
  CHECK(!holdfast::fault::Parse("corrupt-backup:slot=1:recovery=1").ok());
  // corrupt-restore: the step is optional (unset: -1, any restore).
  auto r = holdfast::fault::Parse("corrupt-restore:slot=1");
  REQUIRE(r.ok());
  CHECK(r->at(0).kind == holdfast::fault::Kind::kCorruptRestore);
  CHECK(r->at(0).step == -1);
  auto rs = holdfast::fault::Parse("corrupt-restore:slot=1:step=9");
  REQUIRE(rs.ok());
  CHECK(rs->at(0).step == 9);
  CHECK(!holdfast::fault::Parse("corrupt-restore:slot=1:recovery=1").ok());
  CHECK(!holdfast::fault::Parse("corrupt-restore:slot=1:ms=5").ok());
}

// ---- End to end
// ----------------------------------------------------------------

TEST_CASE("checkpoint: ZeRO-1 trains exactly like the plain trainer") {
  CHECK(Reference(4, true) == Reference(4, false));
}

TEST_CASE("checkpoint: ZeRO-1 with a killed rank equals the fault-free run") {
  ExpectFaultFreeHash(
      {"-n", "4", "--standby", "1", "--inject", "kill:slot=2:step=20"});
}

TEST_CASE(
    "checkpoint: ZeRO-1 with snapshots copied during the next step (required) "
    "and a killed rank equals the fault-free run") {
  // The kill waits for a commit past step 0 (a loaded machine may slow
  // the first rounds).
  JobRun r = ExpectFaultFreeHash(
      {"-n", "4", "--standby", "1", "--inject",
       "kill:slot=2:step=20:committed=1"},
      {"--snapshot-copy", "during-next-step", "--step-ms", "5"});
  // The survivors were at step 19: a deferred snapshot past step 0 was
  // committed and restored.
  REQUIRE(r.summary["incidents"].size() == 1);
  CHECK(r.summary["incidents"][0].value("lost_steps", 99) < 19);
}

TEST_CASE("checkpoint: one fault per failure domain") {
  ExpectFaultFreeHash({"-n", "4", "--standby", "2", "--hosts", "2", "--inject",
                       "kill:slot=1:step=10", "--inject",
                       "kill:slot=2:step=25"});
}

TEST_CASE("checkpoint: whole-node loss: two ranks with the same host label") {
  // host0 holds slots 0 and 1; their pieces' buddies are on host1.
  ExpectFaultFreeHash({"-n", "4", "--standby", "2", "--hosts", "2", "--inject",
                       "kill:slot=0:step=20", "--inject",
                       "kill:slot=1:step=21"});
}

TEST_CASE("checkpoint: a corrupted copy is refused and another copy used") {
  // Snapshots every 10 steps: step 20 is the one restored after the kill
  // at 25 (which waits for its commit, in case a loaded machine slows the
  // round), and slot 1's own copy of it is corrupt; its buddy (slot 3)
  // lives. Steps of 20 ms leave every round time to finish.
  JobRun r =
      ExpectFaultFreeHash({"-n", "4", "--standby", "1", "--hosts", "2",
                           "--inject", "corrupt-piece:slot=1:step=20",
                           "--inject", "kill:slot=2:step=25:committed=20"},
                          {"--snapshot-every", "10", "--step-ms", "20"});
  CHECK(r.err.find("slot 1's copy of the piece of slot 1 (world 4, step 20) "
                   "failed its checksum") != std::string::npos);
}

TEST_CASE(
    "checkpoint: a backup damaged on arrival is refused and its step not "
    "committed") {
  // Snapshots every 10 steps; slot 1 damages the copy it receives of step
  // 10. After the kill at 15 the survivors (at step 14) roll back to step
  // 0, not 10, and still end with the fault-free hash.
  JobRun r = ExpectFaultFreeHash(
      {"-n", "4", "--standby", "1", "--inject", "corrupt-backup:slot=1:step=10",
       "--inject", "kill:slot=2:step=15"},
      {"--snapshot-every", "10", "--step-ms", "20"});
  CHECK(r.err.find("piece of step 10 arrived corrupt; the step is not "
                   "committed") != std::string::npos);
  CHECK(CrashLostSteps(r) == 14);
}

TEST_CASE(
    "checkpoint: on four slots a damaged copy stops its step on every slot and "
    "the snapshots after it commit") {
  // Slot 1 damages the copy it receives of step 10 and does not ack it.
  // The round's verdict (a maximum over the four slots) tells the other
  // three, which drop the step instead of waiting for its commit; without
  // it their backup threads would wait for that commit to the end, and no
  // later snapshot would commit.
  JobRun r = ExpectFaultFreeHash(
      {"-n", "4", "--inject", "corrupt-backup:slot=1:step=10"},
      {"--snapshot-every", "10", "--step-ms", "20"});
  CHECK(r.err.find("piece of step 10 arrived corrupt; the step is not "
                   "committed") != std::string::npos);
  CHECK(r.summary.value("committed_step", int64_t{-1}) == kSteps);
}

TEST_CASE(
    "checkpoint: with verify-backups restore a damaged copy commits and the "
    "restore refuses it") {
  // Two copies of each piece; slot 1 damages the copy of slot 0's piece
  // of step 10 as it lands, and does not check it. Step 10 commits; after
  // slot 0's loss at 15 (which waits for that commit) the restore finds
  // the damage, uses slot 2's copy, and the run ends with the fault-free
  // hash.
  JobRun r = ExpectFaultFreeHash(
      {"-n", "4", "--standby", "1", "--replicas", "2", "--verify-backups",
       "restore", "--inject", "corrupt-backup:slot=1:step=10", "--inject",
       "kill:slot=0:step=15:committed=10"},
      {"--snapshot-every", "10", "--step-ms", "20"});
  CHECK(r.err.find("arrived corrupt") == std::string::npos);
  CHECK(r.err.find("slot 1's copy of the piece of slot 0 (world 4, step 10) "
                   "failed its checksum") != std::string::npos);
  // Step 10 committed: in "arrival" mode it would not.
  CHECK(CrashLostSteps(r) == 4);
}

TEST_CASE(
    "checkpoint: a piece damaged in a restore's transfer comes again from its "
    "next holder") {
  // Two copies of every piece: the standby taking slot 1 receives every
  // piece of the restored step (5 or later, so not the initial state it
  // already holds) and one of them is damaged as it lands. It is refused
  // and received again from the piece's other holder; the run ends with
  // the fault-free hash. Steps of 20 ms let every round finish within its
  // step (see kRoundsKeepUp). Every member is on this host: by default
  // the standby reads the pieces straight from the holders' memory (the
  // second try from the second holder's); with HOLDFAST_SAME_HOST_RESTORE
  // off they come over the communicator.
  for (const char* same_host : {"on", "off"}) {
    INFO("HOLDFAST_SAME_HOST_RESTORE=" << same_host);
    JobRun r = ExpectFaultFreeHashSameHost(
        same_host,
        {"-n", "4", "--standby", "1", "--replicas", "2", "--inject",
         "kill:slot=1:step=10:committed=5", "--inject",
         "corrupt-restore:slot=1"},
        kRoundsKeepUp);
    static const std::regex kRefused(
        R"(the piece of slot \d \(world 4, step (\d+)\) received from )"
        R"(slot \d failed its checksum; receiving it from its next holder)");
    CHECK(std::regex_search(r.err, kRefused));
    CHECK(r.err.find("DATA_LOSS") == std::string::npos);
    // The standby's restore: every byte it received read in place, or none.
    static const std::regex kJoined(
        R"(slot 1 of 4 joined at generation \d+: step \d+ restored \((\d+) )"
        R"(bytes received(, (\d+) of them read in place on this host)?\))");
    std::smatch m;
    REQUIRE(std::regex_search(r.err, m, kJoined));
    CHECK(std::stoll(m[1]) > 0);
    if (std::string(same_host) == "on") {
      CHECK(m[3] == m[1]);
    } else {
      CHECK(!m[2].matched);
    }
  }
}

TEST_CASE(
    "checkpoint: a piece read in place straight into the live state and "
    "damaged "
    "there comes again from its next holder") {
  // The plain trainer (all its state replicated: every byte of every
  // piece is needed by every member). Slot 3 dies; its piece and slot 2's
  // each keep one copy, so the standby taking slot 3 keeps its copies of
  // those two and reads the others (slot 0's and slot 1's, with two
  // holders each) from the holders' memory straight into its live
  // buffers. The first of them, slot 0's, is damaged there; the standby
  // refuses it, reads it again from its other holder, and the run ends
  // with the fault-free hash. A restore from the committed step's pieces:
  // not from the survivors' live state (recovery_test has that).
  holdfast::test::ScopedEnv memory("HOLDFAST_LIVE_RESTORE", "off");
  const std::string ref = Reference(4, /*zero1=*/false);
  JobRun r = Launch(
      {"-n", "4", "--standby", "1", "--inject",
       "kill:slot=3:step=10:committed=5", "--inject", "corrupt-restore:slot=3"},
      {"--steps", std::to_string(kSteps), "--step-ms", "20"});
  CheckFinished(r, 4);
  CHECK(r.hashes[0] == ref);
  INFO("stderr: " << r.err);
  static const std::regex kDamaged(
      R"(corrupted the piece of slot 0 that slot 3 received for step )"
      R"((\d+), read into its live state \(injected\))");
  std::smatch m;
  REQUIRE(std::regex_search(r.err, m, kDamaged));
  CHECK(r.err.find(absl::StrCat(
            "the piece of slot 0 (world 4, step ", m[1].str(),
            ") received from slot 0 failed its checksum; "
            "receiving it from its next holder")) != std::string::npos);
  CHECK(r.err.find("DATA_LOSS") == std::string::npos);
}

TEST_CASE(
    "checkpoint: after a restore every piece has replicas + 1 copies again, so "
    "a "
    "second loss before the next commit loses nothing") {
  // One copy of each piece besides its owner's; snapshots every 10 steps.
  // Slot 1 dies at step 15: step 10 is restored, and the pieces slot 1
  // held (its own, and its copy of slot 0's) are left with one holder
  // each, so one member receiving each keeps its copy. Slot 2, the other
  // holder of slot 1's piece, dies at step 17, before step 20 is
  // committed: step 10 is restored again, slot 1's piece from the kept
  // copy, and the run ends with the fault-free hash. (Without the kept
  // copy that piece would be gone: DataLoss.)
  // The plain trainer, whose pieces are read straight into the live state
  // unless their copies are kept; restores from the committed step's
  // pieces, not from the survivors' live state (recovery_test has that).
  holdfast::test::ScopedEnv memory("HOLDFAST_LIVE_RESTORE", "off");
  const std::string ref = Reference(4, /*zero1=*/false);
  JobRun r = Launch(
      {"-n", "4", "--standby", "2", "--inject",
       "kill:slot=1:step=15:committed=10", "--inject", "kill:slot=2:step=17"},
      {"--steps", std::to_string(kSteps), "--snapshot-every", "10", "--step-ms",
       "20"});
  INFO("stderr: " << r.err);
  CheckFinished(r, 4);
  CHECK(r.hashes[0] == ref);
  CHECK(r.err.find("DATA_LOSS") == std::string::npos);
  // Both restores roll back to the same step: step 10, unless the first
  // kill's gate ran out before step 10 was committed (a loaded machine),
  // and then the older step it restored, which no commit replaced either.
  static const std::regex kRestored(
      R"(slot \d of 4 joined at generation (\d+): step (\d+) restored)");
  std::set<std::string> generations, steps;
  for (auto it = std::sregex_iterator(r.err.begin(), r.err.end(), kRestored);
       it != std::sregex_iterator(); ++it) {
    generations.insert((*it)[1].str());
    steps.insert((*it)[2].str());
  }
  CHECK(generations == std::set<std::string>{"1", "2"});
  CHECK(steps.size() == 1);
}

TEST_CASE(
    "checkpoint: a holder that dies while a restore moves its copies is "
    "replaced, and the next restore uses the other copies") {
  // Three copies of every piece. Slot 1 dies; in the restore that follows
  // (generation 1) slot 2 kills itself as the pieces begin to move, after
  // telling the others where its copies lie: a member reading one of them
  // in place finds the process gone, one receiving it over the
  // communicator loses the connection. Either way generation 1 fails, the
  // second standby takes slot 2, and generation 2 restores from the
  // copies that remain (slot 1's and slot 2's pieces each keep one). Both
  // with reads in place (the default) and over the communicator.
  for (const char* same_host : {"on", "off"}) {
    INFO("HOLDFAST_SAME_HOST_RESTORE=" << same_host);
    JobRun r = ExpectFaultFreeHashSameHost(
        same_host,
        {"-n", "4", "--standby", "2", "--replicas", "2", "--inject",
         "kill:slot=1:step=10:committed=5", "--inject",
         "kill:slot=2:restore=1"},
        kRoundsKeepUp);
    CHECK(r.err.find("injecting fault 'kill:slot=2:restore=1' in restore 1") !=
          std::string::npos);
    CHECK(r.err.find("recovering from generation 1") != std::string::npos);
    CHECK(r.err.find("DATA_LOSS") == std::string::npos);
    // The controller saw both deaths, the second in generation 1.
    INFO("summary: " << r.summary.dump(1));
    std::vector<std::pair<int, int64_t>> crashed;  // (slot, generation)
    for (const auto& i : r.summary["incidents"]) {
      if (i.value("kind", "") == "crashed") {
        crashed.emplace_back(i.value("slot", -1),
                             i.value("generation", int64_t{-1}));
      }
    }
    CHECK(crashed == std::vector<std::pair<int, int64_t>>{{1, int64_t{0}},
                                                          {2, int64_t{1}}});
  }
}

TEST_CASE(
    "checkpoint: a piece damaged in a restore's transfer with no other holder "
    "is refused, never loaded") {
  // One copy of every piece: the damaged one (slot 0's, whose buddy was
  // the killed slot 1) has no other holder. The standby refuses it with
  // DataLoss naming the piece and leaves; the survivors go on without it
  // in a world of 2 and agree.
  JobRun r = Launch(
      {"-n", "3", "--standby", "1", "--inject",
       "kill:slot=1:step=10:committed=5", "--inject", "corrupt-restore:slot=1"},
      Trainer(kRoundsKeepUp));
  INFO("stderr: " << r.err);
  CHECK(r.err.find("injecting fault 'corrupt-restore:slot=1'") !=
        std::string::npos);
  CHECK(r.err.find("no other member holds a good copy") != std::string::npos);
  static const std::regex kRefused(
      R"(DATA_LOSS: the piece of slot \d \(world 3, step (\d+)\) received )"
      R"(from slot \d failed its checksum)");
  CHECK(std::regex_search(r.err, kRefused));
  REQUIRE(r.hashes.size() == 2);
  CHECK(r.hashes[0] == r.hashes[1]);
  CHECK(r.worlds == std::vector<int>{2, 2});
  CHECK(r.summary["error"].value("code", "") == "DATA_LOSS");
}

TEST_CASE(
    "checkpoint: a piece lost with all its copies is DataLoss and no model") {
  // Slot 1's buddy is slot 3 (the same place on the other host). Slot 3
  // dies as soon as the recovery from slot 1's loss begins, before any
  // copy of slot 1's piece could be made elsewhere. (Two kills "at step
  // 20" raced: a slot 3 that had not started step 20 when slot 1's loss
  // was acted on was rolled back and died only after the new buddies held
  // the pieces.)
  JobRun r =
      Launch({"-n", "4", "--standby", "2", "--hosts", "2", "--inject",
              "kill:slot=1:step=20", "--inject", "kill:slot=3:recovery=1"},
             Trainer());
  CHECK(r.rc == 3);  // stopped (tools/launcher.h)
  CHECK(r.hashes.empty());
  CHECK(r.err.find("DATA_LOSS") != std::string::npos);
  CHECK(r.err.find("no live member holds a good copy of the pieces of slots "
                   "1, 3") != std::string::npos);
  // The launcher's summary names the error, not just the workers leaving.
  INFO("summary: " << r.summary.dump(1));
  CHECK(r.summary["error"].value("code", "") == "DATA_LOSS");
  CHECK(r.summary["error"].value("message", "").find("pieces of slots 1, 3") !=
        std::string::npos);
}

TEST_CASE("checkpoint: the disk tier restores when every memory copy is gone") {
  const std::string dir = holdfast::proc::MakeTempDir();
  // Slot 1 and its buddy, slot 3, are lost: slot 3 as soon as the
  // recovery from slot 1's loss begins, so no copy of slot 1's piece can be
  // made elsewhere first. (Two kills "at step 25" raced on a loaded
  // machine: a slot 3 that died only after the first recovery left every
  // piece in memory, and nothing was read from disk.)
  JobRun r = ExpectFaultFreeHash(
      {"-n", "4", "--standby", "2", "--hosts", "2", "--checkpoint-dir", dir,
       "--checkpoint-every", "10", "--inject", "kill:slot=1:step=25",
       "--inject", "kill:slot=3:recovery=1"},
      {"--step-ms", "10"});
  // A step written before the kills (which windows got written depends on
  // which backups ran: a loaded machine skips some).
  const int64_t d = DiskStep(r);
  CHECK(d > 0);
  CHECK(d < 25);
}

TEST_CASE("checkpoint: a restarted job resumes from the disk tier") {
  const std::string dir = holdfast::proc::MakeTempDir();
  // The first run stops (below its minimum world) at step 35, after some
  // committed steps were written.
  JobRun first =
      Launch({"-n", "4", "--min-world", "4", "--checkpoint-dir", dir,
              "--checkpoint-every", "10", "--inject", "exit:slot=0:step=35"},
             Trainer());
  CHECK(first.rc == 3);  // stopped
  CHECK(first.hashes.empty());
  const int64_t newest = NewestOnDisk(dir, 4);
  CHECK(newest > 0);
  CHECK(newest < 35);
  // A new job (new controller, new processes) on a smaller world.
  JobRun again = Launch({"-n", "2", "--checkpoint-dir", dir}, Trainer());
  CheckFinished(again, 2);
  CHECK(DiskStep(again) == newest);
  // ZeRO-1's arithmetic does not depend on the world size, but the
  // gradient sum's order does: compare the losses, not the bytes.
  JobRun ref2 = Launch({"-n", "2"}, Trainer());
  REQUIRE(ref2.losses.size() == 2);
  REQUIRE(again.losses.size() == 2);
  CHECK(again.losses[0] == Approx(ref2.losses[0]).epsilon(0.01));
}

TEST_CASE("checkpoint: in shrink mode the survivors take over the lost shard") {
  JobRun ref = Launch({"-n", "4"}, Trainer());
  REQUIRE(ref.losses.size() == 4);
  JobRun r =
      Launch({"-n", "4", "--mode", "shrink", "--inject", "kill:slot=1:step=20"},
             Trainer());
  CheckFinished(r, 3);
  REQUIRE(r.losses.size() == 3);
  CHECK(r.losses[0] == Approx(ref.losses[0]).epsilon(0.01));
}
