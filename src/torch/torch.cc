// holdfast_torch: see include/holdfast/torch.h.
#include "holdfast/torch.h"

#include <memory>
#include <string>
#include <utility>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace holdfast::torch {
namespace {

// A Work that failed before anything was issued (a bad tensor).
class FailedWork final : public Work {
 public:
  explicit FailedWork(absl::Status status) : status_(std::move(status)) {}
  bool IsCompleted() const override { return true; }
  absl::Status Wait(absl::Duration) override { return status_; }
  uint64_t seq() const override { return 0; }

 private:
  absl::Status status_;
};

std::shared_ptr<Work> Fail(absl::Status status) {
  return std::make_shared<FailedWork>(std::move(status));
}

std::string Shape(const at::Tensor& t) {
  std::string out = "[";
  for (int64_t i = 0; i < t.dim(); ++i) {
    absl::StrAppend(&out, i ? ", " : "", t.size(i));
  }
  return out + "]";
}

absl::Status SameDtype(const at::Tensor& a, const at::Tensor& b,
                       const std::string& what) {
  if (a.scalar_type() != b.scalar_type()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": input and output dtypes differ (",
                     c10::toString(a.scalar_type()), " vs ",
                     c10::toString(b.scalar_type()), ")"));
  }
  return absl::OkStatus();
}

absl::Status Numel(const at::Tensor& t, int64_t want, const std::string& what) {
  if (t.numel() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": holds ", t.numel(), " elements, ", want, " expected"));
  }
  return absl::OkStatus();
}

absl::Status HostState(const at::Tensor& t, const std::string& name) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state '", name, "' is an undefined tensor"));
  }
  if (!t.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state '", name, "' is on ", t.device().str(),
        "; the runtime snapshots host memory (keep a CPU copy of GPU state "
        "and register that)"));
  }
  if (!t.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state '", name, "' is not contiguous"));
  }
  return absl::OkStatus();
}

absl::Status RegisterTensor(Runtime& runtime, const std::string& name,
                            const at::Tensor& t, WriteFence* fence) {
  if (absl::Status s = HostState(t, name); !s.ok()) return s;
  absl::Status s = runtime.RegisterState(name, t.data_ptr(), t.nbytes());
  if (s.ok() && fence != nullptr) fence->Watch(name, t);
  return s;
}

// Adam's and AdamW's per-parameter state (distinct types, same fields):
// the step counter and the moments.
template <typename State>
absl::Status RegisterAdamState(Runtime& runtime, const std::string& base,
                               State& state, WriteFence* fence) {
  absl::Status s =
      runtime.RegisterState(base + ".step", &state.step(), sizeof(int64_t));
  if (s.ok()) {
    s = RegisterTensor(runtime, base + ".exp_avg", state.exp_avg(), fence);
  }
  if (s.ok()) {
    s = RegisterTensor(runtime, base + ".exp_avg_sq", state.exp_avg_sq(),
                       fence);
  }
  if (s.ok() && state.max_exp_avg_sq().defined()) {
    s = RegisterTensor(runtime, base + ".max_exp_avg_sq",
                       state.max_exp_avg_sq(), fence);
  }
  return s;
}

}  // namespace

absl::StatusOr<DataType> ToDataType(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return DataType::kFloat32;
    case at::kDouble:
      return DataType::kFloat64;
    case at::kInt:
      return DataType::kInt32;
    case at::kLong:
      return DataType::kInt64;
    case at::kBFloat16:
      return DataType::kBFloat16;
    case at::kHalf:
      return DataType::kFloat16;
    case at::kByte:
      return DataType::kUInt8;
    case at::kChar:
      return DataType::kInt8;
    case at::kBool:
      return DataType::kBool;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", c10::toString(type),
                       " is not carried by holdfast (float32, float64, int32, "
                       "int64, bfloat16, float16, uint8, int8, bool)"));
  }
}

