#include "src/runtime/fault_io.h"

#include "src/common/logging.h"

namespace holdfast {

void FaultyPieceIo::Receiving(int64_t step, const std::vector<int>& owners) {
  hit_owner_ = !owners.empty() && faults_->FiresAt(fault::Kind::kCorruptBackup,
                                                   slot_(), step)
                   ? owners.front()
                   : -1;
}

void FaultyPieceIo::Landed(int64_t step, int owner, uint8_t* data, size_t off,
                           size_t n) {
  if (off != 0 || n == 0) return;
  int want = owner;
  if (!hit_owner_.compare_exchange_strong(want, -1)) return;
  data[0] ^= 0x5a;
  HOLDFAST_LOG_WARN(
      "backup: corrupted slot {}'s backup of slot {}'s piece of step {} on "
      "arrival (injected)",
      slot_(), owner, step);
}

void FaultyPieceIo::Taking(int64_t step, const std::vector<Take>& takes) {
  hit_piece_ = -1;
  if (takes.empty() ||
      !faults_->FiresAt(fault::Kind::kCorruptRestore, slot_(), step)) {
    return;
  }
  hit_into_live_ = takes.front().into_live;
  restore_step_ = step;
  hit_piece_ = takes.front().piece;
}

absl::Status FaultyPieceIo::Read(int piece, int64_t pid, uint64_t address,
                                 uint8_t* dst, size_t n) {
  absl::Status s = PieceIo::Read(piece, pid, address, dst, n);
  if (s.ok() && n > 0) DamageTaken(piece, dst + n / 2);
  return s;
}

absl::Status FaultyPieceIo::ReadLive(int64_t step, int64_t pid,
                                     uint64_t address, uint8_t* dst, size_t n) {
  if (faults_->FiresAt(fault::Kind::kRefuseRead, slot_(), step)) {
    HOLDFAST_LOG_WARN(
        "restore: slot {} refused a read in place of process {}'s live state "
        "of step {} (injected)",
        slot_(), pid, step);
    return absl::UnavailableError("refused (injected: refuse-read)");
  }
  return PieceIo::ReadLive(step, pid, address, dst, n);
}

void FaultyPieceIo::Received(int piece, uint8_t* data, size_t n) {
  if (n > 0) DamageTaken(piece, data + n / 2);
}

void FaultyPieceIo::DamageTaken(int piece, uint8_t* at) {
  int want = piece;
  if (!hit_piece_.compare_exchange_strong(want, -1)) return;
  *at ^= 0x5a;
  HOLDFAST_LOG_WARN(
      "restore: corrupted the piece of slot {} that slot {} received for "
      "step {}{} (injected)",
      piece, slot_(), restore_step_,
      hit_into_live_ ? ", read into its live state" : "");
}

}  // namespace holdfast
