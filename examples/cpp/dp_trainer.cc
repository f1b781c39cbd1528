// A deterministic data-parallel trainer on the holdfast runtime: a small MLP
// (16 -> 32 tanh -> 1) fitted with SGD and momentum to a fixed target
// function. Sample i of batch k is generated from a seed derived from (k, i),
// so any slot can produce any sample. The next batch's index is the
// registered data position (batch k at step k unless batches are skipped
// after a numeric anomaly, or with --skip-data); the global batch is split
// evenly over
// the slots and the gradients are summed with an all-reduce in slot order.
// A run with a fault in replace mode therefore ends with exactly the bytes
// of the fault-free run.
//
// --zero1 shards the momentum ZeRO-1 style: it is registered as sharded
// state, each slot updates the parameters of its partition with its own
// momentum shard, and the parameters are all-gathered. The arithmetic per
// parameter is the same, so the hash equals the plain run's.
//
//   holdfast-run -n 4 --standby 1 -- holdfast-dp-trainer --steps 200
//
// Each rank prints one line to stdout at the end:
//   final step=<N> world=<W> params_sha256=<hex>
// (the hash covers the whole state: the MLP, its momentum, the
// --state-mb table and the data position),
// and `final_loss=<x>` on stderr. Exit codes: 0 done (also a standby that
// was never needed), 3 fenced, 4 the job stopped, 1 any other error.
//
// Built as holdfast-dp-trainer-nccl (when CUDA and NCCL are found), it
// runs its collectives on the GPU when the communicator is an NCCL one
// (HOLDFAST_BACKEND=nccl): the gradients and the gathered parameters go
// through a device buffer. The model still computes on the CPU; what runs
// on the GPU is the communicator, with its deadlines, aborts and rebuilds.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#ifdef HOLDFAST_DP_TRAINER_NCCL
#include <cuda_runtime_api.h>
#endif

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "holdfast/runtime.h"
#include "sha256.h"

namespace {

constexpr int kIn = 16;
constexpr int kHidden = 32;
constexpr int kParams = kIn * kHidden + kHidden + kHidden + 1;

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1) from (seed, k).
float Uniform(uint64_t seed, uint64_t k) {
  return static_cast<float>((SplitMix(seed * 1315423911ULL + k) >> 40) *
                                (1.0 / 16777216.0) * 2.0 -
                            1.0);
}

struct Sample {
  float x[kIn];
  float y;
};

Sample MakeSample(int64_t step, int64_t index) {
  Sample s;
  const uint64_t seed = SplitMix(static_cast<uint64_t>(step) << 20 ^
                                 static_cast<uint64_t>(index));
  float dot = 0;
  for (int j = 0; j < kIn; ++j) {
    s.x[j] = Uniform(seed, static_cast<uint64_t>(j));
    dot += s.x[j] * (0.5f - 0.05f * static_cast<float>(j));
  }
  s.y = std::sin(2.0f * dot) + 0.1f * s.x[0] * s.x[1];
  return s;
}

// Forward and backward for one sample; adds d(loss)/d(params) into `grad`.
float Backprop(const float* w, const Sample& s, float* grad) {
  const float* w1 = w;                   // [kHidden][kIn]
  const float* b1 = w1 + kIn * kHidden;  // [kHidden]
  const float* w2 = b1 + kHidden;        // [kHidden]
  const float* b2 = w2 + kHidden;        // [1]
  float h[kHidden];
  float out = *b2;
  for (int k = 0; k < kHidden; ++k) {
    float a = b1[k];
    for (int j = 0; j < kIn; ++j) a += w1[k * kIn + j] * s.x[j];
    h[k] = std::tanh(a);
    out += w2[k] * h[k];
  }
  const float err = out - s.y;
  if (grad != nullptr) {
    float* g1 = grad;
    float* gb1 = g1 + kIn * kHidden;
    float* g2 = gb1 + kHidden;
    float* gb2 = g2 + kHidden;
    *gb2 += err;
    for (int k = 0; k < kHidden; ++k) {
      g2[k] += err * h[k];
      const float d = err * w2[k] * (1 - h[k] * h[k]);
      gb1[k] += d;
      for (int j = 0; j < kIn; ++j) g1[k * kIn + j] += d * s.x[j];
    }
  }
  return 0.5f * err * err;
}

