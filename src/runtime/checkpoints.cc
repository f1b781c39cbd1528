#include "src/runtime/runtime_impl.h"

#include <algorithm>
#include <vector>

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
  HOLDFAST_ASSIGN_OR_RETURN(Communicator * comm, gens_.HostComm());
  const View v = gens_.Current();
  snapshots_.Quiesce();
  // The live state is read (and written) next: no copy into it may still
  // be under way (RunOptions::state_ready).
  HOLDFAST_RETURN_IF_ERROR(state_.AwaitReady());
  ++restores_;
  // A rollback restores its step, whatever newer commit this member heard
  // of before it (every member caps alike).
  int64_t committed = committed_step();
  // When no member has a committed step, the first generation failed
  // before its starting state was committed: none has trained, so every
  // member starts afresh (all of them take this branch alike).
  std::vector<int64_t> all(static_cast<size_t>(v.world));
  HOLDFAST_RETURN_IF_ERROR(
      comm->AllGather(&committed, all.data(), 1, DataType::kInt64)->Wait());
  if (*std::max_element(all.begin(), all.end()) < 0) {
    HOLDFAST_LOG_WARN(
        "runtime: slot {}: no member has a committed step (a generation "
        "before {} failed before its start was committed): starting afresh",
        v.slot, v.generation);
    return FreshStart(v, start_step_);
  }
  if (v.rollback_to >= 0) committed = std::min(committed, v.rollback_to);
  std::optional<checkpoint::Restored> ahead;
  if (options_.live_restore && v.rollback_to < 0) {
    HOLDFAST_ASSIGN_OR_RETURN(ahead,
                              NewRestore(comm, v).FromLiveAhead(committed));
  }
  HOLDFAST_ASSIGN_OR_RETURN(const checkpoint::Restored r,
                            ahead.has_value()
                                ? absl::StatusOr<checkpoint::Restored>(*ahead)
                                : NewRestore(comm, v).FromMemory(committed));
  if (v.rollback_to >= 0) {
    gens_.SetCommitted(r.step);
    // The disk tier's steps after it belong to the abandoned timeline: a
    // resume must not read them, and the steps redone are written anew.
    backups_->CapDiskStep(r.step);
    if (!options_.checkpoint_dir.empty() && v.slot == 0) {
      pieces::RemoveAfter(options_.checkpoint_dir, r.step);
    }
  }
  NoteRestored(r, rec);
  return r.step;
}

void RuntimeImpl::NoteRestored(const checkpoint::Restored& r,
                               RecoveryRecord* rec) {
  if (r.from_disk) backups_->NoteDiskStep(r.step);
  if (rec == nullptr) return;
  rec->bytes_received = r.bytes_received;
  rec->bytes_read_in_place = r.bytes_read_in_place;
  rec->received_state = r.received_state;
  rec->from_disk = r.from_disk;
}

void RuntimeImpl::AckStep(int64_t step, int64_t gen) {
  member_->SendCheckpointAck(step, gen);
}

absl::StatusOr<RuntimeImpl::SideChannel> RuntimeImpl::Side(int64_t gen) {
  return gens_.Side(gen);
}

void RuntimeImpl::SideFailed(const absl::Status& why, int64_t gen) {
  // At the end of the run peers leave as they finish: no failure.
  if (snapshots_.stopping() || finishing_ || !gens_.CommHealth().ok()) return;
  if (gens_.AwaitGeneration(gen, absl::Now() + options_.report_grace)) return;
  if (snapshots_.stopping() || finishing_ || !gens_.CommHealth().ok()) return;
  HOLDFAST_LOG_WARN(
      "runtime: the side communicator of generation {} "
      "failed: {}",
      gen, std::string(why.message()));
  recovery_->ReportBroken(absl::StrCat("side communicator: ", why.message()),
                          -1, gen);
}

}  // namespace holdfast
