#include "src/control/wire/process_watch.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "src/common/host_key.h"
#include "src/common/logging.h"
#include "src/common/thread_util.h"

namespace holdfast::control {
namespace {

// PF_EXITING (include/linux/sched.h): set by do_exit() as it begins.
constexpr uint64_t kExiting = 0x4;

}  // namespace

std::optional<ProcStat> ReadProcStat(int64_t pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses;
  // the fields from STATE (field 3) on follow its last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  const std::vector<absl::string_view> f = absl::StrSplit(
      absl::string_view(text).substr(close + 1), ' ', absl::SkipEmpty());
  ProcStat out;
  // Field n is f[n - 3].
  if (f.size() < 20 || f[0].size() != 1 ||
      !absl::SimpleAtoi(f[6], &out.flags) ||
      !absl::SimpleAtoi(f[19], &out.start)) {
    return std::nullopt;
  }
  out.state = f[0][0];
  return out;
}

ProcessIdentity SelfIdentity() {
  ProcessIdentity me;
  me.pid = getpid();
  if (std::optional<ProcStat> s = ReadProcStat(me.pid)) {
    me.start = s->start;
    me.host_key = HostKey();
  }
  return me;
}

ProcessWatch::ProcessWatch(absl::Duration interval, OnExit on_exit)
    : interval_(interval), on_exit_(std::move(on_exit)), host_key_(HostKey()) {
  if (interval_ <= absl::ZeroDuration() || host_key_ == 0) return;
  absl::StatusOr<std::thread> t =
      StartThread("the process watch", [this] { Loop(); });
  if (t.ok()) {
    thread_ = std::move(*t);
  } else {
    HOLDFAST_LOG_WARN("process watch: {}; exits are seen when streams end",
                      std::string(t.status().message()));
  }
}

ProcessWatch::~ProcessWatch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool ProcessWatch::Watch(uint64_t id, const ProcessIdentity& who) {
  if (!thread_.joinable() || who.host_key != host_key_ || who.start == 0) {
    return false;
  }
  std::optional<ProcStat> s = ReadProcStat(who.pid);
  if (!s.has_value() || s->start != who.start) return false;
  absl::MutexLock lock(&mu_);
  UnwatchLocked(id);
  const Key key{who.pid, who.start};
  processes_[key].insert(id);
  ids_[id] = key;
  return true;
}

void ProcessWatch::Unwatch(uint64_t id) {
  absl::MutexLock lock(&mu_);
  UnwatchLocked(id);
}

void ProcessWatch::UnwatchLocked(uint64_t id) {
  auto it = ids_.find(id);
  if (it == ids_.end()) return;
  auto p = processes_.find(it->second);
  if (p != processes_.end()) {
    p->second.erase(id);
    if (p->second.empty()) processes_.erase(p);
  }
  ids_.erase(it);
}

size_t ProcessWatch::size() const {
  absl::MutexLock lock(&mu_);
  return ids_.size();
}

std::optional<std::string> ProcessWatch::Ended(int64_t pid, uint64_t start) {
  std::optional<ProcStat> s = ReadProcStat(pid);
  if (!s.has_value()) return absl::StrCat("process ", pid, " is gone");
  if (s->start != start) {
    return absl::StrCat("process ", pid, " ended (its pid is reused)");
  }
  if (s->state == 'Z' || s->state == 'X') {
    return absl::StrCat("process ", pid, " has exited");
  }
  if ((s->flags & kExiting) != 0) {
    return absl::StrCat("process ", pid, " is exiting");
  }
  return std::nullopt;
}

void ProcessWatch::Loop() {
  for (;;) {
    std::vector<Key> now;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), interval_)) return;
      now.reserve(processes_.size());
      for (const auto& [key, ids] : processes_) now.push_back(key);
    }
    for (const Key& key : now) {
      std::optional<std::string> why = Ended(key.first, key.second);
      if (!why.has_value()) continue;
      std::set<uint64_t> ids;
      {
        absl::MutexLock lock(&mu_);
        auto it = processes_.find(key);
        if (it == processes_.end()) continue;  // unwatched meanwhile
        ids = std::move(it->second);
        processes_.erase(it);
        for (uint64_t id : ids) ids_.erase(id);
      }
      for (uint64_t id : ids) on_exit_(id, *why);
    }
  }
}

}  // namespace holdfast::control
