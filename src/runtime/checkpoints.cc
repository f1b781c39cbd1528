#include "src/runtime/runtime_impl.h"

#include "absl/strings/str_cat.h"
#include "holdfast/status.h"
#include "src/checkpoint/pieces.h"
#include "src/common/logging.h"
#include "src/fault/hooks.h"

namespace holdfast {

checkpoint::Restore RuntimeImpl::NewRestore(Communicator* comm, const View& v) {
  checkpoint::RestoreOptions o;
  o.replicas = options_.replicas;
  o.checkpoint_dir = options_.checkpoint_dir;
  o.read_in_place = options_.same_host_restore;
  o.probe_word = &probe_word_;
  checkpoint::RestoreHooks hooks;
  const int slot = v.slot;
  const int restores = restores_;
  std::shared_ptr<fault::Hooks> faults = faults_;
  hooks.before_transfers = [faults, slot, restores] {
    faults->AtRestore(slot, restores);
  };
  hooks.io = &piece_io_;
  return checkpoint::Restore(comm, v.world, v.slot, &state_, &snapshots_,
                             &progress_, std::move(o), std::move(hooks));
}

absl::StatusOr<int64_t> RuntimeImpl::Restore(RecoveryRecord* rec) {
  HOLDFAST_ASSIGN_OR_RETURN(Communicator * comm, HostComm());
  const View v = CurrentView();
  snapshots_.Quiesce();
  ++restores_;
  // A rollback restores its step, whatever newer commit this member heard
  // of before it (every member caps alike).
  int64_t committed = committed_step();
  if (v.rollback_to >= 0) committed = std::min(committed, v.rollback_to);
  HOLDFAST_ASSIGN_OR_RETURN(const checkpoint::Restored r,
                            NewRestore(comm, v).FromMemory(committed));
  if (v.rollback_to >= 0) {
    {
      absl::MutexLock lock(&mu_);
      committed_ = r.step;
    }
    // The disk tier's steps after it belong to the abandoned timeline: a
    // resume must not read them, and the steps redone are written anew.
    if (last_disk_step_ > r.step) last_disk_step_ = r.step;
    if (!options_.checkpoint_dir.empty() && v.slot == 0) {
      pieces::RemoveAfter(options_.checkpoint_dir, r.step);
    }
  }
  NoteRestored(r, rec);
  return r.step;
}

void RuntimeImpl::NoteRestored(const checkpoint::Restored& r,
                               RecoveryRecord* rec) {
  if (r.from_disk) last_disk_step_ = r.step;
  if (rec == nullptr) return;
  rec->bytes_received = r.bytes_received;
  rec->bytes_read_in_place = r.bytes_read_in_place;
  rec->received_state = r.received_state;
  rec->from_disk = r.from_disk;
}

void RuntimeImpl::BackupLoop() {
  for (;;) {
    const std::optional<int64_t> gen = snapshots_.AwaitQueued();
    if (!gen.has_value()) return;
    absl::StatusOr<SideChannel> side = Side(*gen);
    const checkpoint::Snapshots::Taken taken =
        snapshots_.TakeQueued(*gen, side.ok());
    if (snapshots_.stopping()) return;
    if (!taken.found) continue;  // a restore dropped it
    if (!side.ok()) {            // the piece was dropped
      SideFailed(side.status(), *gen);
      continue;
    }
    Piece* own = taken.piece;
    // (A piece offered again was copied in its first round.)
    if (own->deferred && !own->copied) snapshots_.CopyIn(own);
    checkpoint::RoundResult round;
    round.clock.start = absl::Now();  // the round proper, after any copy
    absl::StatusOr<bool> committed =
        checkpoint::BackupRound(own, side->comm.get(), side->links.get(),
                                &snapshots_, state_, backup_hooks_, &round);
    snapshots_.EndRound(own, committed.ok() && *committed, round.clock,
                        round.moved, round.transfer_us, round.again);
    if (!committed.ok()) SideFailed(committed.status(), *gen);
  }
}

checkpoint::BackupHooks RuntimeImpl::NewBackupHooks() {
  checkpoint::BackupHooks h;
  h.ack = [this](int64_t step, int64_t gen) {
    member_->SendCheckpointAck(step, gen);
  };
  h.await_decided = [this](int64_t step, int64_t gen, absl::Time deadline) {
    return AwaitRoundEnd(step, gen, deadline);
  };
  h.committed = [this] { return committed_step(); };
  h.io = &piece_io_;
  h.after_commit = [this](Piece* own) { AfterCommit(own); };
  return h;
}

void RuntimeImpl::AfterCommit(Piece* own) {
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

void RuntimeImpl::WriteToDisk(const Piece& own) {
  pieces::PieceHeader h;
  h.step = own.step;
  h.layout_generation = own.layout_generation;
  h.world = own.world;
  h.slot = own.slot;
  h.layout_hash = state_.LayoutHash();
  h.bytes = own.size;
  h.checksum = own.checksum;
  h.ledger = own.ledger;
  absl::Status s =
      pieces::WritePiece(options_.checkpoint_dir, h, own.bytes.get());
  if (!s.ok()) {
    HOLDFAST_LOG_ERROR("runtime: disk tier: {}", std::string(s.message()));
    return;
  }
  snapshots_.NoteDiskWrite();
  // Keep the newest three step directories (one may be incomplete).
  if (own.slot == 0) pieces::Prune(options_.checkpoint_dir, 3);
}

}  // namespace holdfast
