// DeviceSnapshot: pinned host memory and a side stream; see
// include/holdfast/nccl.h.
#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "holdfast/nccl.h"
#include "src/backend/nccl/util.h"

namespace holdfast::nccl {
namespace {

using backend::CudaError;
using backend::PollUntil;

// Polls `event` until it completed: OK; DeadlineExceeded after `timeout`
// ("WHAT: LATE within ..."); Internal naming a CUDA error.
absl::Status PollEvent(cudaEvent_t event, absl::Duration timeout,
                       absl::string_view what, absl::string_view late) {
  return PollUntil(
      absl::Now() + timeout, absl::Microseconds(5), absl::Microseconds(500),
      absl::StrCat(what, ": ", late, " within ", absl::FormatDuration(timeout)),
      [&]() -> std::optional<absl::Status> {
        const cudaError_t e = cudaEventQuery(event);
        if (e == cudaSuccess) return absl::OkStatus();
        if (e != cudaErrorNotReady) {
          return absl::InternalError(absl::StrCat(what, ": ", CudaError(e)));
        }
        return std::nullopt;
      });
}

class DeviceSnapshotImpl final : public DeviceSnapshot {
 public:
  DeviceSnapshotImpl(int device, size_t capacity)
      : device_(device), capacity_(capacity) {}

  ~DeviceSnapshotImpl() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (host_ != nullptr) cudaFreeHost(host_);
    if (after_ != nullptr) cudaEventDestroy(after_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    cudaError_t e = cudaSetDevice(device_);
    if (e == cudaSuccess) {
      e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    }
    if (e == cudaSuccess) {
      e = cudaEventCreateWithFlags(&after_, cudaEventDisableTiming);
    }
    if (e == cudaSuccess) {
      e = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
      return absl::FailedPreconditionError(
          absl::StrCat("DeviceSnapshot: device ", device_, ": ", CudaError(e)));
    }
    e = cudaHostAlloc(&host_, capacity_, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      host_ = nullptr;
      return absl::ResourceExhaustedError(
          absl::StrCat("DeviceSnapshot: cannot pin ", capacity_,
                       " bytes of host memory: ", CudaError(e)));
    }
    return absl::OkStatus();
  }

  absl::Status Start(const void* src, size_t bytes,
                     void* after_stream) override {
    if (bytes > capacity_) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeviceSnapshot::Start: ", bytes,
                       " bytes do not fit the ", capacity_, "-byte buffer"));
    }
    cudaSetDevice(device_);
    // Follow the work queued so far on the training stream, not later work.
    cudaError_t e =
        cudaEventRecord(after_, static_cast<cudaStream_t>(after_stream));
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_, after_, 0);
    if (e == cudaSuccess) {
      e = cudaMemcpyAsync(host_, src, bytes, cudaMemcpyDeviceToHost, stream_);
    }
    if (e == cudaSuccess) e = cudaEventRecord(done_, stream_);
    if (e != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("DeviceSnapshot::Start: ", CudaError(e)));
    }
    started_ = true;
    return absl::OkStatus();
  }

  absl::Status Wait(absl::Duration timeout) override {
    if (!started_) return absl::OkStatus();
    cudaSetDevice(device_);
    return PollEvent(done_, timeout, "DeviceSnapshot::Wait",
                     "the copy did not finish");
  }

  absl::Status CopyToDevice(void* dst, size_t bytes) override {
    if (bytes > capacity_) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeviceSnapshot::CopyToDevice: ", bytes,
                       " bytes exceed the ", capacity_, "-byte buffer"));
    }
    cudaSetDevice(device_);
    cudaError_t e =
        cudaMemcpyAsync(dst, host_, bytes, cudaMemcpyHostToDevice, stream_);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("DeviceSnapshot::CopyToDevice: ", CudaError(e)));
    }
    return absl::OkStatus();
  }

  void* host() override { return host_; }
  size_t capacity() const override { return capacity_; }

 private:
  const int device_;
  const size_t capacity_;
  void* host_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t after_ = nullptr;
  cudaEvent_t done_ = nullptr;
  bool started_ = false;
};

}  // namespace

absl::Status AwaitEvent(void* event, absl::Duration timeout) {
  return PollEvent(static_cast<cudaEvent_t>(event), timeout, "AwaitEvent",
                   "the device did not reach the event");
}

absl::StatusOr<std::unique_ptr<DeviceSnapshot>> DeviceSnapshot::Create(
    size_t bytes, int device) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "DeviceSnapshot: no CUDA device is usable here (",
        e == cudaSuccess ? std::string("0 devices") : CudaError(e), ")"));
  }
  if (device < 0 || device >= n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceSnapshot: device ", device, " does not exist (", n, " seen)"));
  }
  if (bytes == 0) {
    return absl::InvalidArgumentError("DeviceSnapshot: zero bytes");
  }
  auto snap = std::make_unique<DeviceSnapshotImpl>(device, bytes);
  absl::Status s = snap->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<DeviceSnapshot>(std::move(snap));
}

}  // namespace holdfast::nccl
