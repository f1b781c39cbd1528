// The NCCL backend. Without a GPU (CI): the backend is built, and asking
// for it fails at once with an error naming the missing device. With one:
// init, every op, abort, a group whose second rank never arrives (timeout,
// abort, then a clean one-rank group), device snapshots, and with two
// GPUs ncclCommShrink after a lost rank. [gpu-sticky] breaks the
// process's CUDA context on purpose, so it runs in a process of its own.
//
// Tags: [gpu] and [gpu-sticky] need one CUDA device, [gpu2] two. Run with
// a tag filter that names them and no such device, the program exits 77,
// which CTest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "holdfast/communicator.h"
#include "holdfast/nccl.h"
#include "holdfast/store.h"

namespace {

holdfast::CommunicatorOptions Options(int rank, int size, int64_t gen,
                                      int device) {
  holdfast::CommunicatorOptions o;
  o.rank = rank;
  o.size = size;
  o.generation = gen;
  o.backend = "nccl";
  o.device = device;
  o.timeout = absl::Seconds(30);
  o.connect_timeout = absl::Seconds(30);
  o.trace_dir = "";
  return o;
}

bool Mentions(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

// A device buffer of floats.
struct DeviceFloats {
  explicit DeviceFloats(size_t n) : n(n) {
    REQUIRE(cudaMalloc(&ptr, n * sizeof(float)) == cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(ptr); }
  void Set(const std::vector<float>& v) {
    REQUIRE(cudaMemcpy(ptr, v.data(), v.size() * 4, cudaMemcpyHostToDevice) ==
            cudaSuccess);
  }
  std::vector<float> Get() const {
    std::vector<float> v(n);
    REQUIRE(cudaMemcpy(v.data(), ptr, n * 4, cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    return v;
  }
  void* ptr = nullptr;
  size_t n;
};

// Runs a kernel that stores to address 16, so the device faults with
// cudaErrorIllegalAddress, a sticky error. The kernel is PTX loaded
// through the driver API, opened with dlopen so that this program needs
// no libcuda where there is no GPU.
bool LaunchBadStore() {
  static const char kPtx[] =
      ".version 7.8\n.target sm_75\n.address_size 64\n"
      ".visible .entry holdfast_bad_store()\n{\n"
      "  .reg .b32 %r<2>;\n  .reg .b64 %rd<2>;\n"
      "  mov.u64 %rd1, 16;\n  mov.u32 %r1, 1;\n"
      "  st.global.u32 [%rd1], %r1;\n  ret;\n}\n";
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (lib == nullptr) return false;
  using Load = CUresult (*)(CUmodule*, const void*);
  using Get = CUresult (*)(CUfunction*, CUmodule, const char*);
  using Launch =
      CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                   unsigned, unsigned, CUstream, void**, void**);
  auto load = reinterpret_cast<Load>(dlsym(lib, "cuModuleLoadData"));
  auto get = reinterpret_cast<Get>(dlsym(lib, "cuModuleGetFunction"));
  auto launch = reinterpret_cast<Launch>(dlsym(lib, "cuLaunchKernel"));
  CUmodule module;
  CUfunction f;
  return load != nullptr && get != nullptr && launch != nullptr &&
         cudaSetDevice(0) == cudaSuccess && cudaFree(nullptr) == cudaSuccess &&
         load(&module, kPtx) == CUDA_SUCCESS &&
         get(&f, module, "holdfast_bad_store") == CUDA_SUCCESS &&
         launch(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) ==
             CUDA_SUCCESS;
}

}  // namespace

TEST_CASE("nccl: the backend is linked and refuses a machine without a GPU") {
  auto store = holdfast::NewMemoryStore();
  auto c = holdfast::Communicator::Create(store, Options(0, 1, 0, 0));
  if (holdfast::nccl::DeviceCount() == 0) {
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Mentions(c.status(), "no CUDA device"));
  } else {
    REQUIRE(c.ok());
    CHECK((*c)->backend_name() == "nccl");
  }
  auto bad = holdfast::Communicator::Create(
      store, Options(0, 1, 0, holdfast::nccl::DeviceCount() + 3));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() != absl::StatusCode::kOk);
  holdfast::CommunicatorOptions other = Options(0, 1, 0, 0);
  other.backend = "mpi";
  auto unknown = holdfast::Communicator::Create(store, other);
  CHECK(unknown.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Mentions(unknown.status(), "unknown backend 'mpi'"));
}

TEST_CASE("nccl: one GPU runs every op and aborts fast", "[gpu]") {
  auto c = holdfast::Communicator::Create(holdfast::NewMemoryStore(),
                                          Options(0, 1, 0, 0));
  REQUIRE(c.ok());
  holdfast::Communicator& comm = **c;
  CHECK(holdfast::nccl::Stream(comm) != nullptr);
  const size_t n = 1 << 16;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 977);
  DeviceFloats a(n), b(n);
  a.Set(host);
  using holdfast::DataType;
  using holdfast::ReduceOp;
  REQUIRE(comm.AllReduce(a.ptr, n, DataType::kFloat32, ReduceOp::kSum)
              ->Wait()
              .ok());
  CHECK(a.Get() == host);
  REQUIRE(comm.Broadcast(a.ptr, n, DataType::kFloat32, 0)->Wait().ok());
  REQUIRE(comm.AllGather(a.ptr, b.ptr, n, DataType::kFloat32)->Wait().ok());
  CHECK(b.Get() == host);
  REQUIRE(
      comm.ReduceScatter(a.ptr, b.ptr, n, DataType::kFloat32, ReduceOp::kMax)
          ->Wait()
          .ok());
  CHECK(b.Get() == host);
  REQUIRE(comm.AllToAll(a.ptr, b.ptr, n, DataType::kFloat32)->Wait().ok());
  CHECK(b.Get() == host);
  REQUIRE(comm.Barrier()->Wait().ok());

