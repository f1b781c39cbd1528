// Benchmark support: jobs of holdfast-run run as child processes (through
// the shell, in a process group of their own), and what they leave behind
// (their output, the injector's log lines, the final hashes).
#ifndef HOLDFAST_BENCHMARKS_BENCH_JOB_H_
#define HOLDFAST_BENCHMARKS_BENCH_JOB_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace holdfast::bench {

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// Starts `cmd` through the shell in a process group of its own; its pid.
inline pid_t Start(const std::string& cmd) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// The exit status of `pid`, or nullopt once `deadline` passed (it is then
// killed with its process group).
inline std::optional<int> Await(pid_t pid, absl::Time deadline) {
  for (;;) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    if (absl::Now() > deadline) {
      ::kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return std::nullopt;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// The Unix ms of the injector's first "injecting fault '<kind>..." line.
inline int64_t InjectedAt(const std::string& log, const std::string& kind) {
  std::istringstream in(log);
  const std::string mark = "unix ms ";
  for (std::string line; std::getline(in, line);) {
    if (line.find("injecting fault '" + kind) == std::string::npos) continue;
    const size_t at = line.rfind(mark);
    if (at != std::string::npos) {
      return std::strtoll(line.c_str() + at + mark.size(), nullptr, 10);
    }
  }
  return 0;
}

// The final hash every slot printed ("final step=... params_sha256=<hex>"),
// or "" when fewer than `ranks` printed one or they differ.
inline std::string AgreedHash(const std::string& out, int ranks) {
  std::vector<std::string> hashes;
  const std::string mark = "params_sha256=";
  for (size_t at = out.find(mark); at != std::string::npos;
       at = out.find(mark, at + 1)) {
    hashes.push_back(out.substr(at + mark.size(), 64));
  }
  const bool agree =
      static_cast<int>(hashes.size()) == ranks &&
      std::all_of(hashes.begin(), hashes.end(),
                  [&](const std::string& h) { return h == hashes[0]; });
  return agree ? hashes[0] : std::string();
}

inline int64_t Percentile(std::vector<int64_t> v, double q) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(
      v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

}  // namespace holdfast::bench

#endif  // HOLDFAST_BENCHMARKS_BENCH_JOB_H_
