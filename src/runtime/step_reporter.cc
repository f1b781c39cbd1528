#include "src/runtime/step_reporter.h"

#include <algorithm>
#include <memory>

#include "absl/time/clock.h"
#include "holdfast/clock.h"
#include "holdfast/communicator.h"
#include "holdfast/types.h"

namespace holdfast {

CollectiveTimes TimeCollectives(
    const std::vector<TraceRecord>& trace, uint64_t from, int64_t step_start_ns,
    const std::function<int64_t(int64_t, int64_t)>& paused) {
  int64_t inside_ns = 0, arrival_ns = 0, issued = 0;
  CollectiveTimes out;
  out.next_seq = from;
  for (const TraceRecord& r : trace) {
    if (r.seq < from || !IsCollective(r.op) || r.state != OpState::kCompleted ||
        r.started_ns <= 0) {
      continue;
    }
    int64_t inside = std::max<int64_t>(0, r.ended_ns - r.started_ns);
    if (paused && inside > 0) {
      inside -= std::min(inside, paused(r.started_ns, r.ended_ns));
    }
    inside_ns += inside;
    out.next_seq = std::max(out.next_seq, r.seq + 1);
    if (r.enqueued_ns >= step_start_ns) {
      arrival_ns += r.enqueued_ns - step_start_ns;
      ++issued;
    }
  }
  out.inside = absl::Nanoseconds(inside_ns);
  out.arrival = absl::Nanoseconds(issued > 0 ? arrival_ns / issued : 0);
  return out;
}

int64_t CollectiveInside(const std::vector<TraceRecord>& trace) {
  for (auto it = trace.rbegin(); it != trace.rend(); ++it) {
    if (!IsCollective(it->op) || it->state == OpState::kEnqueued) continue;
    return it->state == OpState::kStarted ? it->coll_seq : -1;
  }
  return -1;
}

std::vector<std::pair<int, int64_t>> MostRetransmits(
    const std::vector<int64_t>& all, size_t most) {
  std::vector<std::pair<int, int64_t>> counts;
  for (size_t j = 0; j < all.size(); ++j) {
    if (all[j] > 0) counts.emplace_back(static_cast<int>(j), all[j]);
  }
  if (counts.size() > most) {
    std::partial_sort(
        counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(most),
        counts.end(),
        [](const auto& a, const auto& b) { return a.second > b.second; });
    counts.resize(most);
  }
  return counts;
}

int64_t CollectiveInProgress(const GenerationView& gens) {
  const std::shared_ptr<Communicator> comm = gens.SharedComm();
  return comm == nullptr ? -1 : CollectiveInside(comm->TraceSnapshot());
}

void StepReporter::Report(int64_t step, absl::Time t0, absl::Time t1,
                          const std::map<std::string, double>& metrics) {
  // The step's start on the communicator's clock (CLOCK_MONOTONIC).
  const int64_t start_ns =
      MonotonicNanos() - absl::ToInt64Nanoseconds(absl::Now() - t0);
  CollectiveTimes c;
  const std::shared_ptr<Communicator> comm = gens_->SharedComm();
  if (comm != nullptr) {
    if (comm->generation() != timed_generation_) {
      timed_generation_ = comm->generation();
      timed_seq_ = 0;
    }
    std::function<int64_t(int64_t, int64_t)> paused;
    if (pauses_ != nullptr) {
      paused = [this](int64_t from, int64_t to) {
        return pauses_->PausedNs(from, to);
      };
    }
    c = TimeCollectives(comm->TraceSnapshot(), timed_seq_, start_ns, paused);
    timed_seq_ = c.next_seq;
  }
  // A syscall per peer: a few times a second is enough for a rate.
  constexpr absl::Duration kEvery = absl::Milliseconds(200);
  constexpr size_t kMost = 16;
  if (t1 - retransmits_at_ >= kEvery) {
    retransmits_at_ = t1;
    if (comm != nullptr) {
      client_->NoteRetransmits(comm->generation(),
                               MostRetransmits(comm->PeerRetransmits(), kMost));
    }
  }
  (void)client_->ReportStep(step, t1 - t0, metrics, c.inside, c.arrival);
}

}  // namespace holdfast
