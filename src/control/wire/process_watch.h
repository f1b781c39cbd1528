// ProcessWatch: tells, within a few milliseconds, that a member's process
// on this machine has begun to exit.
//
// A killed process closes its sockets only once the kernel has torn its
// address space down, which takes about 60 ms per GiB of touched memory
// (measured: 3 ms at 10 MiB, 63 ms at 1 GiB, 261 ms at 4 GiB), so a
// member's heartbeat stream ends that late after a SIGKILL. The kernel
// marks the process as exiting (PF_EXITING in /proc/PID/stat) within a
// quarter of a millisecond. The controller and the host agents watch the
// members that run on their own machine this way and declare them crashed
// when they begin to exit; the stream's end stays the rule elsewhere.
//
// A process is identified by its pid, its start time (clock ticks after
// boot, /proc/PID/stat field 22) and its host key (the kernel's boot id
// and its pid namespace, src/common/host_key.h): a member whose identity
// the watch does not see as its own (another machine, another pid
// namespace, where its pid names another process, a reused pid) is not
// watched.
//
// Threading: thread-safe; the callback runs on the watch's own thread.
#ifndef HOLDFAST_SRC_CONTROL_WIRE_PROCESS_WATCH_H_
#define HOLDFAST_SRC_CONTROL_WIRE_PROCESS_WATCH_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace holdfast::control {

struct ProcessIdentity {
  int64_t pid = 0;
  uint64_t start = 0;     // /proc/PID/stat field 22
  uint64_t host_key = 0;  // HostKey()
};

// This process's identity (start and host_key 0 where /proc does not
// tell).
ProcessIdentity SelfIdentity();

// What /proc/PID/stat says of `pid`: nullopt if it does not exist or
// cannot be read.
struct ProcStat {
  char state = '?';
  uint64_t flags = 0;
  uint64_t start = 0;
};
std::optional<ProcStat> ReadProcStat(int64_t pid);

class ProcessWatch {
 public:
  // `on_exit(id, why)`: once per watched id, when its process is exiting,
  // has exited, or its pid now names another process.
  using OnExit = std::function<void(uint64_t id, const std::string& why)>;

  // Polls every `interval` (zero or negative: never starts; Watch then
  // returns false).
  ProcessWatch(absl::Duration interval, OnExit on_exit);
  ~ProcessWatch();  // joins the thread

  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  // Watches `who` under `id` (replacing what `id` watched) if it runs on
  // this machine, as this machine sees it; false otherwise.
  bool Watch(uint64_t id, const ProcessIdentity& who);
  void Unwatch(uint64_t id);
  // Ids watched now.
  size_t size() const;

 private:
  void Loop();
  // Why the process no longer runs as it did, or nullopt.
  static std::optional<std::string> Ended(int64_t pid, uint64_t start);
  void UnwatchLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A process: (pid, start). Several ids may watch one (in-process members
  // of a test): it is read once per poll.
  using Key = std::pair<int64_t, uint64_t>;

  const absl::Duration interval_;
  const OnExit on_exit_;
  const uint64_t host_key_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<Key, std::set<uint64_t>> processes_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Key> ids_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_WIRE_PROCESS_WATCH_H_