absl::Status CheckTensor(const Communicator& comm, const at::Tensor& t,
                         const std::string& what) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": undefined tensor"));
  }
  if (!t.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": not contiguous (shape ", Shape(t), "); call .contiguous()"));
  }
  absl::StatusOr<DataType> dt = ToDataType(t.scalar_type());
  if (!dt.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", dt.status().message()));
  }
  const bool nccl = comm.memory() == MemoryKind::kCudaDevice;
  if (nccl && !t.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a ", t.device().str(),
                     " tensor on an NCCL communicator, which takes CUDA "
                     "tensors"));
  }
  if (!nccl && !t.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": a ", t.device().str(), " tensor on a ", comm.backend_name(),
        " communicator, which takes CPU tensors (use the NCCL backend for "
        "CUDA tensors)"));
  }
  return absl::OkStatus();
}

#define HOLDFAST_CHECK_OR_FAIL(expr)       \
  do {                                     \
    absl::Status check_ = (expr);          \
    if (!check_.ok()) return Fail(check_); \
  } while (0)

std::shared_ptr<Work> AllReduce(Communicator& comm, at::Tensor& tensor,
                                ReduceOp op, const OpOptions& options) {
  HOLDFAST_CHECK_OR_FAIL(CheckTensor(comm, tensor, "AllReduce"));
  return comm.AllReduce(tensor.data_ptr(), tensor.numel(),
                        *ToDataType(tensor.scalar_type()), op, options);
}

std::shared_ptr<Work> Broadcast(Communicator& comm, at::Tensor& tensor,
                                int root, const OpOptions& options) {
  HOLDFAST_CHECK_OR_FAIL(CheckTensor(comm, tensor, "Broadcast"));
  return comm.Broadcast(tensor.data_ptr(), tensor.numel(),
                        *ToDataType(tensor.scalar_type()), root, options);
}

std::shared_ptr<Work> AllGather(Communicator& comm, at::Tensor& output,
                                const at::Tensor& input,
                                const OpOptions& options) {
  HOLDFAST_CHECK_OR_FAIL(CheckTensor(comm, input, "AllGather input"));
  HOLDFAST_CHECK_OR_FAIL(CheckTensor(comm, output, "AllGather output"));
  HOLDFAST_CHECK_OR_FAIL(SameDtype(input, output, "AllGather"));
  HOLDFAST_CHECK_OR_FAIL(
      Numel(output, input.numel() * comm.size(), "AllGather output"));
  return comm.AllGather(input.data_ptr(), output.data_ptr(), input.numel(),
                        *ToDataType(input.scalar_type()), options);
}

std::shared_ptr<Work> ReduceScatter(Communicator& comm, at::Tensor& output,
                                    const at::Tensor& input, ReduceOp op,
                                    const OpOptions& options) {
  HOLDFAST_CHECK_OR_FAIL(CheckTensor(comm, input, "ReduceScatter input"));
  HOLDFAST_CHECK_OR_FAIL(CheckTensor(comm, output, "ReduceScatter output"));
  HOLDFAST_CHECK_OR_FAIL(SameDtype(input, output, "ReduceScatter"));
  HOLDFAST_CHECK_OR_FAIL(
      Numel(input, output.numel() * comm.size(), "ReduceScatter input"));
  return comm.ReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                            *ToDataType(input.scalar_type()), op, options);
}

std::shared_ptr<Work> AllToAll(Communicator& comm, at::Tensor& output,
                               const at::Tensor& input,
                               const OpOptions& options) {
  HOLDFAST_CHECK_OR_FAIL(CheckTensor(comm, input, "AllToAll input"));
  HOLDFAST_CHECK_OR_FAIL(CheckTensor(comm, output, "AllToAll output"));
  HOLDFAST_CHECK_OR_FAIL(SameDtype(input, output, "AllToAll"));
  HOLDFAST_CHECK_OR_FAIL(Numel(output, input.numel(), "AllToAll output"));
  if (input.numel() % comm.size() != 0) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("AllToAll: ", input.numel(),
                     " elements do not split into ", comm.size(), " blocks")));
  }
  return comm.AllToAll(input.data_ptr(), output.data_ptr(),
                       input.numel() / comm.size(),
                       *ToDataType(input.scalar_type()), options);
}

std::shared_ptr<Work> Send(Communicator& comm, const at::Tensor& tensor,
                           int peer, const OpOptions& options) {
  HOLDFAST_CHECK_OR_FAIL(CheckTensor(comm, tensor, "Send"));
  return comm.Send(tensor.data_ptr(), tensor.numel(),
                   *ToDataType(tensor.scalar_type()), peer, options);
}

