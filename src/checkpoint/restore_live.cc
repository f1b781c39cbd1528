// Restore::FromLiveAhead, in a file of its own.
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "holdfast/status.h"
#include "src/checkpoint/pieces.h"
#include "src/checkpoint/restore.h"
#include "src/common/logging.h"
#include "src/common/thread_util.h"

namespace holdfast::checkpoint {
namespace {

// The words each member offers: its live step, the hash of its live state
// (0 unless that step is past the committed one), its layout, and its
// same-host words.
enum LiveWord {
  kLiveStep = 0,
  kLiveHash,
  kLiveLayout,
  kLiveHost,
  kLiveWords = kLiveHost + Restore::kHostWords
};

// Holder `h` of `holders` sends (or a receiver receives from it, or reads
// in place) the h-th of `holders` nearly equal runs of each buffer's
// blocks (StateRegistry::LiveBlock): blocks [first, first + count) of it.
struct Range {
  size_t first = 0;
  size_t count = 0;
};
Range Share(size_t blocks, size_t holders, size_t h) {
  const size_t base = blocks / holders, extra = blocks % holders;
  return {h * base + std::min(h, extra), base + (h < extra ? 1 : 0)};
}

// A receiver reads a holder's share in place in parts of this many
// blocks, spread over its threads, each block checksummed as it lands.
constexpr size_t kReadPartBlocks = 16;

}  // namespace

absl::StatusOr<Restore::LiveMoved> Restore::MoveLiveShares(
    const std::vector<int>& holders, const std::vector<int>& receivers,
    bool holder, const LiveReach& reach) {
  // Every receiver takes an equal share of every buffer from each holder,
  // all at once: it reads the shares of the holders it may read in place
  // (LiveReach), on its threads, while the others' arrive over the
  // communicator; then it checksums the blocks that arrived so.
  OpOptions oo;
  oo.tag = kRestoreTag;
  constexpr size_t kBlock = StateRegistry::kLiveBlock;
  std::vector<std::shared_ptr<Work>> works;
  std::vector<LiveRun> reads, arrivals;
  LiveMoved moved;
  const std::vector<StateBuffer>& buffers = state_->buffers();
  for (size_t b = 0; b < buffers.size(); ++b) {
    const StateBuffer& buf = buffers[b];
    const size_t blocks = (buf.global + kBlock - 1) / kBlock;
    for (size_t h = 0; h < holders.size(); ++h) {
      const Range r = Share(blocks, holders.size(), h);
      const int from = holders[h];
      if (r.count == 0) continue;
      const size_t first = r.first * kBlock;
      const size_t bytes =
          std::min(buf.global, (r.first + r.count) * kBlock) - first;
      if (!holder && reach.Reads(slot_, from)) {
        for (size_t i = 0; i < r.count; i += kReadPartBlocks) {
          reads.push_back(
              {from, b, r.first + i, std::min(kReadPartBlocks, r.count - i)});
        }
        moved.read_in_place += static_cast<int64_t>(bytes);
        continue;
      }
      if (!holder) arrivals.push_back({from, b, r.first, r.count});
      for (size_t off = 0; off < bytes; off += kChunkBytes) {
        const size_t n = std::min(kChunkBytes, bytes - off);
        uint8_t* p = buf.data + first + off;
        if (from == slot_) {
          for (int to : receivers) {
            if (reach.Reads(to, slot_)) continue;
            works.push_back(comm_->Send(p, n, DataType::kUInt8, to, oo));
          }
        } else if (!holder) {
          works.push_back(comm_->Recv(p, n, DataType::kUInt8, from, oo));
        }
      }
    }
    if (!holder) moved.received += static_cast<int64_t>(buf.global);
  }
  if (!holder) {
    moved.checksums.resize(state_->LiveBlocks().size());
    HOLDFAST_RETURN_IF_ERROR(LandLive(reads, arrivals, reach, &works, &moved));
  }
  for (const auto& w : works) HOLDFAST_RETURN_IF_ERROR(w->Wait());
  return moved;
}

absl::Status Restore::LandLive(const std::vector<LiveRun>& reads,
                               const std::vector<LiveRun>& arrivals,
                               const LiveReach& reach,
                               std::vector<std::shared_ptr<Work>>* works,
                               LiveMoved* moved) {
  constexpr size_t kBlock = StateRegistry::kLiveBlock;
  const std::vector<StateBuffer>& buffers = state_->buffers();
  std::vector<size_t> base(buffers.size());  // each buffer's first block
  for (size_t b = 0; b < buffers.size(); ++b) {
    base[b] = state_->FirstLiveBlock(b);
  }
  auto sum_run = [&](const LiveRun& run, bool read) -> absl::Status {
    const StateBuffer& buf = buffers[run.buffer];
    for (size_t k = run.first; k < run.first + run.count; ++k) {
      const size_t off = k * kBlock, n = std::min(kBlock, buf.global - off);
      if (read) {
        HOLDFAST_RETURN_IF_ERROR(io()->ReadLive(
            reach.step, reach.in_place.pids[static_cast<size_t>(run.from)],
            reach.Address(run.from, run.buffer) + off, buf.data + off, n));
      }
      moved->checksums[base[run.buffer] + k] =
          pieces::Checksum(buf.data + off, n);
    }
    return absl::OkStatus();
  };
  std::vector<absl::Status> read_out(reads.size());
  ForEachOnThreads(reads.size(), kRestoreThreads,
                   [&](size_t i) { read_out[i] = sum_run(reads[i], true); });
  // The communicator's works are waited for before any error is returned
  // (their buffers are the live state).
  for (const auto& w : *works) HOLDFAST_RETURN_IF_ERROR(w->Wait());
  works->clear();
  for (size_t i = 0; i < reads.size(); ++i) {
    if (!read_out[i].ok()) {
      return absl::UnavailableError(absl::StrCat(
          "restore: the live state could not be read from slot ", reads[i].from,
          " on this host: ", read_out[i].message()));
    }
  }
  ForEachOnThreads(arrivals.size(), kRestoreThreads,
                   [&](size_t i) { (void)sum_run(arrivals[i], false); });
  return absl::OkStatus();
}

absl::StatusOr<Restore::LiveReach> Restore::LiveReachOf(
    int64_t step, const std::vector<int64_t>& all,
    const std::vector<int>& holders, const std::vector<int>& receivers) {
  LiveReach reach;
  reach.step = step;
  HOLDFAST_ASSIGN_OR_RETURN(reach.in_place,
                            InPlaceReach(all, kLiveWords, kLiveHost));
  bool any = false;
  for (int r : receivers) {
    for (int h : holders) any = any || reach.in_place.reach.Has(r, h);
  }
  // Every member knows `any` alike: all exchange their buffers' addresses,
  // or none does.
  if (!any) {
    reach.in_place.reach = PieceSets{};
    return reach;
  }
  const std::vector<StateBuffer>& buffers = state_->buffers();
  reach.buffers = buffers.size();
  std::vector<int64_t> mine;
  for (const StateBuffer& b : buffers) {
    mine.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.data)));
  }
  reach.addresses.resize(reach.buffers * static_cast<size_t>(world_));
  if (reach.buffers > 0) {
    HOLDFAST_RETURN_IF_ERROR(comm_
                                 ->AllGather(mine.data(),
                                             reach.addresses.data(),
                                             reach.buffers, DataType::kInt64)
                                 ->Wait());
  }
  // The probe word is ordinary memory; the live buffers may not be (pinned
  // host copies of device memory, which the CUDA driver maps, may refuse
  // process_vm_readv). So a receiver reads the first and last bytes of
  // each buffer of each holder it reaches, and the members agree on who
  // reads whom from what worked (one all-gather); the rest go over the
  // communicator.
  std::vector<int64_t> readable = PieceSets::Mine(world_);
  const bool receiver =
      std::find(receivers.begin(), receivers.end(), slot_) != receivers.end();
  for (int h : holders) {
    if (!receiver || !reach.in_place.reach.Has(slot_, h)) continue;
    bool ok = true;
    for (size_t b = 0; b < buffers.size() && ok; ++b) {
      const size_t n = std::min<size_t>(8, buffers[b].global);
      if (n == 0) continue;
      uint8_t probe[8];
      const int64_t pid = reach.in_place.pids[static_cast<size_t>(h)];
      const uint64_t at = reach.Address(h, b);
      ok = io()->ReadLive(step, pid, at, probe, n).ok() &&
           io()->ReadLive(step, pid, at + buffers[b].global - n, probe, n).ok();
    }
    if (ok) PieceSets::Add(&readable, h);
  }
  HOLDFAST_ASSIGN_OR_RETURN(reach.in_place.reach,
                            PieceSets::Exchange(comm_, world_, readable));
  return reach;
}

