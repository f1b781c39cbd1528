// Uses an installed holdfast: three ranks in threads of this process sum
// their rank numbers with an AllReduce over a memory store, and a Runtime's
// options are built (the runtime itself needs a controller).
#include <cstdio>
#include <thread>
#include <vector>

#include "holdfast/communicator.h"
#include "holdfast/runtime.h"
#include "holdfast/store.h"
#include "holdfast/version.h"

int main() {
  constexpr int kWorld = 3;
  std::shared_ptr<holdfast::Store> store = holdfast::NewMemoryStore();
  std::vector<double> sums(kWorld, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      holdfast::CommunicatorOptions options;
      options.rank = r;
      options.size = kWorld;
      auto comm = holdfast::Communicator::Create(store, options);
      if (!comm.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", r,
                     comm.status().ToString().c_str());
        return;
      }
      double x = r;
      absl::Status s = (*comm)
                           ->AllReduce(&x, 1, holdfast::DataType::kFloat64,
                                       holdfast::ReduceOp::kSum)
                           ->Wait();
      if (s.ok()) sums[static_cast<size_t>(r)] = x;
    });
  }
  for (std::thread& t : ranks) t.join();
  holdfast::RuntimeOptions runtime_options;
  (void)runtime_options;
  std::printf("holdfast %s: sums %g %g %g\n", HOLDFAST_VERSION_STRING, sums[0],
              sums[1], sums[2]);
  for (double s : sums) {
    if (s != 0 + 1 + 2) return 1;
  }
  return 0;
}
