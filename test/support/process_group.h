// Fork N ranks of a function, read the lines they report, send them real
// signals, and reap them with a time limit: for multi-process tests, the
// demo and the benchmarks. The parent never blocks without a bound;
// leftover children are SIGKILLed. Use from one thread of a process that
// has no other threads when it forks.
#ifndef HOLDFAST_TEST_SUPPORT_PROCESS_GROUP_H_
#define HOLDFAST_TEST_SUPPORT_PROCESS_GROUP_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace holdfast::proc {

// A fresh directory under $TMPDIR (or /tmp).
std::string MakeTempDir();

// CLOCK_MONOTONIC in nanoseconds: comparable across processes of one host.
int64_t MonoNanos();

// Child side: writes one line to the parent.
void Report(const std::string& line);

// Parses "k1=v1 k2=v2 msg=rest of line" ("msg" takes the rest).
std::map<std::string, std::string> ParseReport(const std::string& line);

class ProcessGroup {
 public:
  // Forks `n` children; child i runs body(i) and _exits with its result.
  ProcessGroup(int n, std::function<int(int rank)> body);
  // Runs each command (argv[0] a path) in a child whose stdout is its report
  // pipe (stderr is inherited). Safe in a multithreaded parent: the child
  // only calls async-signal-safe functions before exec.
  explicit ProcessGroup(const std::vector<std::vector<std::string>>& commands);
  ~ProcessGroup();

  int size() const { return static_cast<int>(pids_.size()); }
  // Adds one more command child; returns its rank.
  int Spawn(const std::vector<std::string>& argv);
  pid_t pid(int rank) const { return pids_[rank]; }
  void Signal(int rank, int sig);

  // Next line reported by `rank`, waiting up to `timeout`.
  std::optional<std::string> ReadLine(int rank, absl::Duration timeout);
  // Next line from `rank` whose "event" field is `event`; skips others.
  std::optional<std::map<std::string, std::string>> WaitEvent(
      int rank, const std::string& event, absl::Duration timeout);

  // "still running", "exited with code N" or "killed by signal N (name)":
  // for messages when an expected report never comes. Waits up to 1 s for a
  // child that is exiting.
  std::string Describe(int rank);

  struct Exit {
    bool exited = false;     // exited normally
    int code = -1;           // exit code if exited
    int signal = 0;          // terminating signal otherwise
    bool timed_out = false;  // still running at the limit (then SIGKILLed)
  };
  // Reaps every child, waiting up to `timeout` in all.
  std::vector<Exit> WaitAll(absl::Duration timeout);

 private:
  // Opens the report pipe (with `pipe_flags`) and forks. In the parent:
  // records the child and returns its pid. In the child: returns 0 with
  // both pipe ends open and nothing else done.
  pid_t ForkChild(int fds[2], int pipe_flags);
  // A waitpid status as an Exit (timed_out left false).
  static Exit Decode(int status);

  std::vector<pid_t> pids_;
  std::vector<int> fds_;
  std::vector<std::string> buffered_;
  std::vector<bool> reaped_;
  std::vector<Exit> exits_;  // valid where reaped_
};

}  // namespace holdfast::proc

#endif  // HOLDFAST_TEST_SUPPORT_PROCESS_GROUP_H_
