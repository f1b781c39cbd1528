// Slowness from outside a worker's process, as an OS or a noisy neighbour
// makes it: a SIGSTOP/SIGCONT duty cycle by pid, or a cgroup v1 CPU quota.
// Each finds the worker of a slot through the job's members.json (its log
// directory) once it has reached a step, and throttles it until Stop().
// For the job tests and gray_bench.
#ifndef HOLDFAST_TEST_SUPPORT_THROTTLE_H_
#define HOLDFAST_TEST_SUPPORT_THROTTLE_H_

#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "test/support/members_json.h"

namespace holdfast::test {

// Slot `slot`'s process, once it has done `from_step` steps in the job of
// `dir`, is stopped `stop_ms` of every `period_ms` until Stop(). pid() is
// -1 if it never appeared; onset_ms() the Unix ms of the first stop (0
// before).
class DutyCycle {
 public:
  DutyCycle(const std::string& dir, int slot, int stop_ms = 40,
            int period_ms = 60, int64_t from_step = 3)
      : thread_([this, dir, slot, stop_ms, period_ms, from_step] {
          pid_ = AwaitWorker(dir, slot, from_step, absl::Seconds(60),
                             [this] { return done_.load(); });
          onset_ms_ = absl::ToUnixMillis(absl::Now());
          while (pid_ > 0 && !done_) {
            if (::kill(pid_, SIGSTOP) != 0) break;  // gone
            absl::SleepFor(absl::Milliseconds(stop_ms));
            ::kill(pid_, SIGCONT);
            absl::SleepFor(absl::Milliseconds(period_ms - stop_ms));
          }
          if (pid_ > 0) ::kill(pid_, SIGCONT);
        }) {}
  DutyCycle(const DutyCycle&) = delete;
  DutyCycle& operator=(const DutyCycle&) = delete;
  ~DutyCycle() { Stop(); }
  void Stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  pid_t pid() const { return pid_; }
  int64_t onset_ms() const { return pid_ > 0 ? onset_ms_.load() : 0; }

 private:
  std::atomic<bool> done_{false};
  std::atomic<pid_t> pid_{-1};
  std::atomic<int64_t> onset_ms_{0};
  std::thread thread_;
};

// Caps slot `slot`'s process at `percent` % of a core with the cgroup v1
// cpu controller (cpu.cfs_quota_us) once it has done `from_step` steps in
// the job of `dir`, until Stop() moves it back. ok() is false where the
// cgroup cannot be made (not root, no cgroup v1 cpu controller); then
// nothing is throttled.
class CpuQuota {
 public:
  static constexpr const char* kRoot = "/sys/fs/cgroup/cpu";

  // Whether a cgroup can be made here.
  static bool Available() {
    const std::string probe =
        absl::StrCat(kRoot, "/holdfast-throttle-probe-", ::getpid());
    if (::mkdir(probe.c_str(), 0755) != 0) return false;
    ::rmdir(probe.c_str());
    return true;
  }

  CpuQuota(const std::string& dir, int slot, int percent, int64_t from_step = 3)
      : group_(absl::StrCat(kRoot, "/holdfast-throttle-", ::getpid(), "-",
                            Next())) {
    ok_ = ::mkdir(group_.c_str(), 0755) == 0 &&
          Write(group_ + "/cpu.cfs_period_us", "100000") &&
          Write(group_ + "/cpu.cfs_quota_us", std::to_string(percent * 1000));
    if (!ok_) return;
    thread_ = std::thread([this, dir, slot, from_step] {
      pid_ = AwaitWorker(dir, slot, from_step, absl::Seconds(60),
                         [this] { return done_.load(); });
      if (pid_ > 0) {
        moved_ = Write(group_ + "/cgroup.procs", std::to_string(pid_));
        onset_ms_ = absl::ToUnixMillis(absl::Now());
      }
    });
  }
  CpuQuota(const CpuQuota&) = delete;
  CpuQuota& operator=(const CpuQuota&) = delete;
  ~CpuQuota() { Stop(); }
  void Stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
    if (pid_ > 0) {
      Write(absl::StrCat(kRoot, "/cgroup.procs"), std::to_string(pid_));
    }
    if (ok_) ::rmdir(group_.c_str());
  }
  bool ok() const { return ok_; }
  pid_t pid() const { return pid_; }
  bool moved() const { return moved_; }
  int64_t onset_ms() const { return onset_ms_; }

 private:
  static int Next() {
    static std::atomic<int> n{0};
    return n++;
  }
  static bool Write(const std::string& path, const std::string& text) {
    std::ofstream out(path);
    out << text;
    out.flush();
    return static_cast<bool>(out);
  }

  const std::string group_;
  bool ok_ = false;
  std::atomic<bool> done_{false};
  std::atomic<pid_t> pid_{-1};
  std::atomic<bool> moved_{false};
  std::atomic<int64_t> onset_ms_{0};
  std::thread thread_;
};

}  // namespace holdfast::test

#endif  // HOLDFAST_TEST_SUPPORT_THROTTLE_H_
