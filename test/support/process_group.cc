#include "test/support/process_group.h"

#include "absl/time/clock.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace holdfast::proc {
namespace {
int g_report_fd = -1;
}  // namespace

std::string MakeTempDir() {
  const char* base = getenv("TMPDIR");
  std::string tmpl =
      std::string(base ? base : "/tmp") + "/holdfast-test-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    perror("mkdtemp");
    abort();
  }
  return tmpl;
}

int64_t MonoNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void Report(const std::string& line) {
  std::string l = line + "\n";
  size_t done = 0;
  while (done < l.size()) {
    ssize_t n = write(g_report_fd, l.data() + done, l.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::map<std::string, std::string> ParseReport(const std::string& line) {
  std::map<std::string, std::string> out;
  size_t pos = 0;
  while (pos < line.size()) {
    size_t eq = line.find('=', pos);
    if (eq == std::string::npos) break;
    std::string key = line.substr(pos, eq - pos);
    if (key == "msg") {
      out[key] = line.substr(eq + 1);
      break;
    }
    size_t sp = line.find(' ', eq);
    if (sp == std::string::npos) sp = line.size();
    out[key] = line.substr(eq + 1, sp - eq - 1);
    pos = sp + 1;
  }
  return out;
}

ProcessGroup::ProcessGroup(int n, std::function<int(int rank)> body) {
  for (int i = 0; i < n; ++i) {
    int fds[2];
    if (ForkChild(fds, 0) == 0) {
      close(fds[0]);
      for (int fd : fds_) close(fd);
      g_report_fd = fds[1];
      int code = body(i);
      fflush(stdout);
      fflush(stderr);
      _exit(code);
    }
  }
}

pid_t ProcessGroup::ForkChild(int fds[2], int pipe_flags) {
  fflush(stdout);
  fflush(stderr);
  if (pipe2(fds, pipe_flags) != 0) {
    perror("pipe2");
    abort();
  }
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    abort();
  }
  if (pid == 0) return 0;
  close(fds[1]);
  pids_.push_back(pid);
  fds_.push_back(fds[0]);
  buffered_.emplace_back();
  reaped_.push_back(false);
  exits_.emplace_back();
  return pid;
}

ProcessGroup::ProcessGroup(
    const std::vector<std::vector<std::string>>& commands) {
  for (const auto& argv : commands) Spawn(argv);
}

int ProcessGroup::Spawn(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int fds[2];
  if (ForkChild(fds, O_CLOEXEC) == 0) {
    // dup2 clears close-on-exec on the copy; every other pipe closes at exec.
    if (dup2(fds[1], STDOUT_FILENO) < 0) _exit(127);
    execv(args[0], args.data());
    _exit(127);
  }
  return static_cast<int>(pids_.size()) - 1;
}

ProcessGroup::~ProcessGroup() {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (!reaped_[i]) {
      kill(pids_[i], SIGKILL);
      waitpid(pids_[i], nullptr, 0);
    }
    close(fds_[i]);
  }
}

void ProcessGroup::Signal(int rank, int sig) { kill(pids_[rank], sig); }

std::optional<std::string> ProcessGroup::ReadLine(int rank,
                                                  absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string& buf = buffered_[rank];
  for (;;) {
    size_t nl = buf.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      return line;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return std::nullopt;
    struct pollfd pfd = {fds_[rank], POLLIN, 0};
    int rv =
        poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (rv < 0 && errno == EINTR) continue;
    if (rv <= 0) continue;
    char chunk[4096];
    ssize_t n = read(fds_[rank], chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;  // EOF: the child is gone
    buf.append(chunk, static_cast<size_t>(n));
  }
}

std::optional<std::map<std::string, std::string>> ProcessGroup::WaitEvent(
    int rank, const std::string& event, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    std::optional<std::string> line = ReadLine(rank, deadline - absl::Now());
    if (!line) return std::nullopt;
    auto fields = ParseReport(*line);
    if (fields["event"] == event) return fields;
  }
}

std::string ProcessGroup::Describe(int rank) {
  int status = 0;
  // A child that closed its pipe may still be exiting: give it a moment.
  for (int i = 0; i < 100 && !reaped_[rank]; ++i) {
    if (waitpid(pids_[rank], &status, WNOHANG) == pids_[rank]) {
      reaped_[rank] = true;
      exits_[rank] = Decode(status);
      break;
    }
    usleep(10000);
  }
  if (!reaped_[rank]) return "still running";
  const Exit& e = exits_[rank];
  if (e.exited) return "exited with code " + std::to_string(e.code);
  if (e.signal != 0) {
    return "killed by signal " + std::to_string(e.signal) + " (" +
           strsignal(e.signal) + ")";
  }
  return "ended";
}

ProcessGroup::Exit ProcessGroup::Decode(int status) {
  Exit e;
  if (WIFEXITED(status)) {
    e.exited = true;
    e.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    e.signal = WTERMSIG(status);
  }
  return e;
}

std::vector<ProcessGroup::Exit> ProcessGroup::WaitAll(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<Exit> exits(pids_.size());
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (reaped_[i]) {
      exits[i] = exits_[i];
      continue;
    }
    int status = 0;
    for (;;) {
      pid_t r = waitpid(pids_[i], &status, WNOHANG);
      if (r == pids_[i]) break;
      if (absl::Now() >= deadline) {
        exits[i].timed_out = true;
        kill(pids_[i], SIGKILL);
        waitpid(pids_[i], &status, 0);
        break;
      }
      usleep(2000);
    }
    reaped_[i] = true;
    const bool timed_out = exits[i].timed_out;
    exits[i] = Decode(status);
    exits[i].timed_out = timed_out;
    exits_[i] = exits[i];
  }
  return exits;
}

}  // namespace holdfast::proc
