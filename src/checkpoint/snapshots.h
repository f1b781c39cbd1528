// The snapshot pipeline: the pieces one member holds (its own snapshots,
// its buddies' copies, pieces received in a restore), their buffer pool,
// and the hand-over of its own snapshots from the training thread to the
// backup thread (docs/checkpoint.md).
//
// A snapshot of this member's own goes through these states:
//   queued    Queue() listed it; the backup thread has not taken it.
//             Its bytes are copied already, unless it is deferred.
//   deferred  (with queued or in a round) its bytes are copied during the
//             next step: by the backup thread (CopyIn) or, if that has
//             not started when the trainer calls BeginStateUpdate(), by
//             the trainer itself. Validated when BeginStateUpdate() came
//             after the copy; invalid when the step wrote without it, or
//             a restore began.
//   in round  the backup thread took it (TakeQueued) and backs it up;
//             idle_round() while the round moves no bytes; at its gate
//             while a deferred copy waits for its verdict.
//   held      listed after its round (acked, committed, or offered again
//             by re-queueing it), until Evict/Drop removes it.
//
// Thread-safety: all methods may be called from any thread. A piece's
// bytes are touched without the lock by one thread at a time: the
// training thread while it fills a piece (before listing it) and during a
// restore (Quiesce() has made the backup thread idle), the backup thread
// during a round.
#ifndef HOLDFAST_SRC_CHECKPOINT_SNAPSHOTS_H_
#define HOLDFAST_SRC_CHECKPOINT_SNAPSHOTS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "holdfast/state.h"
#include "holdfast/testing/backup_stats.h"
#include "src/checkpoint/state.h"

namespace holdfast::checkpoint {

// One slot's piece of one snapshot (its own, a buddy's copy, or one
// received during a restore).
struct Piece {
  int64_t step = -1;
  int64_t layout_generation = 0;  // the generation whose world cut it
  int world = 0;
  int slot = 0;  // whose partition, in that world
  uint64_t checksum = 0;
  bool own = false;
  size_t size = 0;
  std::unique_ptr<uint8_t[]> bytes;
  pieces::Ledger ledger{};  // the owner's, when the snapshot was taken
  // A deferred snapshot's flags (see the states above), guarded by the
  // pipeline's lock.
  bool deferred = false;
  bool copied = false;
  bool validated = false;
  bool invalid = false;
};

// When a backup round's milestones came, for BackupStats.
struct RoundClock {
  absl::Time start = absl::InfinitePast();  // after any deferred copy
  absl::Time acked = absl::InfinitePast();  // this member acked the step
  absl::Time seen = absl::InfinitePast();   // it first saw the commit
  absl::Duration gated;                     // at the gate of a deferred copy
};

// Where a generation's copies go: buddies[o] are the slots that keep
// copies of slot o's piece; `verify` says they check them on arrival.
struct BackupPlacement {
  int64_t generation = -1;
  std::vector<std::vector<int>> buddies;
  bool verify = true;
};

class Snapshots {
 public:
  // `state` outlives the pipeline; its pieces are cut from it.
  explicit Snapshots(StateRegistry* state) : state_(state) {}
  Snapshots(const Snapshots&) = delete;
  Snapshots& operator=(const Snapshots&) = delete;

  // ---- Pieces (any thread) ----

  // A new piece, its bytes from the pool and not filled in.
  std::unique_ptr<Piece> NewPiece(int64_t step, int64_t generation, int world,
                                  int slot, uint64_t checksum);
  // Lists a piece.
  void Add(std::unique_ptr<Piece> p);
  // Removes the listed pieces matching `drop` (their buffers go back to
  // the pool, which keeps a few of each size).
  void Evict(const std::function<bool(const Piece&)>& drop);
  void Drop(const Piece* p);
  // How many committed steps keep their pieces (>= 1; default 1): a
  // rollback past a numeric anomaly restores an older one.
  void SetKeep(int keep);
  // `step` committed: the pieces of older steps go, except those of the
  // newest `keep` committed steps.
  void Committed(int64_t step);
  // A restore of `target`: the pieces of newer steps (an abandoned
  // timeline) go, and so do the newer commits.
  void AbandonAfter(int64_t target);
  // The committed steps whose pieces are kept, newest first.
  std::vector<int64_t> kept_commits() const;
  // The listed pieces of `step`, and how many pieces are listed.
  std::vector<Piece*> At(int64_t step) const;
  size_t count() const;

  // ---- The training thread ----

