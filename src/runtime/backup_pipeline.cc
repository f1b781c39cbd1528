#include "src/runtime/backup_pipeline.h"

#include <optional>
#include <string>

#include "src/checkpoint/pieces.h"
#include "src/common/logging.h"

namespace holdfast {

using checkpoint::Piece;

void BackupPipeline::Start() {
  thread_ = std::thread([this] { Loop(); });
}

checkpoint::BackupHooks BackupPipeline::Hooks() {
  checkpoint::BackupHooks h;
  h.ack = [this](int64_t step, int64_t gen) { member_->AckStep(step, gen); };
  h.await_decided = [this](int64_t step, int64_t gen, absl::Time deadline) {
    return member_->AwaitRoundEnd(step, gen, deadline);
  };
  h.committed = [this] { return member_->committed_step(); };
  h.io = io_;
  h.after_commit = [this](Piece* own) { AfterCommit(own); };
  return h;
}

void BackupPipeline::Loop() {
  const checkpoint::BackupHooks hooks = Hooks();
  for (;;) {
    const std::optional<int64_t> gen = snapshots_->AwaitQueued();
    if (!gen.has_value()) return;
    absl::StatusOr<SideChannel> side = member_->Side(*gen);
    const checkpoint::Snapshots::Taken taken =
        snapshots_->TakeQueued(*gen, side.ok());
    if (snapshots_->stopping()) return;
    if (!taken.found) continue;  // a restore dropped it
    if (!side.ok()) {            // the piece was dropped
      member_->SideFailed(side.status(), *gen);
      continue;
    }
    Piece* own = taken.piece;
    // (A piece offered again was copied in its first round.)
    if (own->deferred && !own->copied) snapshots_->CopyIn(own);
    checkpoint::RoundResult round;
    round.clock.start = absl::Now();  // the round proper, after any copy
    absl::StatusOr<bool> committed =
        checkpoint::BackupRound(own, side->comm.get(), side->links.get(),
                                snapshots_, *state_, hooks, &round);
    snapshots_->EndRound(own, committed.ok() && *committed, round.clock,
                         round.moved, round.transfer_us, round.again);
    if (!committed.ok()) member_->SideFailed(committed.status(), *gen);
  }
}

void BackupPipeline::AfterCommit(Piece* own) {
  const int64_t s = own->step;
  if (own->size > 0 &&
      faults_->FiresAt(fault::Kind::kCorruptPiece, own->slot, s)) {
    own->bytes[own->size / 2] ^= 0x5a;
    HOLDFAST_LOG_WARN(
        "runtime: corrupted slot {}'s own copy of its piece of step {} "
        "(injected)",
        own->slot, s);
  }
  if (!options_.checkpoint_dir.empty() &&
      s / options_.checkpoint_every >
          last_disk_step_ / options_.checkpoint_every) {
    WriteToDisk(*own);
    last_disk_step_ = s;
  }
}

void BackupPipeline::WriteToDisk(const Piece& own) {
  pieces::PieceHeader h;
  h.step = own.step;
  h.layout_generation = own.layout_generation;
  h.world = own.world;
  h.slot = own.slot;
  h.layout_hash = state_->LayoutHash();
  h.bytes = own.size;
  h.checksum = own.checksum;
  h.ledger = own.ledger;
  absl::Status s =
      pieces::WritePiece(options_.checkpoint_dir, h, own.bytes.get());
  if (!s.ok()) {
    HOLDFAST_LOG_ERROR("runtime: disk tier: {}", std::string(s.message()));
    return;
  }
  snapshots_->NoteDiskWrite();
  // Keep the newest three step directories (one may be incomplete).
  if (own.slot == 0) pieces::Prune(options_.checkpoint_dir, 3);
}

}  // namespace holdfast
