// The pause clock (src/runtime/pause_clock.h) in a child process, paused
// from outside: a SIGSTOP sent by pid, and a cgroup v1 CPU quota. A child
// that only waits is not paused.
#include "src/runtime/pause_clock.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "holdfast/clock.h"

namespace {

enum class Child { kBusy, kWaiting };

struct Forked {
  pid_t pid = -1;
  int out = -1;  // the child's report: paused ns over its run, total ns
};

// A child with a pause clock that runs for `run` (burning CPU, or blocked
// in a sleep) and then writes what the clock saw.
Forked Start(Child kind, absl::Duration run) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    holdfast::PauseClock clock;
    const int64_t t0 = holdfast::MonotonicNanos();
    const absl::Time end = absl::Now() + run;
    volatile uint64_t x = 0;
    while (absl::Now() < end) {
      if (kind == Child::kBusy) {
        for (int i = 0; i < 100000; ++i) x = x + static_cast<uint64_t>(i);
      } else {
        absl::SleepFor(absl::Milliseconds(50));
      }
    }
    const int64_t t1 = holdfast::MonotonicNanos();
    const int64_t report[2] = {clock.PausedNs(t0, t1), clock.TotalPausedNs()};
    (void)!::write(fds[1], report, sizeof(report));
    ::_exit(clock.Running() ? 0 : 3);
  }
  ::close(fds[1]);
  return Forked{pid, fds[0]};
}

// The child's report (paused ns within its run, total ns), once it exited.
std::pair<int64_t, int64_t> Finish(const Forked& f) {
  int64_t report[2] = {-1, -1};
  const ssize_t n = ::read(f.out, report, sizeof(report));
  ::close(f.out);
  int status = 0;
  ::waitpid(f.pid, &status, 0);
  REQUIRE(n == static_cast<ssize_t>(sizeof(report)));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return {report[0], report[1]};
}

bool Write(const std::string& path, const std::string& value) {
  std::ofstream f(path);
  f << value;
  f.flush();
  return static_cast<bool>(f);
}

constexpr char kCpuRoot[] = "/sys/fs/cgroup/cpu";

}  // namespace

TEST_CASE("pause clock: a SIGSTOP sent from outside is a pause of its length") {
  const Forked child = Start(Child::kBusy, absl::Milliseconds(1200));
  absl::SleepFor(absl::Milliseconds(200));
  REQUIRE(::kill(child.pid, SIGSTOP) == 0);
  absl::SleepFor(absl::Milliseconds(400));
  REQUIRE(::kill(child.pid, SIGCONT) == 0);
  const auto [paused, total] = Finish(child);
  INFO("paused " << paused / 1000000 << " ms, total " << total / 1000000
                 << " ms");
  CHECK(paused >= 350 * 1000000LL);
  // A 2-core machine shared with other tests adds some.
  CHECK(paused <= 700 * 1000000LL);
  CHECK(total >= paused);
}

TEST_CASE("pause clock: a process that waits is not paused") {
  const Forked child = Start(Child::kWaiting, absl::Milliseconds(800));
  const auto [paused, total] = Finish(child);
  INFO("paused " << paused / 1000000 << " ms");
  CHECK(paused < 150 * 1000000LL);
}

TEST_CASE("pause clock: a cgroup CPU quota's throttling is paused time") {
  const std::string group =
      absl::StrCat(kCpuRoot, "/holdfast-pause-test-", ::getpid());
  if (::mkdir(group.c_str(), 0755) != 0) {
    WARN("no cgroup v1 cpu controller to write (needs root): skipped");
    return;
  }
  REQUIRE(Write(group + "/cpu.cfs_period_us", "100000"));
  REQUIRE(Write(group + "/cpu.cfs_quota_us", "20000"));  // 20 % of a core
  const Forked child = Start(Child::kBusy, absl::Milliseconds(2000));
  const bool moved = Write(group + "/cgroup.procs", std::to_string(child.pid));
  const auto [paused, total] = Finish(child);
  std::ifstream stat(group + "/cpu.stat");
  std::string throttled((std::istreambuf_iterator<char>(stat)),
                        std::istreambuf_iterator<char>());
  ::rmdir(group.c_str());
  REQUIRE(moved);
  INFO("the group's cpu.stat: " << throttled);
  INFO("paused " << paused / 1000000 << " ms of 2000");
  // Throttled about 80 % of its run, less the first quarter second (the
  // clock finds its new group then): 1035-1399 ms in 4 runs. The clock's
  // own lateness alone saw 250-440 ms of 1500.
  CHECK(paused >= 800 * 1000000LL);
}