absl::StatusOr<std::optional<Restored>> Restore::FromLiveAhead(
    int64_t committed) {
  if (!state_->ReplicatedOnly()) return std::nullopt;  // alike on every member
  int64_t mine[kLiveWords] = {progress_->live_step, 0,
                              static_cast<int64_t>(state_->LayoutHash())};
  FillHostWords(&mine[kLiveHost]);
  if (progress_->live_step > committed) {
    mine[kLiveHash] = static_cast<int64_t>(state_->LiveHash());
  }
  std::vector<int64_t> all(static_cast<size_t>(world_) * kLiveWords);
  HOLDFAST_RETURN_IF_ERROR(
      comm_->AllGather(mine, all.data(), kLiveWords, DataType::kInt64)->Wait());
  auto at = [&](int r, LiveWord w) {
    return all[static_cast<size_t>(r) * kLiveWords + w];
  };
  int64_t step = -1;
  for (int r = 0; r < world_; ++r) {
    // A layout that differs is FromMemory's to report.
    if (at(r, kLiveLayout) != mine[kLiveLayout]) return std::nullopt;
    step = std::max(step, at(r, kLiveStep));
  }
  if (step <= committed) return std::nullopt;
  std::vector<int> holders, receivers;
  for (int r = 0; r < world_; ++r) {
    if (at(r, kLiveStep) != step) {
      receivers.push_back(r);
    } else if (!holders.empty() &&
               at(r, kLiveHash) != at(holders[0], kLiveHash)) {
      HOLDFAST_LOG_WARN(
          "restore: slot {}: slots {} and {} hold step {} live with "
          "different hashes; restoring committed step {} instead",
          slot_, holders[0], r, step, committed);
      return std::nullopt;
    } else {
      holders.push_back(r);
    }
  }
  const uint64_t want = static_cast<uint64_t>(at(holders[0], kLiveHash));
  const bool holder = progress_->live_step == step;
  if (!holder) progress_->live_step = -1;  // until its copy has landed

  HOLDFAST_ASSIGN_OR_RETURN(const LiveReach reach,
                            LiveReachOf(step, all, holders, receivers));
  if (hooks_.before_transfers) hooks_.before_transfers();
  HOLDFAST_ASSIGN_OR_RETURN(const LiveMoved moved,
                            MoveLiveShares(holders, receivers, holder, reach));
  HOLDFAST_RETURN_IF_ERROR(ShareLedger(holders[0]));
  int64_t ok =
      holder || StateRegistry::CombineLive(moved.checksums) == want ? 1 : 0;
  std::vector<int64_t> oks(static_cast<size_t>(world_));
  HOLDFAST_RETURN_IF_ERROR(
      comm_->AllGather(&ok, oks.data(), 1, DataType::kInt64)->Wait());
  for (int r = 0; r < world_; ++r) {
    if (oks[static_cast<size_t>(r)] == 0) {
      HOLDFAST_LOG_WARN(
          "restore: slot {}: the live state of step {} arrived at slot {} "
          "with another hash; restoring committed step {} instead",
          slot_, step, r, committed);
      return std::nullopt;
    }
  }
  // No snapshot past the step goes on: the timeline goes on from it.
  snapshots_->AbandonAfter(step);
  HOLDFAST_LOG_INFO(
      "restore: slot {}: step {} goes on from the live state of slots {} "
      "(committed: {}){}",
      slot_, step, absl::StrJoin(holders, ", "), committed,
      holder ? ""
             : absl::StrCat("; received ", moved.received, " bytes, ",
                            moved.read_in_place, " of them read in place"));
  Restored out = LiveLanded(step, moved.received, !holder);
  out.bytes_read_in_place = moved.read_in_place;
  return std::optional<Restored>(out);
}

}  // namespace holdfast::checkpoint
