// holdfast_torch: tensors the transport cannot take are refused by name
// before anything is sent; module and optimizer state is registered under
// stable names and restored in place; collectives on tensors carry the
// right bytes. Multi-process recovery of the libtorch trainer is in
// test/python/test_jobs.py.
//
// libtorch first: it defines glog's CHECK, which would otherwise replace
// Catch's (a failed check would then abort the binary, not report).
#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "holdfast/runtime.h"
#include "holdfast/store.h"
#include "holdfast/torch.h"
#include "test/support/test_controller.h"

namespace {

constexpr char kToken[] = "torch-test-token";

struct Job {
  Job() {
    auto s = holdfast::testing::TestController::Start(kToken, 1);
    REQUIRE(s.ok());
    server = std::move(*s);
    holdfast::RuntimeOptions ro;
    ro.controller = server->address();
    ro.token = kToken;
    ro.host = "test-host";
    auto r = holdfast::Runtime::Create(ro);
    REQUIRE(r.ok());
    runtime = std::move(*r);
  }
  ~Job() { runtime.reset(); }  // before the controller
  std::unique_ptr<holdfast::testing::TestController> server;
  std::unique_ptr<holdfast::Runtime> runtime;
};

bool Mentions(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

}  // namespace

TEST_CASE("torch: bad tensors are refused by name and nothing is sent") {
  Job job;
  auto comm = job.runtime->communicator();
  REQUIRE(comm.ok());
  holdfast::Communicator& c = **comm;
  CHECK(c.backend_name() == "gloo");

  at::Tensor strided = at::zeros({4, 4}).t();
  absl::Status s = holdfast::torch::AllReduce(c, strided)->Wait();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Mentions(s, "AllReduce: not contiguous (shape [4, 4])"));

  at::Tensor complex = at::zeros({3}, at::kComplexFloat);
  s = holdfast::torch::Broadcast(c, complex, 0)->Wait();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Mentions(s, "ComplexFloat"));

  at::Tensor in = at::ones({3});
  at::Tensor small = at::zeros({2});
  s = holdfast::torch::AllGather(c, small, in)->Wait();
  CHECK(Mentions(s, "AllGather output: holds 2 elements, 3 expected"));
  at::Tensor other = at::zeros({3}, at::kDouble);
  s = holdfast::torch::AllGather(c, other, in)->Wait();
  CHECK(Mentions(s, "dtypes differ"));
  at::Tensor undefined;
  s = holdfast::torch::Send(c, undefined, 0)->Wait();
  CHECK(Mentions(s, "Send: undefined tensor"));
  // None of it reached the communicator: it is still healthy.
  CHECK(c.health().ok());
}

TEST_CASE("torch: collectives on tensors carry the bytes") {
  Job job;
  auto comm = job.runtime->communicator();
  REQUIRE(comm.ok());
  at::Tensor t = at::arange(6, at::kFloat);
  REQUIRE(holdfast::torch::AllReduce(**comm, t)->Wait().ok());
  CHECK(at::equal(t, at::arange(6, at::kFloat)));
  at::Tensor h = at::full({5}, 1.5, at::kBFloat16);
  at::Tensor out = at::zeros({5}, at::kBFloat16);
  REQUIRE(holdfast::torch::AllGather(**comm, out, h)->Wait().ok());
  CHECK(at::equal(out, h));
  at::Tensor rs = at::zeros({4}, at::kLong);
  REQUIRE(holdfast::torch::ReduceScatter(**comm, rs, at::arange(4, at::kLong))
              ->Wait()
              .ok());
  CHECK(at::equal(rs, at::arange(4, at::kLong)));
}

TEST_CASE(
    "torch: module and optimizer state is registered by name and the loop runs "
    "on it") {
  Job job;
  holdfast::Runtime& rt = *job.runtime;
  ::torch::manual_seed(7);
  ::torch::nn::Sequential model(::torch::nn::Linear(4, 3),
                                ::torch::nn::BatchNorm1d(3));
  ::torch::optim::Adam adam(model->parameters(),
                            ::torch::optim::AdamOptions(0.1));

  absl::Status s = holdfast::torch::RegisterOptimizer(rt, adam);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Mentions(s, "optimizer state 'optimizer.0.0' does not exist yet"));

  // One real step creates Adam's state (step counters and moments).
  model->forward(at::randn({5, 4})).sum().backward();
  adam.step();
  REQUIRE(holdfast::torch::RegisterModule(rt, *model).ok());
  REQUIRE(holdfast::torch::RegisterOptimizer(rt, adam).ok());
  s = holdfast::torch::RegisterModule(rt, *model);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Mentions(s, "model.0.weight"));

  ::torch::nn::Linear cuda_free(2, 2);
  cuda_free->weight.set_data(cuda_free->weight.t());  // strided view
  s = holdfast::torch::RegisterModule(rt, *cuda_free, "strided");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Mentions(s, "'strided.weight' is not contiguous"));

  // Steps 1..3 change the state; the loop's snapshots hold it, and what
  // the loop leaves is what the registered buffers hold.
  at::Tensor w = model->parameters()[0];
  holdfast::RunOptions ro;
  ro.steps = 3;
  auto result = rt.Run(
      [&](const holdfast::StepContext&) -> absl::Status {
        adam.zero_grad();
        model->forward(at::randn({5, 4})).sum().backward();
        adam.step();
        return absl::OkStatus();
      },
      ro);
  REQUIRE(result.ok());
  CHECK(result->final_step == 3);
  auto* state = dynamic_cast<::torch::optim::AdamParamState*>(
      adam.state()
          .at(holdfast::torch::OptimizerStateKey(adam.state(), w))
          .get());
  REQUIRE(state != nullptr);
  CHECK(state->step() == 4);  // one before registering, three in the loop
}