// Runs `op` on the collective's buffers: `in` (count_in floats, also the
// result when `out` is null) and `out` (count_out floats). On an NCCL
// communicator the buffers are staged through device memory.
class Collectives {
 public:
  Collectives() = default;
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  template <typename Op>
  absl::Status Run(holdfast::Communicator& comm, float* in, size_t count_in,
                   float* out, size_t count_out, Op op) {
#ifdef HOLDFAST_DP_TRAINER_NCCL
    if (comm.backend_name() == "nccl") {
      const size_t bytes = (count_in + count_out) * sizeof(float);
      if (bytes > device_bytes_) {
        if (device_ != nullptr) cudaFree(device_);
        device_ = nullptr;
        device_bytes_ = 0;
        if (cudaError_t e = cudaMalloc(&device_, bytes); e != cudaSuccess) {
          return absl::ResourceExhaustedError(
              absl::StrCat("dp-trainer: cudaMalloc: ", cudaGetErrorString(e)));
        }
        device_bytes_ = bytes;
      }
      float* d_in = static_cast<float*>(device_);
      float* d_out = out == nullptr ? nullptr : d_in + count_in;
      auto copy = [](float* to, const float* from, size_t n,
                     cudaMemcpyKind kind) -> absl::Status {
        const cudaError_t e = cudaMemcpy(to, from, n * sizeof(float), kind);
        if (e == cudaSuccess) return absl::OkStatus();
        return absl::InternalError(
            absl::StrCat("dp-trainer: cudaMemcpy: ", cudaGetErrorString(e)));
      };
      absl::Status s = copy(d_in, in, count_in, cudaMemcpyHostToDevice);
      if (s.ok()) s = op(d_in, d_out);
      if (!s.ok()) return s;
      return out == nullptr
                 ? copy(in, d_in, count_in, cudaMemcpyDeviceToHost)
                 : copy(out, d_out, count_out, cudaMemcpyDeviceToHost);
    }
#endif
    (void)comm;
    (void)count_in;
    (void)count_out;
    return op(in, out);
  }
  ~Collectives() {
#ifdef HOLDFAST_DP_TRAINER_NCCL
    if (device_ != nullptr) cudaFree(device_);
#endif
  }

 private:
  void* device_ = nullptr;
  size_t device_bytes_ = 0;
};

// A draw in [0, 1) from (a, b), the same in every process.
double Draw(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) / 9007199254740992.0;
}

// --uneven: the step's compute as a multiple of --step-ms. The draw is
// the step's (the same on every slot: it is the batch that is long), with
// 5 % noise of the slot's own; 1 without --uneven.
double StepScale(double sigma, int64_t step, int slot) {
  if (sigma <= 0) return 1.0;
  const auto s = static_cast<uint64_t>(step);
  // Box-Muller: a standard normal from two uniforms.
  const double u1 = std::max(Draw(s, 1), 1e-12);
  const double z =
      std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * Draw(s, 2));
  double scale = std::exp(sigma * z - sigma * sigma / 2);
  if (Draw(s, 3) < 0.05) scale = 5.0 + 5.0 * Draw(s, 4);
  const double noise =
      1.0 + 0.05 * (2.0 * Draw(s, 100 + static_cast<uint64_t>(slot)) - 1);
  return scale * noise;
}

// --noise: the step's compute times 1 + noise x a uniform draw in
// [-1, 1], the slot's own at each step (step-time jitter every rank has).
double Noise(double noise, int64_t step, int slot) {
  if (noise <= 0) return 1.0;
  const double u =
      Draw(static_cast<uint64_t>(step), 1000 + static_cast<uint64_t>(slot));
  return 1.0 + noise * (2.0 * u - 1.0);
}

