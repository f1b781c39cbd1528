// Helpers shared by holdfast_nccl's files: CUDA error text, and waiting on
// CUDA and NCCL without blocking inside them (polling with back-off).
#ifndef HOLDFAST_SRC_BACKEND_NCCL_UTIL_H_
#define HOLDFAST_SRC_BACKEND_NCCL_UTIL_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace holdfast::backend {

inline std::string CudaError(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

// Calls `probe` (returning std::optional<absl::Status>: nullopt while not
// done) with naps doubling from `first` up to `most`, until it returns a
// status or `deadline` passes: DeadlineExceeded with message `late`.
template <typename Probe>
absl::Status PollUntil(absl::Time deadline, absl::Duration first,
                       absl::Duration most, const std::string& late,
                       Probe&& probe) {
  absl::Duration nap = first;
  for (;;) {
    if (std::optional<absl::Status> done = probe()) return *std::move(done);
    if (absl::Now() >= deadline) return absl::DeadlineExceededError(late);
    absl::SleepFor(nap);
    nap = std::min(nap * 2, most);
  }
}

}  // namespace holdfast::backend

#endif  // HOLDFAST_SRC_BACKEND_NCCL_UTIL_H_