namespace {

// A Linear model and SGD with momentum (its state created, as the
// trainer example does), registered with `fence` watching.
struct Fenced {
  explicit Fenced(holdfast::Runtime& rt) : fence(rt) {
    ::torch::manual_seed(3);
    for (const at::Tensor& p : model->parameters()) {
      auto state = std::make_unique<::torch::optim::SGDParamState>();
      state->momentum_buffer(::torch::zeros_like(p));
      opt.state()[holdfast::torch::OptimizerStateKey(opt.state(), p)] =
          std::move(state);
    }
    REQUIRE(holdfast::torch::RegisterModule(rt, *model, "model", &fence).ok());
    REQUIRE(holdfast::torch::RegisterOptimizer(rt, opt, "sgd", &fence).ok());
  }
  // 12 steps through the fence, each its compute (the backup thread
  // copies the snapshot meanwhile), the fence and the update; with
  // `early`, the update comes first.
  absl::StatusOr<holdfast::RunResult> Run(bool early, holdfast::RunOptions ro) {
    ro.steps = 12;
    return fence.Run(
        [this, early](const holdfast::StepContext&) -> absl::Status {
          opt.zero_grad();
          model->forward(at::randn({8, 4})).pow(2).sum().backward();
          absl::SleepFor(absl::Milliseconds(10));
          if (early) opt.step();
          fence.Begin();
          if (!early) opt.step();
          return absl::OkStatus();
        },
        ro);
  }
  ::torch::nn::Linear model{4, 2};
  ::torch::optim::SGD opt{model->parameters(),
                          ::torch::optim::SGDOptions(0.01).momentum(0.9)};
  holdfast::torch::WriteFence fence;
};

}  // namespace

TEST_CASE(
    "torch: with the write fence before the optimizer step, snapshots are "
    "copied during the next step and none is dropped") {
  Job job;
  Fenced f(*job.runtime);
  // weight, bias, and a momentum buffer of each.
  CHECK(f.fence.watched() == 4);
  int restores = 0;
  holdfast::RunOptions ro;
  ro.on_restore = [&](int64_t) {
    ++restores;
    return absl::OkStatus();
  };
  auto result = f.Run(/*early=*/false, ro);
  REQUIRE(result.ok());
  CHECK(result->final_step == 12);
  CHECK(result->snapshots_unfenced == 0);
  CHECK(result->snapshots_overlapped > 0);
  CHECK(restores == 1);  // the caller's on_restore still runs (at the start)
}

TEST_CASE(
    "torch: an optimizer step before the write fence counts as no fence "
    "(kAuto) and stops a kDuringNextStep run naming the tensor") {
  SECTION("kAuto") {
    Job job;
    Fenced f(*job.runtime);
    auto result = f.Run(/*early=*/true, {});
    REQUIRE(result.ok());
    CHECK(result->final_step == 12);
    // Step 1 had nothing to compare with, so its snapshot was copied
    // during step 2, which wrote first: that one was dropped, and no step
    // after it counted as fenced.
    CHECK(result->snapshots_unfenced == 1);
    CHECK(result->snapshots_overlapped == 0);
  }
  SECTION("kDuringNextStep") {
    Job job;
    Fenced f(*job.runtime);
    holdfast::RunOptions ro;
    ro.snapshot_copy = holdfast::RunOptions::SnapshotCopy::kDuringNextStep;
    auto result = f.Run(/*early=*/true, ro);
    REQUIRE_FALSE(result.ok());
    CHECK(result.status().code() == absl::StatusCode::kFailedPrecondition);
    // The first watched tensor the update wrote: libtorch's SGD writes
    // the parameters through .data(), whose version counter is its own,
    // so the momentum buffers are what show its step.
    CHECK(Mentions(result.status(), "tensor 'sgd.0.0.momentum_buffer'"));
  }
}
