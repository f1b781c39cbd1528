// holdfast on libtorch (target holdfast_torch): the communicator's
// collectives on at::Tensor, and runtime state registration from a
// torch::nn::Module and a torch::optim::Optimizer.
//
// Tensors must be contiguous and of a dtype holdfast carries (float32,
// float64, int32, int64, bfloat16, float16, uint8, int8, bool), and live where
// the communicator's transport reads: CPU tensors for the Gloo backend, CUDA
// tensors for NCCL. Anything else gives a Work already failed with
// InvalidArgument naming the tensor's problem; nothing is sent.
//
// Builds against Debian's libtorch (1.13) and pip's torch 2.x.
// Thread safety: as for the Communicator and the Runtime they wrap.
#ifndef HOLDFAST_TORCH_H_
#define HOLDFAST_TORCH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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

// Catches a step's in-place writes to registered tensors made before it
// called BeginStateUpdate(), as the Python package does. With
// RunOptions::snapshot_copy other than kBetweenSteps, a snapshot is copied
// while the next step computes, and that step must call
// BeginStateUpdate() before its first write to registered state: a write
// before it could tear the copy. The fence records the version counters
// of the tensors it watches when a step returns, and Begin() compares
// them: a tensor written since then makes the step report the early write
// (Runtime::ReportEarlyWrite, naming the tensor) instead of fencing, so
// the snapshot copied during it is dropped (kAuto, with a warning) or the
// run stops with FailedPrecondition (kDuringNextStep).
//
//   holdfast::torch::WriteFence fence(runtime);
//   RegisterModule(runtime, *model, "model", &fence);
//   RegisterOptimizer(runtime, opt, "sgd", &fence);
//   auto result = fence.Run([&](const holdfast::StepContext& ctx) {
//     ...forward, backward, all-reduce of the gradients...
//     fence.Begin();  // instead of ctx.runtime->BeginStateUpdate()
//     opt.step();
//     return absl::OkStatus();
//   }, options);
//
// In-place torch ops move a tensor's version counter; writes through
// data_ptr(), from_blob aliases or a `.data()` tensor (a counter of its
// own) do not, and go unseen, as do state not registered as a tensor
// (Adam's step counter, a plain integer) and state registered with
// Runtime::RegisterState directly. libtorch 1.13's SGD writes the
// parameters through .data(): its momentum buffers show its step (Adam
// and AdamW move the parameters' counters too), and plain SGD without
// momentum is not seen at all. The record is dropped when a step
// fails and when the state is restored. Not thread-safe: Run() and, from
// its step function, Begin() on one thread.
class WriteFence {
 public:
  explicit WriteFence(Runtime& runtime) : runtime_(runtime) {}
  WriteFence(const WriteFence&) = delete;
  WriteFence& operator=(const WriteFence&) = delete;

  // Watches `tensor` (the tensor itself, as registered) under `name`.
  // RegisterModule and RegisterOptimizer call it for every tensor they
  // register when given the fence.
  void Watch(std::string name, const at::Tensor& tensor);
  size_t watched() const { return watched_.size(); }

  // runtime.Run(step_fn, options), with the record taken at each step's
  // end and dropped at each restore (options.on_restore still runs).
  absl::StatusOr<RunResult> Run(
      std::function<absl::Status(const StepContext&)> step_fn,
      RunOptions options);

  // In a step run by Run(), before its first write to registered state:
  // Runtime::BeginStateUpdate(), or ReportEarlyWrite() naming the first
  // watched tensor written since the step before ended (once per step;
  // later calls in the step pass BeginStateUpdate() on, which the runtime
  // then ignores).
  void Begin();

 private:
  Runtime& runtime_;
  std::vector<std::pair<std::string, at::Tensor>> watched_;
  // The version counters of watched_ when the last step returned; none
  // after a failed step, a restore or a Watch() (nothing to compare with).
  std::optional<std::vector<int64_t>> versions_;
  bool in_step_ = false;
  bool checked_ = false;  // this step's Begin() compared the counters
};

// Registers every parameter and buffer of `module` (recursively, in
// named_parameters / named_buffers order) as replicated state named
// "<prefix>.<name>". They must be contiguous CPU tensors that keep their
// storage (optimizers update them in place). InvalidArgument naming the
// tensor otherwise. Each one registered is watched by `fence`, if given.
absl::Status RegisterModule(Runtime& runtime, const ::torch::nn::Module& module,
                            const std::string& prefix = "model",
                            WriteFence* fence = nullptr);

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
// Unimplemented for another optimizer type. Each tensor registered is
// watched by `fence`, if given.
absl::Status RegisterOptimizer(Runtime& runtime,
                               ::torch::optim::Optimizer& optimizer,
                               const std::string& prefix = "optimizer",
                               WriteFence* fence = nullptr);

}  // namespace holdfast::torch

#endif  // HOLDFAST_TORCH_H_