  comm.Abort("test abort");
  const absl::Time t0 = absl::Now();
  absl::Status s =
      comm.AllReduce(a.ptr, n, DataType::kFloat32, ReduceOp::kSum)->Wait();
  CHECK(s.code() == absl::StatusCode::kAborted);
  CHECK(Mentions(s, "test abort"));
  CHECK(absl::Now() - t0 < absl::Seconds(5));
  CHECK_FALSE(comm.health().ok());
}

TEST_CASE(
    "nccl: a second rank that never arrives times out and a one-rank group "
    "follows",
    "[gpu]") {
  auto store = holdfast::NewMemoryStore();
  holdfast::CommunicatorOptions o = Options(0, 2, 0, 0);
  o.connect_timeout = absl::Seconds(3);
  auto c = holdfast::Communicator::Create(store, o);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(Mentions(c.status(), "did not assemble"));
  // The survivor goes on alone in the next generation.
  auto one = holdfast::Communicator::Create(store, Options(0, 1, 1, 0));
  REQUIRE(one.ok());
  DeviceFloats a(8);
  a.Set(std::vector<float>(8, 2.5f));
  REQUIRE((*one)
              ->AllReduce(a.ptr, 8, holdfast::DataType::kFloat32,
                          holdfast::ReduceOp::kSum)
              ->Wait()
              .ok());
  CHECK(a.Get() == std::vector<float>(8, 2.5f));
}

TEST_CASE("nccl: device snapshots copy device memory to pinned host memory",
          "[gpu]") {
  const size_t n = 8 << 20;
  DeviceFloats a(n);
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i);
  a.Set(host);
  auto snap = holdfast::nccl::DeviceSnapshot::Create(n * 4, 0);
  REQUIRE(snap.ok());
  REQUIRE((*snap)->Start(a.ptr, n * 4, nullptr).ok());
  REQUIRE((*snap)->Wait(absl::Seconds(30)).ok());
  CHECK(std::memcmp((*snap)->host(), host.data(), n * 4) == 0);
  REQUIRE(cudaMemset(a.ptr, 0, n * 4) == cudaSuccess);
  REQUIRE((*snap)->CopyToDevice(a.ptr, n * 4).ok());
  CHECK(a.Get() == host);
  CHECK((*snap)->Start(a.ptr, n * 4 + 1, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("nccl: survivors shrink with ncclCommShrink after a lost rank",
          "[gpu2]") {
  auto store = holdfast::NewMemoryStore();
  std::unique_ptr<holdfast::Communicator> comms[2];
  std::thread t([&] {
    auto c = holdfast::Communicator::Create(store, Options(1, 2, 0, 1));
    if (c.ok()) comms[1] = std::move(*c);
  });
  auto c0 = holdfast::Communicator::Create(store, Options(0, 2, 0, 0));
  t.join();
  REQUIRE(c0.ok());
  REQUIRE(comms[1] != nullptr);
  comms[0] = std::move(*c0);
  comms[1]->Abort("rank 1 lost");  // rank 1 is gone
  auto shrunk =
      holdfast::nccl::Shrink(*comms[0], {1}, store, Options(0, 1, 1, 0));
  REQUIRE(shrunk.ok());
  CHECK((*shrunk)->size() == 1);
  CHECK((*shrunk)->rank() == 0);
  DeviceFloats a(4);
  a.Set({1, 2, 3, 4});
  REQUIRE((*shrunk)
              ->AllReduce(a.ptr, 4, holdfast::DataType::kFloat32,
                          holdfast::ReduceOp::kSum)
              ->Wait()
              .ok());
  CHECK(a.Get() == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE(
    "nccl: after a sticky CUDA error the process builds no communicator "
    "again and says why",
    "[gpu-sticky]") {
  auto store = holdfast::NewMemoryStore();
  auto c = holdfast::Communicator::Create(store, Options(0, 1, 0, 0));
  REQUIRE(c.ok());
  REQUIRE(LaunchBadStore());
  CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
  // Without the check, NCCL's init fails with "unhandled cuda error" at
  // every generation, and a job cycles through generations for ever.
  auto again = holdfast::Communicator::Create(store, Options(0, 1, 1, 0));
  REQUIRE_FALSE(again.ok());
  CHECK(again.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Mentions(again.status(), "sticky CUDA error"));
  CHECK(Mentions(again.status(), "cudaErrorIllegalAddress"));
}

int main(int argc, char** argv) {
  std::string filter;
  for (int i = 1; i < argc; ++i) filter += argv[i];
  const int devices = holdfast::nccl::DeviceCount();
  const bool wants_two = filter.find("[gpu2]") != std::string::npos &&
                         filter.find("~[gpu2]") == std::string::npos;
  const bool wants_one = (filter.find("[gpu]") != std::string::npos &&
                          filter.find("~[gpu]") == std::string::npos) ||
                         (filter.find("[gpu-sticky]") != std::string::npos &&
                          filter.find("~[gpu-sticky]") == std::string::npos);
  if ((wants_two && devices < 2) || (wants_one && devices < 1)) {
    std::printf("nccl_test: %d CUDA device(s): skipping %s\n", devices,
                filter.c_str());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