  // Whether a snapshot now would wait behind the previous one, which is
  // still being backed up and moving bytes (then it is skipped rather than
  // stalling training). `committed`: the newest committed step.
  bool Busy(int64_t committed) const;
  // Queues this member's snapshot `p` for the backup thread; `defer`: its
  // bytes are copied during the next step. Else they are copied here, and
  // a failure to read the live state (StateRegistry::AwaitReady) is
  // returned, with nothing queued.
  absl::Status Queue(std::unique_ptr<Piece> p, bool defer);
  // Runtime::BeginStateUpdate(): waits for a deferred copy under way, or
  // makes one not yet started.
  void BeginStateUpdate();
  // Runtime::ReportEarlyWrite().
  void ReportEarlyWrite(absl::string_view what);
  // Before a step: forgets an earlier BeginStateUpdate() or
  // ReportEarlyWrite(). After it: whether the step called the first, and
  // what it reported with the second (in `early`; empty if nothing).
  bool TakeFenceSeen(std::string* early = nullptr);
  // At a step's end: drops a deferred snapshot still waiting for
  // BeginStateUpdate() (it may have been written under); whether there
  // was one.
  bool DropUnfenced();
  // Before a restore (the caller aborted the side communicator): drops a
  // queued snapshot, marks a deferred one invalid, and waits until the
  // backup thread is out of any round.
  void Quiesce();
  // Waits until nothing is queued and no round is under way, or until
  // `deadline`; whether that is so.
  bool AwaitIdle(absl::Time deadline) const;
  int64_t overlapped() const;  // deferred snapshots validated

  // ---- The backup thread ----

  // Waits until a snapshot is queued (its generation) or the pipeline
  // stops (nullopt).
  std::optional<int64_t> AwaitQueued();
  struct Taken {
    bool found = false;      // a snapshot of that generation was queued
    Piece* piece = nullptr;  // it, when it goes into a round
  };
  // Takes the queued snapshot of generation `gen` into a round, or drops
  // it when `run` is false.
  Taken TakeQueued(int64_t gen, bool run);
  // Copies a deferred piece's bytes in, hashing them on the way; one whose
  // live state could not be read (StateRegistry::AwaitReady) is marked
  // invalid, so its round drops it.
  void CopyIn(Piece* p);
  void SetIdleRound(bool on);
  // Waits at the gate of a deferred round until its copy is validated or
  // invalid, the pipeline stops, or rounds of generation `gen` are ended
  // (EndGeneration); whether it was validated.
  bool AwaitValidated(Piece* own, int64_t gen);
  // The end of a round of `own` (nullptr: none ran). `moved` bytes in
  // `transfer_us` (0 unless the round got past its verdict); `committed`,
  // with `clock`: the round committed; `again`: `own` is queued again,
  // unless it was dropped meanwhile.
  void EndRound(Piece* own, bool committed, const RoundClock& clock,
                int64_t moved, int64_t transfer_us, bool again);
  void NoteDiskWrite();

  // ---- Placement (set when a generation's side communicator is built) --
  void SetPlacement(BackupPlacement p);
  BackupPlacement placement() const;

  // ---- Ending ----

  // Ends the waits of rounds of generations < `gen` (a newer generation
  // opened; INT64_MAX: this member goes on in none).
  void EndGeneration(int64_t gen);
  // Stops the pipeline: the backup thread leaves its loop. Whether a
  // round was under way (its communicator must be aborted to free it).
  bool Stop();
  bool stopping() const { return stop_.load(); }

  testing::BackupStats stats() const;

 private:
  void EvictLocked(const std::function<bool(const Piece&)>& drop)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropLocked(const Piece* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::unique_ptr<uint8_t[]> Acquire(size_t size);

  StateRegistry* const state_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Piece>> pieces_ ABSL_GUARDED_BY(mu_);
  int keep_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<int64_t> commits_ ABSL_GUARDED_BY(mu_);  // newest first
  std::multimap<size_t, std::unique_ptr<uint8_t[]>> pool_ ABSL_GUARDED_BY(mu_);
  Piece* queued_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The deferred snapshot awaiting BeginStateUpdate(), and the one whose
  // round waits at its gate for it.
  Piece* deferred_ ABSL_GUARDED_BY(mu_) = nullptr;
  Piece* gate_ ABSL_GUARDED_BY(mu_) = nullptr;
  // BeginStateUpdate() was called (in the step under way).
  bool fence_seen_ ABSL_GUARDED_BY(mu_) = false;
  // ReportEarlyWrite() in this step: what was written before the fence.
  std::optional<std::string> early_write_ ABSL_GUARDED_BY(mu_);
  int64_t overlapped_ ABSL_GUARDED_BY(mu_) = 0;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  // The round under way moves no bytes now: it waits in its agreement
  // (for the slots still to snapshot), or it acked and waits for the
  // commit (or the verdict).
  bool idle_round_ ABSL_GUARDED_BY(mu_) = false;
  int64_t round_step_ ABSL_GUARDED_BY(mu_) = -1;  // while busy_
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  // Rounds of generations below this one wait for nothing.
  int64_t live_generation_ ABSL_GUARDED_BY(mu_) = 0;
  BackupPlacement placement_ ABSL_GUARDED_BY(mu_);
  testing::BackupStats stats_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
};

}  // namespace holdfast::checkpoint

#endif  // HOLDFAST_SRC_CHECKPOINT_SNAPSHOTS_H_
