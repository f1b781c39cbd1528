// Compile-and-link probe for the NCCL backend seam: prints the NCCL version
// this build links against. Built only when CMake finds CUDA and NCCL.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>

int main() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) {
    std::fprintf(stderr, "ncclGetVersion failed\n");
    return 1;
  }
  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  std::printf("nccl %d, cuda devices: %d (%s)\n", version,
              err == cudaSuccess ? devices : 0,
              err == cudaSuccess ? "ok" : cudaGetErrorString(err));
  return 0;
}
