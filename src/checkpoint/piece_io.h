// Where the bytes of a member's pieces come in from others: backup copies
// landing on a link, and a restore's reads in place and receptions. The
// backup round and the restore do all such I/O through a PieceIo, so a
// test wraps it to damage a piece in transit (as LevelDB's fault-injection
// Env wraps files) without the algorithms knowing.
//
// Thread-safety: Landed and Read may be called from several threads at
// once (one per link or reader), for different pieces; the other calls
// come from the thread that runs the round or the restore.
#ifndef HOLDFAST_SRC_CHECKPOINT_PIECE_IO_H_
#define HOLDFAST_SRC_CHECKPOINT_PIECE_IO_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "src/checkpoint/peer_memory.h"

namespace holdfast::checkpoint {

class PieceIo {
 public:
  virtual ~PieceIo() = default;

  // ---- A backup round ----

  // This member is about to receive the copies of `owners` (ascending)
  // for `step`.
  virtual void Receiving(int64_t /*step*/, const std::vector<int>& /*owners*/) {
  }
  // Bytes [off, off + n) of `owner`'s copy, at `data` + off, landed; they
  // are hashed after this returns.
  virtual void Landed(int64_t /*step*/, int /*owner*/, uint8_t* /*data*/,
                      size_t /*off*/, size_t /*n*/) {}

  // ---- A restore ----

  // One piece a restore round takes: read in place or received, into
  // the live state or a piece buffer.
  struct Take {
    int piece = 0;
    bool into_live = false;
  };
  // The pieces this member takes in a round of restoring `step`
  // (ascending).
  virtual void Taking(int64_t /*step*/, const std::vector<Take>& /*takes*/) {}
  // Reads `n` bytes of piece `piece` in place from process `pid` at
  // `address` into `dst`; they are hashed after this returns.
  virtual absl::Status Read(int /*piece*/, int64_t pid, uint64_t address,
                            uint8_t* dst, size_t n) {
    return peer_memory::Read(pid, address, dst, n);
  }
  // Reads `n` bytes of a holder's live state in place from process `pid`
  // at `address` into `dst`, in a live restore of `step`.
  virtual absl::Status ReadLive(int64_t /*step*/, int64_t pid, uint64_t address,
                                uint8_t* dst, size_t n) {
    return peer_memory::Read(pid, address, dst, n);
  }
  // Piece `piece`, received over the communicator, is whole at `data`
  // (`n` bytes) and about to be checked.
  virtual void Received(int /*piece*/, uint8_t* /*data*/, size_t /*n*/) {}
};

}  // namespace holdfast::checkpoint

#endif  // HOLDFAST_SRC_CHECKPOINT_PIECE_IO_H_
