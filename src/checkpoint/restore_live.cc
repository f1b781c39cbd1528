// Restore::FromLiveAhead, in a file of its own.
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "holdfast/status.h"
#include "src/checkpoint/restore.h"
#include "src/common/logging.h"

namespace holdfast::checkpoint {
namespace {

// The words each member offers: its live step, the hash of its live state
// (0 unless that step is past the committed one) and its layout.
enum LiveWord { kLiveStep = 0, kLiveHash, kLiveLayout, kLiveWords };

// Holder `h` of `holders` sends (or a receiver receives from it) the h-th
// of `holders` nearly equal ranges of each buffer: [first, first + bytes).
struct Range {
  size_t first = 0;
  size_t bytes = 0;
};
Range Share(size_t total, size_t holders, size_t h) {
  const size_t base = total / holders, extra = total % holders;
  return {h * base + std::min(h, extra), base + (h < extra ? 1 : 0)};
}

}  // namespace

absl::StatusOr<int64_t> Restore::MoveLiveShares(
    const std::vector<int>& holders, const std::vector<int>& receivers,
    bool holder) {
  // Every receiver takes an equal share of every buffer from each holder,
  // all at once.
  OpOptions oo;
  oo.tag = kRestoreTag;
  std::vector<std::shared_ptr<Work>> works;
  int64_t received = 0;
  for (const StateBuffer& b : state_->buffers()) {
    for (size_t h = 0; h < holders.size(); ++h) {
      const Range r = Share(b.global, holders.size(), h);
      for (size_t off = 0; off < r.bytes; off += kChunkBytes) {
        const size_t n = std::min(kChunkBytes, r.bytes - off);
        uint8_t* p = b.data + r.first + off;
        if (holders[h] == slot_) {
          for (int to : receivers) {
            works.push_back(comm_->Send(p, n, DataType::kUInt8, to, oo));
          }
        } else if (!holder) {
          works.push_back(comm_->Recv(p, n, DataType::kUInt8, holders[h], oo));
          received += static_cast<int64_t>(n);
        }
      }
    }
  }
  for (const auto& w : works) HOLDFAST_RETURN_IF_ERROR(w->Wait());
  return received;
}

absl::StatusOr<std::optional<Restored>> Restore::FromLiveAhead(
    int64_t committed) {
  if (!state_->ReplicatedOnly()) return std::nullopt;  // alike on every member
  int64_t mine[kLiveWords] = {progress_->live_step, 0,
                              static_cast<int64_t>(state_->LayoutHash())};
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

  if (hooks_.before_transfers) hooks_.before_transfers();
  HOLDFAST_ASSIGN_OR_RETURN(const int64_t received,
                            MoveLiveShares(holders, receivers, holder));
  HOLDFAST_RETURN_IF_ERROR(ShareLedger(holders[0]));
  int64_t ok = holder || state_->LiveHash() == want ? 1 : 0;
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
      holder ? "" : absl::StrCat("; received ", received, " bytes"));
  return std::optional<Restored>(LiveLanded(step, received, !holder));
}

}  // namespace holdfast::checkpoint
