// Starting threads where the system may refuse one, and running work on
// several.
#ifndef HOLDFAST_SRC_COMMON_THREAD_UTIL_H_
#define HOLDFAST_SRC_COMMON_THREAD_UTIL_H_

#include <cstddef>
#include <functional>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace holdfast {

// Starts `fn` on a new thread. When the system refuses one (a process or
// container pids limit), ResourceExhausted "cannot start <what>: <why>":
// the caller then does the work another way, or fails by name, instead of
// the process ending on an uncaught std::system_error.
inline absl::StatusOr<std::thread> StartThread(absl::string_view what,
                                               std::function<void()> fn) {
  try {
    return std::thread(std::move(fn));
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start ", what, ": ", e.what()));
  }
}

// Calls `fn(i)` for every i < count, on up to `most` threads (no more
// than the machine's cores; the calling thread is one of them), each
// taking the next i as it finishes one. Where a thread cannot start (a
// pids limit), the others do its part.
void ForEachOnThreads(size_t count, size_t most,
                      const std::function<void(size_t)>& fn);

// Runs `jobs` at once, a thread each (the calling thread takes the last);
// the first error in their order. If a thread cannot start (a pids
// limit), `end_started` is given the reason (it must end the jobs that did
// start: they may wait for a peer's part of the work), and the result is
// ResourceExhausted.
// `what` names the threads in that error ("a thread for <what>").
absl::Status RunJobs(absl::string_view what,
                     const std::vector<std::function<absl::Status()>>& jobs,
                     const std::function<void(absl::string_view)>& end_started);

}  // namespace holdfast

#endif  // HOLDFAST_SRC_COMMON_THREAD_UTIL_H_
