// ProcessWatch (src/control/wire/process_watch.h) on real processes: a
// SIGKILLed child holding 1 GiB is seen exiting before the kernel has torn
// its memory down and closed its files (the moment a heartbeat stream
// would end), identities this machine does not show are not watched, and
// an unwatched process is not reported.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "src/common/host_key.h"
#include "src/control/wire/process_watch.h"

using holdfast::control::ProcessIdentity;
using holdfast::control::ProcessWatch;
using holdfast::control::ReadProcStat;
using holdfast::control::SelfIdentity;

namespace {

// A child that touches `mib` MiB, then writes a byte to the ready pipe and
// waits to be killed. Its copy of the hold pipe's write end closes when
// the kernel closes its files: after its memory is torn down.
struct Child {
  explicit Child(size_t mib) {
    REQUIRE(pipe(ready) == 0);
    REQUIRE(pipe(hold) == 0);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const size_t bytes = mib << 20;
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) _exit(2);
      std::memset(p, 1, bytes);
      char c = 'r';
      if (write(ready[1], &c, 1) != 1) _exit(3);
      for (;;) pause();
    }
    close(ready[1]);
    close(hold[1]);
    char c;
    REQUIRE(read(ready[0], &c, 1) == 1);
  }
  ~Child() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    close(ready[0]);
    close(hold[0]);
  }
  ProcessIdentity identity() const {
    ProcessIdentity who;
    who.pid = pid;
    who.start = ReadProcStat(pid).value().start;
    who.host_key = SelfIdentity().host_key;
    return who;
  }
  // Blocks until the child's files are closed.
  void AwaitFilesClosed() {
    char c;
    while (read(hold[0], &c, 1) > 0) {
    }
  }
  int ready[2];
  int hold[2];
  pid_t pid = -1;
};

struct Seen {
  absl::Mutex mu;
  std::optional<absl::Time> at;
  std::string why;
  uint64_t id = 0;
  int calls = 0;
  ProcessWatch::OnExit Callback() {
    return [this](uint64_t i, const std::string& w) {
      absl::MutexLock lock(&mu);
      if (!at.has_value()) at = absl::Now();
      why = w;
      id = i;
      ++calls;
    };
  }
  bool Await(absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto done = [this]() { return at.has_value(); };
    return mu.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
};

}  // namespace

TEST_CASE("process watch: this process's identity is what /proc shows") {
  const ProcessIdentity me = SelfIdentity();
  CHECK(me.pid == getpid());
  CHECK(me.start > 0);
  CHECK(me.host_key != 0);
  CHECK(me.host_key == holdfast::HostKey());
  CHECK_FALSE(ReadProcStat(0).has_value());
  CHECK(ReadProcStat(me.pid)->state == 'R');
}

TEST_CASE(
    "process watch: a SIGKILLed process holding 1 GiB is seen exiting before "
    "its files close") {
  Child child(1024);
  Seen seen;
  ProcessWatch watch(absl::Milliseconds(1), seen.Callback());
  REQUIRE(watch.Watch(7, child.identity()));
  CHECK(watch.size() == 1);
  const absl::Time killed = absl::Now();
  REQUIRE(kill(child.pid, SIGKILL) == 0);
  child.AwaitFilesClosed();
  const absl::Time closed = absl::Now();
  REQUIRE(seen.Await(absl::Seconds(10)));
  absl::MutexLock lock(&seen.mu);
  std::printf(
      "process watch: seen %.1f ms after the kill, files closed after "
      "%.1f ms\n",
      absl::ToDoubleMilliseconds(*seen.at - killed),
      absl::ToDoubleMilliseconds(closed - killed));
  CHECK(seen.id == 7);
  CHECK_THAT(seen.why, Catch::Contains(std::to_string(child.pid)));
  CHECK(*seen.at < closed);
  CHECK(seen.calls == 1);
  CHECK(watch.size() == 0);
}

TEST_CASE(
    "process watch: another start time, another boot or no process is not "
    "watched, and an unwatched one is not reported") {
  Child child(1);
  Seen seen;
  ProcessWatch watch(absl::Milliseconds(1), seen.Callback());
  ProcessIdentity who = child.identity();
  ProcessIdentity reused = who;
  reused.start += 1;  // the pid names another process than registered
  CHECK_FALSE(watch.Watch(1, reused));
  ProcessIdentity elsewhere = who;
  elsewhere.host_key = who.host_key ^ 1;  // another kernel or pid namespace
  CHECK_FALSE(watch.Watch(2, elsewhere));
  ProcessIdentity unknown = who;
  unknown.start = 0;  // a member that did not say
  CHECK_FALSE(watch.Watch(3, unknown));
  CHECK(watch.size() == 0);
  REQUIRE(watch.Watch(4, who));
  watch.Unwatch(4);
  REQUIRE(kill(child.pid, SIGKILL) == 0);
  child.AwaitFilesClosed();
  CHECK_FALSE(seen.Await(absl::Milliseconds(50)));
  // Off: never watches.
  ProcessWatch off(absl::ZeroDuration(), seen.Callback());
  CHECK_FALSE(off.Watch(5, SelfIdentity()));
}
