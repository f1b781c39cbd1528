// The cost of the Gloo pairs' link handshake (src/backend/gloo/auth_link.h)
// against Gloo's own TCP device, measured in the same run: the time a group
// of `--ranks` (threads of this process, on loopback) takes to connect its
// full mesh, and the time of one all-reduce of `--mb` MiB once connected
// (the handshake only adds a check of each frame's header there). The two
// devices alternate, `--rounds` times; medians are reported, with the
// ratio auth / plain.
//
//   link_auth_bench [--ranks 4] [--mb 4] [--iters 20] [--rounds 5] [--json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "CLI/CLI.hpp"
#include "nlohmann/json.hpp"
#include "src/backend/gloo/auth_link.h"

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Sample {
  double connect_ms;    // the slowest rank's connectFullMesh
  double allreduce_ms;  // one all-reduce, the slowest rank's mean
};

// One group of `ranks` threads: connect, then `iters` all-reduces.
Sample Run(bool auth, int ranks, size_t floats, int iters,
           const std::string& prefix, gloo::rendezvous::HashStore& store) {
  std::vector<double> connect(static_cast<size_t>(ranks));
  std::vector<double> reduce(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";
      std::shared_ptr<gloo::transport::Device> dev =
          auth ? holdfast::backend::CreateAuthDevice(
                     attr, {1, "link_auth_bench's secret"})
               : gloo::transport::tcp::CreateDevice(attr);
      gloo::rendezvous::PrefixStore ps(prefix, store);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(r, ranks);
      const auto t0 = Clock::now();
      ctx->connectFullMesh(ps, dev);
      connect[static_cast<size_t>(r)] = Ms(Clock::now() - t0);
      std::vector<float> data(floats, 1.0f);
      const auto t1 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        gloo::AllreduceOptions opts(ctx);
        opts.setOutput(data.data(), data.size());
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(
                &gloo::sum<float>));
        gloo::allreduce(opts);
      }
      reduce[static_cast<size_t>(r)] = Ms(Clock::now() - t1) / iters;
    });
  }
  for (std::thread& t : threads) t.join();
  return {*std::max_element(connect.begin(), connect.end()),
          *std::max_element(reduce.begin(), reduce.end())};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Gloo link handshake cost: holdfast's device against Gloo's"};
  int ranks = 4, iters = 20, rounds = 5;
  double mb = 4;
  bool json = false;
  app.add_option("--ranks", ranks, "ranks (threads)")->check(CLI::Range(2, 64));
  app.add_option("--mb", mb, "MiB per all-reduce")
      ->check(CLI::Range(0.001, 1024.0));
  app.add_option("--iters", iters, "all-reduces per group")
      ->check(CLI::Range(1, 100000));
  app.add_option("--rounds", rounds, "groups per device")
      ->check(CLI::Range(1, 1000));
  app.add_flag("--json", json, "print JSON");
  CLI11_PARSE(app, argc, argv);
  const size_t floats = static_cast<size_t>(mb * (1 << 20) / sizeof(float));

  gloo::rendezvous::HashStore store;
  std::vector<double> connect[2], reduce[2];
  for (int round = 0; round < rounds; ++round) {
    for (int auth = 0; auth < 2; ++auth) {
      const Sample s =
          Run(auth == 1, ranks, floats, iters,
              "r" + std::to_string(round) + (auth ? "a" : "p"), store);
      connect[auth].push_back(s.connect_ms);
      reduce[auth].push_back(s.allreduce_ms);
    }
  }
  const double cp = Median(connect[0]), ca = Median(connect[1]);
  const double rp = Median(reduce[0]), ra = Median(reduce[1]);
  if (json) {
    nlohmann::json j = {{"ranks", ranks},
                        {"mb", mb},
                        {"rounds", rounds},
                        {"connect_ms_plain", cp},
                        {"connect_ms_auth", ca},
                        {"connect_ratio", ca / cp},
                        {"allreduce_ms_plain", rp},
                        {"allreduce_ms_auth", ra},
                        {"allreduce_ratio", ra / rp}};
    std::printf("%s\n", j.dump(1).c_str());
  } else {
    std::printf(
        "%d ranks, median of %d: connect %.2f ms with the handshake, %.2f ms "
        "without (%.2fx); all-reduce of %.3g MiB %.3f ms against %.3f ms "
        "(%.3fx)\n",
        ranks, rounds, ca, cp, ca / cp, mb, ra, rp, ra / rp);
  }
  return 0;
}
