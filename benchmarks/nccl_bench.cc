// GPU benchmark of the NCCL backend (one process, one GPU):
//   - device-to-host snapshot bandwidth: DeviceSnapshot (pinned host
//     memory, asynchronous copy on a side stream) against a plain
//     cudaMemcpy into pinned memory of the same bytes, the practical PCIe
//     limit on this machine, measured in the same run;
//   - per-op overhead: holdfast AllReduce on a one-rank NCCL communicator
//     (deadline, watchdog, trace, event polling) against raw ncclAllReduce
//     plus cudaStreamSynchronize on a one-rank raw communicator.
// Medians of --samples runs. Without a CUDA device it says so and exits 0
// (with --json: {"skipped": "..."}).
//
//   nccl_bench [--sizes-mb 64,256,1024] [--op-bytes 4096,1048576]
//              [--samples 20] [--json]
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "holdfast/communicator.h"
#include "holdfast/nccl.h"
#include "holdfast/store.h"

using nlohmann::json;

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <typename F>
double TimeSeconds(F&& f) {
  const absl::Time t0 = absl::Now();
  f();
  return absl::ToDoubleSeconds(absl::Now() - t0);
}

bool Ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "nccl_bench: %s: %s\n", what, cudaGetErrorString(e));
  }
  return e == cudaSuccess;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"holdfast NCCL backend benchmark (one GPU)"};
  std::vector<int64_t> sizes_mb = {64, 256, 1024};
  std::vector<int64_t> op_bytes = {4096, 1 << 20};
  int samples = 20;
  bool as_json = false;
  app.add_option("--sizes-mb", sizes_mb, "snapshot sizes, MiB")->delimiter(',');
  app.add_option("--op-bytes", op_bytes, "all-reduce sizes, bytes")
      ->delimiter(',');
  app.add_option("--samples", samples, "runs per measurement (median)")
      ->check(CLI::Range(1, 100000));
  app.add_flag("--json", as_json, "print JSON");
  CLI11_PARSE(app, argc, argv);

  json out;
  if (holdfast::nccl::DeviceCount() == 0) {
    const char* why = "no CUDA device: nothing measured";
    if (as_json) {
      out["skipped"] = why;
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      std::printf("nccl_bench: %s\n", why);
    }
    return 0;
  }
  cudaSetDevice(0);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  out["device"] = prop.name;

  // ---- device-to-host snapshots --------------------------------------------
  out["snapshot"] = json::array();
  if (!as_json) {
    std::printf("%-10s %14s %14s %8s\n", "MiB", "snapshot GB/s", "memcpy GB/s",
                "ratio");
  }
  for (int64_t mb : sizes_mb) {
    const size_t bytes = static_cast<size_t>(mb) << 20;
    void* dev = nullptr;
    void* pinned = nullptr;
    if (!Ok(cudaMalloc(&dev, bytes), "cudaMalloc") ||
        !Ok(cudaMemset(dev, 7, bytes), "cudaMemset") ||
        !Ok(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault),
            "cudaHostAlloc")) {
      return 1;
    }
    auto snap = holdfast::nccl::DeviceSnapshot::Create(bytes, 0);
    if (!snap.ok()) {
      std::fprintf(stderr, "nccl_bench: %s\n",
                   snap.status().ToString().c_str());
      return 1;
    }
    std::vector<double> raw, ours;
    for (int i = 0; i < samples; ++i) {
      raw.push_back(TimeSeconds(
          [&] { cudaMemcpy(pinned, dev, bytes, cudaMemcpyDeviceToHost); }));
      ours.push_back(TimeSeconds([&] {
        (void)(*snap)->Start(dev, bytes, nullptr);
        (void)(*snap)->Wait(absl::Seconds(60));
      }));
    }
    const double raw_gbs = static_cast<double>(bytes) / Median(raw) / 1e9;
    const double our_gbs = static_cast<double>(bytes) / Median(ours) / 1e9;
    out["snapshot"].push_back({{"mib", mb},
                               {"snapshot_gbs", our_gbs},
                               {"memcpy_gbs", raw_gbs},
                               {"ratio", our_gbs / raw_gbs}});
    if (!as_json) {
      std::printf("%-10lld %14.2f %14.2f %8.3f\n", static_cast<long long>(mb),
                  our_gbs, raw_gbs, our_gbs / raw_gbs);
    }
    cudaFreeHost(pinned);
    cudaFree(dev);
  }

  // ---- per-op overhead ----------------------------------------------------
  holdfast::CommunicatorOptions o;
  o.rank = 0;
  o.size = 1;
  o.backend = "nccl";
  o.device = 0;
  o.trace_dir = "";
  auto comm = holdfast::Communicator::Create(holdfast::NewMemoryStore(), o);
  if (!comm.ok()) {
    std::fprintf(stderr, "nccl_bench: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  ncclComm_t raw_comm = nullptr;
  int devs[1] = {0};
  if (ncclCommInitAll(&raw_comm, 1, devs) != ncclSuccess) {
    std::fprintf(stderr, "nccl_bench: ncclCommInitAll failed\n");
    return 1;
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  out["allreduce"] = json::array();
  if (!as_json) {
    std::printf("\n%-10s %14s %14s %8s\n", "bytes", "holdfast us", "raw us",
                "ratio");
  }
  for (int64_t b : op_bytes) {
    const size_t n = static_cast<size_t>(b) / sizeof(float);
    void* buf = nullptr;
    if (!Ok(cudaMalloc(&buf, n * sizeof(float) + 4), "cudaMalloc")) return 1;
    std::vector<double> raw, ours;
    for (int i = 0; i < samples + 5; ++i) {  // 5 warm-up rounds
      const double r = TimeSeconds([&] {
        ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, raw_comm, stream);
        cudaStreamSynchronize(stream);
      });
      const double h = TimeSeconds([&] {
        (void)(*comm)
            ->AllReduce(buf, n, holdfast::DataType::kFloat32,
                        holdfast::ReduceOp::kSum)
            ->Wait();
      });
      if (i >= 5) {
        raw.push_back(r);
        ours.push_back(h);
      }
    }
    const double raw_us = Median(raw) * 1e6, our_us = Median(ours) * 1e6;
    out["allreduce"].push_back({{"bytes", b},
                                {"holdfast_us", our_us},
                                {"raw_us", raw_us},
                                {"ratio", our_us / raw_us}});
    if (!as_json) {
      std::printf("%-10lld %14.1f %14.1f %8.2f\n", static_cast<long long>(b),
                  our_us, raw_us, our_us / raw_us);
    }
    cudaFree(buf);
  }
  ncclCommDestroy(raw_comm);
  cudaStreamDestroy(stream);
  if (as_json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
