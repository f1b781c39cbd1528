// A deterministic data-parallel trainer on libtorch and holdfast: an MLP
// (16 -> 64 tanh -> 64 tanh -> 1) fitted with torch::optim::SGD (momentum)
// to a fixed target function. The global batch of step s comes from a
// generator seeded with s and is split evenly over the slots; gradients are
// summed with holdfast::torch::AllReduce. The model and the optimizer state
// are registered with holdfast_torch, so a run with a fault in replace mode
// ends with exactly the bytes of the fault-free run. Each step fences its
// writes (holdfast::torch::WriteFence) before opt.step(), so each snapshot
// is copied while the next step computes, and the fence checks that the
// state it watches was not written before.
//
//   holdfast-run -n 2 --standby 1 --inject kill:slot=1:step=20
//       -- holdfast-torch-trainer --steps 40
//
// Each rank prints `final step=<N> world=<W> params_sha256=<hex>`. Exit
// codes: 0 done (also an unused standby), 3 fenced, 4 stopped, 1 error.
#include <cstdint>
#include <cstdio>
#include <string>

#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include "holdfast/runtime.h"
#include "holdfast/torch.h"
#include "sha256.h"

namespace {

// SHA-256 of the parameters' bytes, in order.
// The hash of the whole state: the parameters, then SGD's momentum (the
// trainer has no data position: step k takes batch k).
std::string StateSha256(const std::vector<at::Tensor>& params,
                        ::torch::optim::SGD& opt) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : params) flat.push_back(t.contiguous());
  for (const at::Tensor& p : params) {
    auto& state = static_cast<::torch::optim::SGDParamState&>(
        *opt.state().at(holdfast::torch::OptimizerStateKey(opt.state(), p)));
    flat.push_back(state.momentum_buffer().contiguous());
  }
  std::vector<std::pair<const void*, size_t>> parts;
  for (const at::Tensor& t : flat) parts.emplace_back(t.data_ptr(), t.nbytes());
  return holdfast_examples::Sha256Hex(parts);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"holdfast data-parallel trainer on libtorch (MLP, SGD)"};
  int64_t steps = 100;
  int64_t batch = 64;
  double lr = 0.05;
  app.add_option("--steps", steps, "steps to train")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--batch", batch, "global batch (split over the slots)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--lr", lr, "learning rate");
  CLI11_PARSE(app, argc, argv);

  at::set_num_threads(1);
  ::torch::manual_seed(12345);
  ::torch::nn::Sequential model(
      ::torch::nn::Linear(16, 64), ::torch::nn::Tanh(),
      ::torch::nn::Linear(64, 64), ::torch::nn::Tanh(),
      ::torch::nn::Linear(64, 1));
  ::torch::optim::SGD opt(model->parameters(),
                          ::torch::optim::SGDOptions(lr).momentum(0.9));
  // SGD creates its momentum at the first step; zero buffers give the same
  // arithmetic and can be registered now.
  for (const at::Tensor& p : model->parameters()) {
    auto state = std::make_unique<::torch::optim::SGDParamState>();
    state->momentum_buffer(::torch::zeros_like(p));
    opt.state()[holdfast::torch::OptimizerStateKey(opt.state(), p)] =
        std::move(state);
  }

  auto rt = holdfast::Runtime::Create();
  if (!rt.ok()) {
    std::fprintf(stderr, "torch-trainer: %s\n", rt.status().ToString().c_str());
    return 1;
  }
  holdfast::Runtime& runtime = **rt;
  holdfast::torch::WriteFence fence(runtime);
  absl::Status reg =
      holdfast::torch::RegisterModule(runtime, *model, "model", &fence);
  if (reg.ok()) {
    reg = holdfast::torch::RegisterOptimizer(runtime, opt, "sgd", &fence);
  }
  if (!reg.ok()) {
    std::fprintf(stderr, "torch-trainer: %s\n", reg.ToString().c_str());
    return 1;
  }

  const at::Tensor target_w = ::torch::linspace(0.5, -0.25, 16);
  double last_loss = 0;
  auto step_fn = [&](const holdfast::StepContext& ctx) -> absl::Status {
    at::Generator gen =
        at::detail::createCPUGenerator(1000003ULL * ctx.step + 17);
    at::Tensor x = at::rand({batch, 16}, gen) * 2 - 1;
    at::Tensor y = at::sin(2 * at::matmul(x, target_w)).unsqueeze(1) +
                   0.1 * x.slice(1, 0, 1) * x.slice(1, 1, 2);
    const int64_t lo = batch * ctx.slot / ctx.world_size;
    const int64_t hi = batch * (ctx.slot + 1) / ctx.world_size;
    opt.zero_grad();
    at::Tensor out = model->forward(x.slice(0, lo, hi));
    at::Tensor loss =
        (out - y.slice(0, lo, hi)).pow(2).sum() / static_cast<double>(batch);
    loss.backward();
    at::Tensor total = loss.detach().reshape({1}).clone();
    for (const at::Tensor& p : model->parameters()) {
      at::Tensor g = p.grad();
      absl::Status s = holdfast::torch::AllReduce(*ctx.comm, g)->Wait();
      if (!s.ok()) return s;
    }
    absl::Status s = holdfast::torch::AllReduce(*ctx.comm, total)->Wait();
    if (!s.ok()) return s;
    last_loss = total.item<double>();
    fence.Begin();  // the first write to registered state follows
    opt.step();
    return absl::OkStatus();
  };
  holdfast::RunOptions ro;
  ro.steps = steps;
  ro.metrics = [&] {
    return std::map<std::string, double>{{"loss", last_loss}};
  };
  absl::StatusOr<holdfast::RunResult> result = fence.Run(step_fn, ro);
  if (!result.ok()) {
    const absl::Status& s = result.status();
    std::fprintf(stderr, "torch-trainer: %s\n", s.ToString().c_str());
    if (s.code() == absl::StatusCode::kCancelled) return 0;
    if (s.code() == absl::StatusCode::kFailedPrecondition) return 3;
    if (s.code() == absl::StatusCode::kAborted) return 4;
    return 1;
  }
  std::fprintf(stderr,
               "recoveries=%zu loss=%.6f snapshots_overlapped=%lld "
               "snapshots_unfenced=%lld\n",
               result->recoveries.size(), last_loss,
               static_cast<long long>(result->snapshots_overlapped),
               static_cast<long long>(result->snapshots_unfenced));
  std::printf("final step=%lld world=%d params_sha256=%s\n",
              static_cast<long long>(result->final_step), result->world_size,
              StateSha256(model->parameters(), opt).c_str());
  std::fflush(stdout);
  return 0;
}
