// holdfast on libtorch (target holdfast_torch): the communicator's
// collectives on at::Tensor, and runtime state registration from a
// torch::nn::Module and a torch::optim::Optimizer.
//
// Tensors must be contiguous and of a dtype holdfast carries (float32,
// float64, int32, int64, bfloat16, float16, uint8), and live where the
// communicator's transport reads: CPU tensors for the Gloo backend, CUDA
// tensors for NCCL. Anything else gives a Work already failed with
// InvalidArgument naming the tensor's problem; nothing is sent.
//
// Builds against Debian's libtorch (1.13) and pip's torch 2.x.
// Thread safety: as for the Communicator and the Runtime they wrap.
#ifndef HOLDFAST_TORCH_H_
#define HOLDFAST_TORCH_H_

#include <memory>
#include <sstream>
#include <string>
#include <type_traits>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "holdfast/communicator.h"
#include "holdfast/runtime.h"

namespace holdfast::torch {

// The holdfast element type of a scalar type; InvalidArgument otherwise.
absl::StatusOr<DataType> ToDataType(at::ScalarType type);

// OK if `t` can be handed to `comm`'s transport; InvalidArgument naming
// `what` and the problem otherwise.
absl::Status CheckTensor(const Communicator& comm, const at::Tensor& t,
                         const std::string& what);

std::shared_ptr<Work> AllReduce(Communicator& comm, at::Tensor& tensor,
                                ReduceOp op = ReduceOp::kSum,
                                const OpOptions& options = {});
std::shared_ptr<Work> Broadcast(Communicator& comm, at::Tensor& tensor,
                                int root, const OpOptions& options = {});
// `output` holds comm.size() * input.numel() elements, rank r's at r.
std::shared_ptr<Work> AllGather(Communicator& comm, at::Tensor& output,
                                const at::Tensor& input,
                                const OpOptions& options = {});
// `input` holds comm.size() blocks of output.numel() elements.
std::shared_ptr<Work> ReduceScatter(Communicator& comm, at::Tensor& output,
                                    const at::Tensor& input,
                                    ReduceOp op = ReduceOp::kSum,
                                    const OpOptions& options = {});
std::shared_ptr<Work> AllToAll(Communicator& comm, at::Tensor& output,
                               const at::Tensor& input,
                               const OpOptions& options = {});
std::shared_ptr<Work> Send(Communicator& comm, const at::Tensor& tensor,
                           int peer, const OpOptions& options = {});
std::shared_ptr<Work> Recv(Communicator& comm, at::Tensor& tensor, int peer,
                           const OpOptions& options = {});

// Registers every parameter and buffer of `module` (recursively, in
// named_parameters / named_buffers order) as replicated state named
// "<prefix>.<name>". They must be contiguous CPU tensors that keep their
// storage (optimizers update them in place). InvalidArgument naming the
// tensor otherwise.
absl::Status RegisterModule(Runtime& runtime, const ::torch::nn::Module& module,
                            const std::string& prefix = "model");

// The key of `param` in optimizer.state(): a string in libtorch 1.x, the
// TensorImpl pointer in 2.x. For filling the state before registering it.
template <typename Map>
typename Map::key_type OptimizerStateKey(const Map& /*state*/,
                                         const at::Tensor& param) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // as c10::guts::to_string formats it
    out << param.unsafeGetTensorImpl();
    return out.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

// Registers the per-parameter state of an SGD, Adam or AdamW optimizer
// ("<prefix>.<group>.<param>.<field>"), including Adam's step counters.
// The state must exist (optimizers create it at their first step; fill it
// before registering): FailedPrecondition naming the parameter otherwise,
// Unimplemented for another optimizer type.
absl::Status RegisterOptimizer(Runtime& runtime,
                               ::torch::optim::Optimizer& optimizer,
                               const std::string& prefix = "optimizer");

}  // namespace holdfast::torch

#endif  // HOLDFAST_TORCH_H_
