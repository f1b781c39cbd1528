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

std::atomic<BackendWarmer>& NcclWarmer() {
  static std::atomic<BackendWarmer> warmer{nullptr};
  return warmer;
}

std::atomic<DeviceBinder>& NcclBinder() {
  static std::atomic<DeviceBinder> binder{nullptr};
  return binder;
}

}  // namespace

void SetNcclFactory(BackendFactory factory) { Nccl().store(factory); }

BackendFactory NcclFactory() { return Nccl().load(); }

void SetNcclWarmer(BackendWarmer warmer) { NcclWarmer().store(warmer); }

absl::Status Warm(absl::string_view name, int device) {
  BackendWarmer warmer = NcclWarmer().load();
  if (name != "nccl" || warmer == nullptr) return absl::OkStatus();
  return warmer(device);
}

void SetNcclBinder(DeviceBinder binder) { NcclBinder().store(binder); }

absl::Status BindDevice(absl::string_view name, int device) {
  DeviceBinder binder = NcclBinder().load();
  if (name != "nccl" || binder == nullptr) return absl::OkStatus();
  return binder(device);
}

bool TakesHostMemory(absl::string_view name) { return name != "nccl"; }

absl::Status CheckLinked(absl::string_view name) {
  if (name == "nccl" && NcclFactory() == nullptr) {
    return absl::FailedPreconditionError(
        "backend 'nccl' is not in this program: link holdfast_nccl (built "
        "when CMake finds CUDA and NCCL)");
  }
  return absl::OkStatus();
}

}  // namespace holdfast::backend
