#include "src/common/thread_util.h"

#include <algorithm>
#include <atomic>

namespace holdfast {

void ForEachOnThreads(size_t count, size_t most,
                      const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < count;) fn(i);
  };
  const size_t n = std::min<size_t>(
      {count, most, std::max(1u, std::thread::hardware_concurrency())});
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n; ++t) {
    absl::StatusOr<std::thread> started = StartThread("a worker", worker);
    if (!started.ok()) break;  // the others do its part
    threads.push_back(std::move(*started));
  }
  worker();
  for (std::thread& t : threads) t.join();
}

absl::Status RunJobs(
    absl::string_view what,
    const std::vector<std::function<absl::Status()>>& jobs,
    const std::function<void(absl::string_view)>& end_started) {
  if (jobs.empty()) return absl::OkStatus();
  std::vector<absl::Status> out(jobs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i + 1 < jobs.size(); ++i) {
    absl::StatusOr<std::thread> t = StartThread(
        absl::StrCat("a thread for ", what), [&, i] { out[i] = jobs[i](); });
    if (!t.ok()) {
      end_started(t.status().message());
      for (std::thread& started : threads) started.join();
      return t.status();
    }
    threads.push_back(std::move(*t));
  }
  out.back() = jobs.back()();
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : out) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace holdfast
