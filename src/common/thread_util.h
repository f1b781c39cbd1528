// Starting threads where the system may refuse one.
#ifndef HOLDFAST_SRC_COMMON_THREAD_UTIL_H_
#define HOLDFAST_SRC_COMMON_THREAD_UTIL_H_

#include <functional>
#include <system_error>
#include <thread>

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

}  // namespace holdfast

#endif  // HOLDFAST_SRC_COMMON_THREAD_UTIL_H_