std::shared_ptr<Work> Recv(Communicator& comm, at::Tensor& tensor, int peer,
                           const OpOptions& options) {
  HOLDFAST_CHECK_OR_FAIL(CheckTensor(comm, tensor, "Recv"));
  return comm.Recv(tensor.data_ptr(), tensor.numel(),
                   *ToDataType(tensor.scalar_type()), peer, options);
}

#undef HOLDFAST_CHECK_OR_FAIL

void WriteFence::Watch(std::string name, const at::Tensor& tensor) {
  watched_.emplace_back(std::move(name), tensor);
  versions_.reset();  // the record has no counter for it
}

absl::StatusOr<RunResult> WriteFence::Run(
    std::function<absl::Status(const StepContext&)> step_fn,
    RunOptions options) {
  const bool record =
      options.snapshot_copy != RunOptions::SnapshotCopy::kBetweenSteps;
  auto step = [this, record, fn = std::move(step_fn)](
                  const StepContext& ctx) -> absl::Status {
    in_step_ = true;
    checked_ = false;
    // The record is Begin()'s during the step and gone after it, also when
    // the step throws; a step that fails may have moved counters that the
    // restore after it does not move back, so only one that returned OK
    // records them again.
    absl::Cleanup out = [this] {
      in_step_ = false;
      versions_.reset();
    };
    absl::Status s = fn(ctx);
    std::move(out).Invoke();
    if (s.ok() && record) {
      versions_.emplace();
      for (const auto& [name, t] : watched_) versions_->push_back(t._version());
    }
    return s;
  };
  // No snapshot copied during a step survives a restore, and the restore
  // writes the tensors through their pointers: nothing to compare with.
  options.on_restore = [this, user = std::move(options.on_restore)](
                           int64_t restored) -> absl::Status {
    versions_.reset();
    return user ? user(restored) : absl::OkStatus();
  };
  return runtime_.Run(std::move(step), options);
}

void WriteFence::Begin() {
  if (in_step_ && !checked_) {
    checked_ = true;
    if (versions_.has_value()) {
      for (size_t i = 0; i < watched_.size(); ++i) {
        if (watched_[i].second._version() != (*versions_)[i]) {
          runtime_.ReportEarlyWrite(
              absl::StrCat("tensor '", watched_[i].first, "'"));
          return;
        }
      }
    }
  }
  runtime_.BeginStateUpdate();
}

absl::Status RegisterModule(Runtime& runtime, const ::torch::nn::Module& module,
                            const std::string& prefix, WriteFence* fence) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    absl::Status s =
        RegisterTensor(runtime, prefix + "." + item.key(), item.value(), fence);
    if (!s.ok()) return s;
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    absl::Status s =
        RegisterTensor(runtime, prefix + "." + item.key(), item.value(), fence);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status RegisterOptimizer(Runtime& runtime,
                               ::torch::optim::Optimizer& optimizer,
                               const std::string& prefix, WriteFence* fence) {
  auto& state = optimizer.state();
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t p = 0; p < params.size(); ++p) {
      const std::string base = absl::StrCat(prefix, ".", g, ".", p);
      auto it = state.find(OptimizerStateKey(state, params[p]));
      if (it == state.end() || it->second == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "optimizer state '", base,
            "' does not exist yet (optimizers create it at their first "
            "step); initialize it before registering"));
      }
      ::torch::optim::OptimizerParamState* ps = it->second.get();
      absl::Status s;
      if (auto* sgd = dynamic_cast<::torch::optim::SGDParamState*>(ps)) {
        s = RegisterTensor(runtime, base + ".momentum_buffer",
                           sgd->momentum_buffer(), fence);
      } else if (auto* adam =
                     dynamic_cast<::torch::optim::AdamParamState*>(ps)) {
        s = RegisterAdamState(runtime, base, *adam, fence);
      } else if (auto* adamw =
                     dynamic_cast<::torch::optim::AdamWParamState*>(ps)) {
        s = RegisterAdamState(runtime, base, *adamw, fence);
      } else {
        return absl::UnimplementedError(absl::StrCat(
            "optimizer state '", base,
            "': only SGD, Adam and AdamW state is registered; register "
            "other optimizers' tensors with Runtime::RegisterState"));
      }
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace holdfast::torch
