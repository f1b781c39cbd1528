// Backend selection: Gloo is always built in; NCCL's factory is installed by
// the holdfast_nccl library when a program links it.
#include "src/backend/backend.h"

#include <atomic>

namespace holdfast::backend {
namespace {

std::atomic<BackendFactory>& Nccl() {
  static std::atomic<BackendFactory> factory{nullptr};
  return factory;
}

}  // namespace

void SetNcclFactory(BackendFactory factory) { Nccl().store(factory); }

BackendFactory NcclFactory() { return Nccl().load(); }

}  // namespace holdfast::backend
