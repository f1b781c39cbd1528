// A backup round: every slot of a generation copies its snapshot's piece
// to its buddies over the backup links, and acks the step to the
// controller, which commits it once every slot acked (docs/checkpoint.md).
//
// The backup thread runs one round at a time; every slot of the
// generation runs the same rounds in the same order (their agreements on
// the side communicator pair up).
#ifndef HOLDFAST_SRC_CHECKPOINT_BACKUP_H_
#define HOLDFAST_SRC_CHECKPOINT_BACKUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "holdfast/communicator.h"
#include "src/checkpoint/bulk.h"
#include "src/checkpoint/piece_io.h"
#include "src/checkpoint/pieces.h"
#include "src/checkpoint/snapshots.h"
#include "src/checkpoint/state.h"

namespace holdfast::checkpoint {

// What a round needs from the member it runs in. Each is called on the
// backup thread.
struct BackupHooks {
  // Acks `step` of `generation` to the controller.
  std::function<void(int64_t step, int64_t generation)> ack;
  // Waits until `step` of `generation` is committed, or cannot be (a newer
  // generation, the member fenced, the job over, the pipeline stopping),
  // or until `deadline`; whether one of those came first.
  std::function<bool(int64_t step, int64_t generation, absl::Time deadline)>
      await_decided;
  // The newest committed step this member knows of.
  std::function<int64_t()> committed;
  // Called with this member's piece once its step committed (the disk
  // tier; a test's damage to the piece).
  std::function<void(Piece* own)> after_commit;
  // The I/O of the copies this member receives (not null; outlives the
  // rounds).
  PieceIo* io = nullptr;
};

struct RoundResult {
  bool again = false;       // offer this snapshot again (see BackupRound)
  int64_t moved = 0;        // bytes sent and received, once acked
  int64_t transfer_us = 0;  // in the sends and receives, once acked
  RoundClock clock;         // clock.start set by the caller
};

// Backs up `own` (this member's queued snapshot, taken from `snapshots`):
// every slot agrees on the step, sends its piece to its buddies on
// `links` and receives the pieces it is a buddy for, checks them, and
// acks the step if its own part succeeded; with checks on arrival, or
// when any slot's piece was copied during a step, the slots then share
// their verdicts on `side`, so none waits for a commit that a damaged or
// unfenced copy elsewhere stopped. True once the step commits. When the
// slots offered different steps nothing moves, and `out->again` says
// this slot's step was the newest: its piece is kept, to be offered again
// (the others drop theirs and offer the snapshot of that step next). A
// piece whose round failed before its ack is dropped. An error is a
// failure of the side communicator or the links.
absl::StatusOr<bool> BackupRound(Piece* own, Communicator* side,
                                 bulk::Links* links, Snapshots* snapshots,
                                 const StateRegistry& state,
                                 const BackupHooks& hooks, RoundResult* out);

}  // namespace holdfast::checkpoint

#endif  // HOLDFAST_SRC_CHECKPOINT_BACKUP_H_
