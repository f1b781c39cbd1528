// The pieces a snapshot is cut into, where their copies go, and how they are
// kept on disk. Pure functions of their inputs (no runtime state), so the
// placement and the on-disk format are unit-tested on their own.
//
// Every registered buffer is a global array partitioned over the slots of
// the world it was snapshotted in: replicated state is identical on every
// slot and each slot keeps only its 1/N partition; sharded state is
// distributed and each slot holds exactly its partition. Slot i's piece of
// world W is the concatenation, over the buffers in registration order, of
// partition i of W of each buffer. Restore reassembles whatever a member
// needs from the pieces of one world, wherever they are held.
#ifndef HOLDFAST_SRC_CHECKPOINT_PIECES_H_
#define HOLDFAST_SRC_CHECKPOINT_PIECES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace holdfast::pieces {

// What each piece carries besides its bytes: its owner's ledger when the
// snapshot was taken, int64s of the first step's start (unix ms), the
// productive time of the steps done so far (us) and the first step's
// duration (us). A restore gives every member the ledger of the target's
// piece 0, so the productive time survives a rollback and reaches a member
// that takes over.
inline constexpr int kLedgerWords = 3;
using Ledger = std::array<int64_t, kLedgerWords>;

struct Range {
  size_t offset = 0;
  size_t bytes = 0;
  size_t end() const { return offset + bytes; }
};

// Partition `part` of `parts` of a `total`-byte array cut in whole units of
// `unit` bytes (total % unit == 0): the first total/unit % parts partitions
// get one unit more.
Range Partition(size_t total, size_t unit, int parts, int part);

// The overlap of two ranges (bytes == 0 when disjoint).
Range Intersect(const Range& a, const Range& b);

// xxHash3 (64 bits) of a piece.
uint64_t Checksum(const void* data, size_t bytes);

// Copies a piece together from several sources and hashes it on the way,
// a block at a time while the block is still in cache: one pass over the
// bytes instead of a copy and then a re-read. Digest() equals Checksum()
// of everything copied, in order.
class CopyHasher {
 public:
  CopyHasher();
  ~CopyHasher();
  CopyHasher(const CopyHasher&) = delete;
  CopyHasher& operator=(const CopyHasher&) = delete;

  // Copies `bytes` from `src` to `dst` and hashes them; returns dst + bytes.
  uint8_t* Copy(uint8_t* dst, const uint8_t* src, size_t bytes);
  // Hashes bytes already in place (received ones).
  void Update(const void* data, size_t bytes);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// ---- Placement -------------------------------------------------------------

struct PlacementInput {
  // Per slot: an id of its failure domain (its host) and of its topology
  // block (0: none).
  std::vector<uint64_t> domain;
  std::vector<uint64_t> block;
  int replicas = 1;
  // The trainer's parallel layout: slot = ((dp * pp) + pp_index) * tp +
  // tp_index. 1 and 1: plain data parallel (no groups to avoid).
  int tp = 1;
  int pp = 1;
};

struct Placement {
  // buddies[s]: the slots holding copies of slot s's piece, best first.
  std::vector<std::vector<int>> buddies;
  // Where a constraint had to be relaxed (a buddy in the same failure
  // domain, or inside one of the slot's parallel groups), one line each.
  std::vector<std::string> warnings;
};

// Deterministic placement: for slot s, candidates are tried in the order
// s+D, s+D+1, ... (mod W), where D = W / (number of distinct domains), so
// that with equal contiguous hosts every slot's buddy is the same local
// index on the next host and each slot receives exactly r pieces. A
// candidate is taken from the best tier that still has one: another domain
// and outside the slot's TP, PP and DP groups (and another topology block
// when blocks are given), then another domain, then any other slot.
Placement Place(const PlacementInput& in);

// ---- Disk tier -------------------------------------------------------------

struct PieceHeader {
  int64_t step = 0;
  int64_t layout_generation = 0;
  int32_t world = 0;
  int32_t slot = 0;
  uint64_t layout_hash = 0;  // names, kinds and sizes of the state
  uint64_t bytes = 0;
  uint64_t checksum = 0;  // of the payload
  Ledger ledger{};
};

// DIR/step-<step>/piece-<slot>-of-<world>.bin
std::string PiecePath(const std::string& dir, int64_t step, int world,
                      int slot);

// Writes a piece atomically: a temporary file, fsync, rename, fsync of the
// directory. Internal on an I/O error, naming the file.
absl::Status WritePiece(const std::string& dir, const PieceHeader& header,
                        const void* data);

// Reads a piece and verifies it: DataLoss naming the file when it is
// truncated, not a holdfast piece, of another layout or fails its checksum.
absl::Status ReadPiece(const std::string& path, uint64_t layout_hash,
                       PieceHeader* header, std::vector<uint8_t>* data);

struct DiskStep {
  int64_t step = -1;
  int world = 0;
};

// The newest step whose directory holds every piece of one world with this
// layout (headers checked; payload checksums are verified when read), or
// of any one layout when `layout_hash` is nullopt (what a launcher, which
// does not know the state, can report). A step directory whose pieces were
// written with another layout gives InvalidArgument naming it when no
// complete step of this layout is newer.
absl::StatusOr<std::optional<DiskStep>> FindNewest(
    const std::string& dir, std::optional<uint64_t> layout_hash);

// Removes step directories older than the `keep` newest.
void Prune(const std::string& dir, int keep);
// Removes the step directories of steps after `step` (a timeline that a
// rollback abandoned: a resume must not read them).
void RemoveAfter(const std::string& dir, int64_t step);

}  // namespace holdfast::pieces

#endif  // HOLDFAST_SRC_CHECKPOINT_PIECES_H_
