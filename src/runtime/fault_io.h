// The piece I/O of a member with test faults: corrupt-backup damages the
// first copy it receives in a backup round, corrupt-restore the first
// piece it takes in a restore round (fault/fault.h), as the bytes land and
// before they are checked; refuse-read refuses a read in place of a
// holder's live state.
#ifndef HOLDFAST_SRC_RUNTIME_FAULT_IO_H_
#define HOLDFAST_SRC_RUNTIME_FAULT_IO_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "src/checkpoint/piece_io.h"
#include "src/fault/hooks.h"

namespace holdfast {

class FaultyPieceIo final : public checkpoint::PieceIo {
 public:
  // `slot`: this member's slot now (the faults name slots).
  FaultyPieceIo(std::shared_ptr<fault::Hooks> faults, std::function<int()> slot)
      : faults_(std::move(faults)), slot_(std::move(slot)) {}

  void Receiving(int64_t step, const std::vector<int>& owners) override;
  void Landed(int64_t step, int owner, uint8_t* data, size_t off,
              size_t n) override;
  void Taking(int64_t step, const std::vector<Take>& takes) override;
  absl::Status Read(int piece, int64_t pid, uint64_t address, uint8_t* dst,
                    size_t n) override;
  void Received(int piece, uint8_t* data, size_t n) override;
  absl::Status ReadLive(int64_t step, int64_t pid, uint64_t address,
                        uint8_t* dst, size_t n) override;

 private:
  // Damages the byte at `at` of piece `piece` once (the restore's hit).
  void DamageTaken(int piece, uint8_t* at);

  const std::shared_ptr<fault::Hooks> faults_;
  const std::function<int()> slot_;
  // The owner whose copy is damaged in this backup round, or -1.
  std::atomic<int> hit_owner_{-1};
  // The piece damaged in this restore round, or -1; and how it lands.
  std::atomic<int> hit_piece_{-1};
  bool hit_into_live_ = false;
  int64_t restore_step_ = -1;
};

}  // namespace holdfast

#endif  // HOLDFAST_SRC_RUNTIME_FAULT_IO_H_