// --burn: `d` of this thread's CPU time, spent spinning: the step's
// compute as work, which a CPU quota or a stop from outside slows (a
// sleep is not slowed by a quota).
void Burn(absl::Duration d) {
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return absl::DurationFromTimespec(ts);
  };
  const absl::Duration end = cpu_now() + d;
  volatile uint64_t x = 1;
  while (cpu_now() < end) {
    for (int i = 0; i < 1000; ++i) x = x * 6364136223846793005ull + 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"holdfast deterministic data-parallel trainer (MLP, SGD)"};
  int64_t steps = 100;
  int64_t state_mb = 0;
  int64_t batch = 64;
  int64_t step_ms = 0;
  double uneven = 0;
  bool burn = false;
  double noise = 0;
  int64_t snapshot_every = 1;
  float lr = 0.05f;
  std::string save, load;
  bool zero1 = false;
  std::string snapshot_copy = "auto";
  bool await_commit = false;
  std::string progress_dir;
  app.add_flag("--zero1", zero1,
               "shard the momentum over the slots (ZeRO-1) and all-gather "
               "the parameters");
  app.add_option("--snapshot-copy", snapshot_copy,
                 "where each snapshot is copied (RunOptions::snapshot_copy): "
                 "auto (during the next step, as every step fences its "
                 "writes with BeginStateUpdate()), between-steps, or "
                 "during-next-step")
      ->check(CLI::IsMember({"auto", "between-steps", "during-next-step"}));
  app.add_flag("--await-commit", await_commit,
               "for tests: each step waits (up to 60 s) for the previous "
               "snapshot to commit before its all-reduce, so that no "
               "snapshot is skipped and a failure in the all-reduce finds "
               "the live state at the committed step; needs --snapshot-copy "
               "between-steps");
  app.add_option("--save", save,
                 "slot 0 writes the final state to this file (the restart "
                 "baseline of benchmarks/recovery_bench)");
  app.add_option("--load", load,
                 "start from the state in this file instead of the fixed "
                 "initialization");
  app.add_option("--progress-dir", progress_dir,
                 "for tests: append \"<step> <unix ns>\" to "
                 "DIR/progress-<pid> as each step begins (so the step "
                 "before it has completed)");
  app.add_option("--steps", steps, "steps to train")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--state-mb", state_mb,
                 "extra registered parameter table, MiB (for benchmarks)")
      ->check(CLI::Range(int64_t{0}, int64_t{65536}));
  app.add_option("--batch", batch, "global batch (split over the slots)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--step-ms", step_ms, "extra compute time per step, ms")
      ->check(CLI::Range(int64_t{0}, int64_t{600000}));
  app.add_option("--uneven", uneven,
                 "uneven steps, as an RL job's: each step's extra compute is "
                 "--step-ms times a lognormal draw of this sigma, the same "
                 "on every slot (5 % of the steps 5-10x), with 5 % noise per "
                 "slot")
      ->check(CLI::Range(0.0, 3.0));
  app.add_option("--noise", noise,
                 "step-time jitter: each slot's compute at each step is "
                 "--step-ms times 1 + a uniform draw in [-noise, noise], the "
                 "slot's own")
      ->check(CLI::Range(0.0, 0.9));
  app.add_flag("--burn", burn,
               "spend --step-ms as CPU time, spinning, instead of sleeping: "
               "compute that a CPU quota or a stop from outside slows");
  app.add_option("--snapshot-every", snapshot_every, "snapshot every k steps")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--lr", lr, "learning rate");
  std::string skip_data;
  int replica_check_every = holdfast::NumericChecks().replica_check_every;
  app.add_option("--replica-check-every", replica_check_every,
                 "compare the slots' replicated state every N snapshots "
                 "(0: off)")
      ->check(CLI::NonNegativeNumber);
  double spike_factor = 0;
  app.add_option("--spike-factor", spike_factor,
                 "roll back a step whose loss is above this multiple of its "
                 "running median (0: off)");
  app.add_option("--skip-data", skip_data,
                 "batches to skip, as a job that rolled back past a numeric "
                 "anomaly skipped them: B:E[,B:E...] (positions [B, E); "
                 "summary.json's skipped_data), for a reference run");
  int64_t bad_batch = 0;
  app.add_option("--bad-batch", bad_batch,
                 "for tests: the first sample of batch B carries a label 1e5 "
                 "off (a bad record), so the slot that reads it computes "
                 "gradients far above the others' whenever it is read")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (await_commit && snapshot_copy != "between-steps") {
    // A snapshot copied during the next step commits only once that step
    // calls BeginStateUpdate(), after its all-reduce: waiting for it before
    // the all-reduce would wait for nothing.
    std::fprintf(stderr,
                 "dp-trainer: --await-commit needs --snapshot-copy "
                 "between-steps\n");
    return 2;
  }
  if (zero1 && (!save.empty() || !load.empty())) {
    std::fprintf(stderr, "dp-trainer: --save/--load need the plain mode\n");
    return 2;
  }

  auto rt = holdfast::Runtime::Create();
  if (!rt.ok()) {
    std::fprintf(stderr, "dp-trainer: %s\n", rt.status().ToString().c_str());
    return 1;
  }
  holdfast::Runtime& runtime = **rt;

  // The state every slot starts from: a fixed initialization.
  std::vector<float> params(kParams);
  for (int i = 0; i < kParams; ++i) params[i] = 0.3f * Uniform(12345, i);
  std::vector<float> momentum(kParams, 0.0f);
  std::vector<uint8_t> table(static_cast<size_t>(state_mb) << 20);
  {
    // Through a local pointer, so the loop is vectorized: indexing the
    // vector reloads its data pointer for every byte (a uint8_t store may
    // alias it), and filled 1 GiB at about 0.7 GB/s. A restart pays this.
    uint8_t* t = table.data();
    const size_t n = table.size();
    for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint8_t>(i * 131);
  }
  absl::Status reg = runtime.RegisterState("params", params.data(),
                                           params.size() * sizeof(float));
  if (reg.ok() && !zero1) {
    reg = runtime.RegisterState("momentum", momentum.data(),
                                momentum.size() * sizeof(float));
  } else if (reg.ok()) {
    // Zero-initialized by the runtime, like the plain momentum.
    reg = runtime
              .RegisterShardedState("momentum", kParams * sizeof(float),
                                    sizeof(float))
              .status();
  }
  if (reg.ok() && !table.empty()) {
    reg = runtime.RegisterState("table", table.data(), table.size());
  }
  // The index of the next batch: registered, so a rollback restores it and
  // the runtime moves it past the batches the job skips.
  int64_t data_pos = 0;
  if (reg.ok()) reg = runtime.RegisterDataPosition("data_pos", &data_pos);
  if (!reg.ok()) {
    std::fprintf(stderr, "dp-trainer: %s\n", reg.ToString().c_str());
    return 1;
  }
  const std::vector<std::pair<void*, size_t>> state = {
      {params.data(), params.size() * sizeof(float)},
      {momentum.data(), momentum.size() * sizeof(float)},
      {table.data(), table.size()}};
  if (!load.empty()) {
    std::FILE* f = std::fopen(load.c_str(), "rb");
    bool ok = f != nullptr;
    for (const auto& [p, n] : state) ok = ok && std::fread(p, 1, n, f) == n;
    ok = ok && std::fgetc(f) == EOF;
    if (f != nullptr) std::fclose(f);
    if (!ok) {
      std::fprintf(stderr,
                   "dp-trainer: --load %s: missing, short or of another "
                   "--state-mb\n",
                   load.c_str());
      return 1;
    }
  }

  std::vector<float> grad(kParams);
  float last_loss = 0;
  double last_grad_norm = 0;
  Collectives collectives;
  std::FILE* progress = nullptr;
  if (!progress_dir.empty()) {
    const std::string path =
        absl::StrCat(progress_dir, "/progress-", static_cast<int>(getpid()));
    progress = std::fopen(path.c_str(), "a");
    if (progress == nullptr) {
      std::fprintf(stderr, "dp-trainer: --progress-dir: cannot open %s\n",
                   path.c_str());
      return 2;
    }
    // Where the parameters live, for a test that writes into this
    // process's memory from outside (/proc/PID/mem).
    std::FILE* where = std::fopen(
        absl::StrCat(progress_dir, "/state-", static_cast<int>(getpid()))
            .c_str(),
        "w");
    if (where != nullptr) {
      std::fprintf(where, "params %llu %zu\n",
                   static_cast<unsigned long long>(
                       reinterpret_cast<uintptr_t>(params.data())),
                   params.size() * sizeof(float));
      std::fclose(where);
    }
  }
  auto step_fn = [&](const holdfast::StepContext& ctx) -> absl::Status {
    if (progress != nullptr) {
      std::fprintf(progress, "%lld %lld\n", static_cast<long long>(ctx.step),
                   static_cast<long long>(absl::ToUnixNanos(absl::Now())));
      std::fflush(progress);
    }
    std::fill(grad.begin(), grad.end(), 0.0f);
    const int64_t begin = batch * ctx.slot / ctx.world_size;
    const int64_t end = batch * (ctx.slot + 1) / ctx.world_size;
    // Batch k (from 1) is the one step k gets when nothing is skipped.
    const int64_t batch_id = data_pos + 1;
    float loss = 0;
    for (int64_t i = begin; i < end; ++i) {
      Sample sample = MakeSample(batch_id, i);
      if (batch_id == bad_batch && i == 0) sample.y += 1e5f;
      loss += Backprop(params.data(), sample, grad.data());
    }
    // This slot's own gradients, before they meet the others': a NaN
    // found here names this slot as its source.
    ctx.runtime->CheckFinite("local gradients", grad.data(), kParams);
    if (step_ms > 0) {
      const absl::Duration compute =
          absl::Milliseconds(static_cast<double>(step_ms)) *
          StepScale(uneven, ctx.step, ctx.slot) *
          Noise(noise, ctx.step, ctx.slot);
      if (burn) {
        Burn(compute);
      } else {
        absl::SleepFor(compute);
      }
    }
    // The last step snapshotted before this one (none before step 1, or
    // after a restore to step 0).
    const int64_t prev = (ctx.step - 1) / snapshot_every * snapshot_every;
    if (await_commit && prev >= 1) {
      absl::Status c = ctx.runtime->AwaitCommit(prev, absl::Seconds(60));
      if (!c.ok()) return c;
    }
    // The loss rides along as the last element, so one all-reduce does it.
    grad.push_back(loss);
    absl::Status s = collectives.Run(
        *ctx.comm, grad.data(), grad.size(), nullptr, 0,
        [&](float* in, float*) {
          return ctx.comm
              ->AllReduce(in, grad.size(), holdfast::DataType::kFloat32,
                          holdfast::ReduceOp::kSum)
              ->Wait();
        });
    last_loss = grad.back() / static_cast<float>(batch);
    grad.pop_back();
    if (!s.ok()) return s;
    double norm = 0;
    for (float g : grad) norm += static_cast<double>(g) * g;
    last_grad_norm = std::sqrt(norm) / static_cast<double>(batch);
    // The registered state is written from here on.
    ctx.runtime->BeginStateUpdate();
    ++data_pos;
    const float scale = 1.0f / static_cast<float>(batch);
    if (!zero1) {
      for (int i = 0; i < kParams; ++i) {
        momentum[i] = 0.9f * momentum[i] + grad[i] * scale;
        params[i] -= lr * momentum[i];
      }
    } else {
      // This slot's partition of the momentum (it moves after a shrink).
      absl::StatusOr<holdfast::ShardView> shard =
          ctx.runtime->Shard("momentum");
      if (!shard.ok()) return shard.status();
      float* m = reinterpret_cast<float*>(shard->data);
      const size_t first = shard->offset / sizeof(float);
      const size_t count = shard->bytes / sizeof(float);
      for (size_t k = 0; k < count; ++k) {
        const size_t i = first + k;
        m[k] = 0.9f * m[k] + grad[i] * scale;
        params[i] -= lr * m[k];
      }
      // All-gather the updated partitions (padded to equal size; the
      // runtime's partition gives the first kParams % W slots one more)
      // into `full`, from this slot's `count` values at `mine`.
      auto gather = [&](const float* mine, std::vector<float>& full) {
        const int w = ctx.world_size;
        const size_t chunk = (kParams + w - 1) / w;
        std::vector<float> send(chunk, 0.0f), recv(chunk * w);
        std::copy(mine, mine + count, send.begin());
        absl::Status g = collectives.Run(
            *ctx.comm, send.data(), chunk, recv.data(), recv.size(),
            [&](float* in, float* out) {
              return ctx.comm
                  ->AllGather(in, out, chunk, holdfast::DataType::kFloat32)
                  ->Wait();
            });
        if (!g.ok()) return g;
        const size_t base = kParams / w, extra = kParams % w;
        for (int r = 0; r < w; ++r) {
          const size_t ru = static_cast<size_t>(r);
          const size_t rf = ru * base + std::min(ru, extra);
          const size_t rc = base + (ru < extra ? 1 : 0);
          std::copy(recv.begin() + ru * chunk, recv.begin() + ru * chunk + rc,
                    full.begin() + rf);
        }
        return absl::OkStatus();
      };
      s = gather(params.data() + first, params);
      if (!s.ok()) return s;
      // The whole momentum, for the final hash (the runtime's communicator
      // ends with Run).
      if (ctx.step == steps) {
        s = gather(m, momentum);
        if (!s.ok()) return s;
      }
    }
    if (!table.empty()) {
      // A sparse update of the table, as an embedding would get.
      const size_t at = static_cast<size_t>(ctx.step) * 4099 % table.size();
      table[at] = static_cast<uint8_t>(table[at] + ctx.step);
    }
    return absl::OkStatus();
  };
  holdfast::RunOptions ro;
  ro.steps = steps;
  ro.snapshot_every = snapshot_every;
  ro.snapshot_copy = snapshot_copy == "between-steps"
                         ? holdfast::RunOptions::SnapshotCopy::kBetweenSteps
                     : snapshot_copy == "during-next-step"
                         ? holdfast::RunOptions::SnapshotCopy::kDuringNextStep
                         : holdfast::RunOptions::SnapshotCopy::kAuto;
  ro.metrics = [&] {
    return std::map<std::string, double>{{"loss", last_loss},
                                         {"grad_norm", last_grad_norm}};
  };
  ro.numerics.spike_factor = spike_factor;
  ro.numerics.replica_check_every = replica_check_every;
  for (absl::string_view r :
       absl::StrSplit(skip_data, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> be =
        absl::StrSplit(r, absl::MaxSplits(':', 1));
    int64_t b = 0, e = 0;
    if (!absl::SimpleAtoi(be.first, &b) || !absl::SimpleAtoi(be.second, &e)) {
      std::fprintf(stderr, "dp-trainer: --skip-data: '%s' is not B:E\n",
                   std::string(r).c_str());
      return 2;
    }
    ro.skip_data.emplace_back(b, e);
  }
  absl::StatusOr<holdfast::RunResult> result = runtime.Run(step_fn, ro);
  if (!result.ok()) {
    const absl::Status& s = result.status();
    std::fprintf(stderr, "dp-trainer: %s\ndp-trainer: committed=%lld\n",
                 s.ToString().c_str(),
                 static_cast<long long>(runtime.committed_step()));
    if (s.code() == absl::StatusCode::kCancelled) return 0;  // unused standby
    if (s.code() == absl::StatusCode::kFailedPrecondition) return 3;
    if (s.code() == absl::StatusCode::kAborted) return 4;
    return 1;
  }
  // Loss on a fixed evaluation batch, for comparing runs (shrink mode).
  float eval = 0;
  for (int i = 0; i < 256; ++i)
    eval += Backprop(params.data(), MakeSample(0, 1000000 + i), nullptr);
  std::fprintf(stderr,
               "final_loss=%.6f recoveries=%zu productive_ms=%lld wall_ms=%lld "
               "snapshots=%lld skipped=%lld overlapped=%lld unfenced=%lld "
               "backups=%lld\n",
               eval / 256, result->recoveries.size(),
               static_cast<long long>(result->productive_ms),
               static_cast<long long>(result->wall_ms),
               static_cast<long long>(result->snapshots),
               static_cast<long long>(result->snapshots_skipped),
               static_cast<long long>(result->snapshots_overlapped),
               static_cast<long long>(result->snapshots_unfenced),
               static_cast<long long>(result->backups));
  if (!save.empty() && result->slot == 0) {
    const std::string tmp = save + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    bool ok = f != nullptr;
    for (const auto& [p, n] : state) ok = ok && std::fwrite(p, 1, n, f) == n;
    ok = f != nullptr && std::fclose(f) == 0 && ok;
    if (!ok || std::rename(tmp.c_str(), save.c_str()) != 0) {
      std::fprintf(stderr, "dp-trainer: --save %s failed\n", save.c_str());
      return 1;
    }
  }
  // The whole state (with --zero1, the momentum every slot gathered in
  // the last step).
  const std::string hash = holdfast_examples::Sha256Hex(
      {{params.data(), params.size() * sizeof(float)},
       {momentum.data(), momentum.size() * sizeof(float)},
       {table.data(), table.size()},
       {&data_pos, sizeof(data_pos)}});
  // Each part's own hash, so that a run whose hash differs shows which
  // part of the state went wrong.
  auto part = [](const void* data, size_t n) {
    return holdfast_examples::Sha256Hex({{data, n}}).substr(0, 16);
  };
  std::fprintf(stderr,
               "final parts params=%s momentum=%s table=%s data_pos=%lld\n",
               part(params.data(), params.size() * sizeof(float)).c_str(),
               part(momentum.data(), momentum.size() * sizeof(float)).c_str(),
               part(table.data(), table.size()).c_str(),
               static_cast<long long>(data_pos));
  std::printf("final step=%lld world=%d params_sha256=%s\n",
              static_cast<long long>(result->final_step), result->world_size,
              hash.c_str());
  std::fflush(stdout);
  return 0;
}
