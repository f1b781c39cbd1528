// The NCCL backend's entry points for the layer above it (src/nccl/, the
// public holdfast::nccl API): include/holdfast/nccl.h has the contract.
#ifndef HOLDFAST_SRC_BACKEND_NCCL_NCCL_BACKEND_H_
#define HOLDFAST_SRC_BACKEND_NCCL_NCCL_BACKEND_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "holdfast/store.h"
#include "src/backend/backend.h"

namespace holdfast::backend {

// A backend of options.size ranks on CUDA device options.device, its
// NCCL unique id passed through `store` under options.generation.
absl::StatusOr<std::unique_ptr<Backend>> CreateNcclBackend(
    std::shared_ptr<Store> store, const BackendOptions& options);

// Whether `b` is an NCCL backend.
bool IsNccl(Backend* b);

// The cudaStream_t (as void*) an NCCL backend's operations run on; null
// for another backend.
void* NcclStream(Backend* b);

// The survivors' backend after the loss of the ranks in `exclude` (ranks
// of `old`): ncclCommShrink while `old` is usable, else a fresh init
// through `store`. InvalidArgument if `old` is not an NCCL backend.
absl::StatusOr<std::unique_ptr<Backend>> ShrinkNccl(
    Backend* old, const std::vector<int>& exclude, Store& store,
    const BackendOptions& options);

// CUDA devices this process can use (0 without a GPU or driver).
int NcclDeviceCount();

// ncclGetVersion of the loaded library (-1 on failure); NCCL_VERSION_CODE.
int NcclLoadedVersion();
int NcclBuiltVersion();

// Makes backend "nccl" available to Communicator::Create; idempotent.
void RegisterNccl();

}  // namespace holdfast::backend

#endif  // HOLDFAST_SRC_BACKEND_NCCL_NCCL_BACKEND_H_
