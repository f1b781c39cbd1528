// The registered state of one member and the math that cuts it into
// pieces: the first room of the checkpoint layer (docs/checkpoint.md).
//
// State is a list of named buffers, in registration order (the same on
// every slot):
//   - replicated: the caller's memory, meant to hold the same bytes on
//     every slot;
//   - sharded: a global array of `global` bytes cut into whole units, of
//     which this member holds one partition in storage the registry owns.
// A snapshot of a world of W slots is W pieces; piece p is, buffer after
// buffer, partition p of every buffer (pieces::Partition). What a member
// at (world, slot) holds live is all of every replicated buffer and its
// own partition of every sharded one.
//
// Not thread-safe: the runtime registers before its first step and then
// touches the state only on the thread that owns it at the time (the
// training thread, or the backup thread while the trainer is fenced out).
#ifndef HOLDFAST_SRC_CHECKPOINT_STATE_H_
#define HOLDFAST_SRC_CHECKPOINT_STATE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "holdfast/state.h"
#include "src/checkpoint/pieces.h"

namespace holdfast::checkpoint {

struct StateBuffer {
  std::string name;
  bool sharded = false;
  size_t global = 0;             // bytes of the global array
  size_t unit = 1;               // partitions are whole units
  uint8_t* data = nullptr;       // replicated: the caller's whole array
  std::vector<uint8_t> storage;  // sharded: this slot's partition
  pieces::Range part;            // sharded: what storage holds
};

// Places in memory that a piece's bytes fill, in the piece's order.
using Segments = std::vector<std::pair<uint8_t*, size_t>>;

class StateRegistry {
 public:
  // InvalidArgument for an empty or repeated name, or null data with
  // bytes > 0.
  absl::Status AddReplicated(const std::string& name, void* data, size_t bytes);
  // InvalidArgument for an empty or repeated name, or a size that is not
  // whole units. Its partition is sized for (world, slot) when world > 0.
  absl::StatusOr<ShardView> AddSharded(const std::string& name,
                                       size_t global_bytes, size_t unit_bytes,
                                       int world, int slot);
  // NotFound unless a sharded buffer of that name is registered.
  absl::StatusOr<ShardView> Shard(const std::string& name) const;

  const std::vector<StateBuffer>& buffers() const { return buffers_; }
  // Whether no sharded state is registered.
  bool ReplicatedOnly() const;

  // Partition `slot` of buffer `b` in a world of `world`.
  static pieces::Range PartOf(const StateBuffer& b, int world, int slot);
  // What the member at (world, slot) holds live of `b`.
  static pieces::Range Needed(const StateBuffer& b, int world, int slot);
  // Where byte `offset` of `b` lies in the live state of a member that
  // holds `need` of it.
  static uint8_t* LiveAt(StateBuffer& b, const pieces::Range& need,
                         size_t offset);

  // Sizes every sharded partition for (world, slot); unchanged ones keep
  // their bytes, moved ones start zeroed.
  void RepartitionAll(int world, int slot);
  // Bytes of piece `slot` of a snapshot of a world of `world`.
  size_t PieceSize(int world, int slot) const;
  // Whether the member at (world, slot) needs any byte of piece `p` of a
  // snapshot cut for `old_world`.
  bool NeedsPiece(int world, int slot, int old_world, int p) const;

  // A wait that comes before every copy of a piece out of the live state
  // (RunOptions::state_ready): for registered buffers that are filled
  // asynchronously, as pinned host copies of device memory are. None by
  // default. AwaitReady runs it: OK, or its error.
  void SetReadyWait(std::function<absl::Status()> wait);
  absl::Status AwaitReady() const;
  // Copies this member's piece `slot` of a world of `world` out of the live
  // state into `out` (PieceSize bytes), hashing it when `hash` is set;
  // first AwaitReady(), whose error it returns, copying nothing.
  absl::Status CopyPiece(int world, int slot, uint8_t* out,
                         pieces::CopyHasher* hash = nullptr) const;
  // Copies what the member at (world, slot) needs out of piece `p` (cut
  // for `old_world`) into the live state. With `hash`, every byte of the
  // piece is hashed too, in order, the copied ones as they are copied.
  void ApplyPiece(const uint8_t* piece, int old_world, int p, int world,
                  int slot, pieces::CopyHasher* hash = nullptr);
  // Where the bytes of piece `p` (cut for `old_world`) go in the live
  // state of the member at (world, slot), when every one of them does;
  // else empty.
  Segments Landing(int old_world, int p, int world, int slot);

  // A hash of the names, kinds and sizes, in order.
  uint64_t LayoutHash() const;
  // The live replicated state in blocks of kLiveBlock bytes (a buffer's
  // last one may be shorter), buffer by buffer: LiveHash is the hash of
  // their checksums, in order, so that threads share the work and a
  // receiver hashes each block as it lands. A block of buffer b covers
  // [offset, offset + bytes) of it; a buffer's first block is
  // FirstLiveBlock(b).
  static constexpr size_t kLiveBlock = size_t{1} << 20;
  struct LiveBlock {
    size_t buffer;
    size_t offset;
    size_t bytes;
  };
  std::vector<LiveBlock> LiveBlocks() const;
  size_t FirstLiveBlock(size_t b) const;
  // LiveHash from the blocks' checksums (pieces::Checksum), in order.
  static uint64_t CombineLive(const std::vector<uint64_t>& checksums);
  // A hash of the live replicated state, computed on up to `threads`
  // threads.
  uint64_t LiveHash(size_t threads = kLiveHashThreads) const;
  static constexpr size_t kLiveHashThreads = 4;
  // A hash of this member's partitions of the sharded state.
  uint64_t ShardedHash() const;

 private:
  absl::Status CheckName(const std::string& name) const;

  std::vector<StateBuffer> buffers_;
  std::function<absl::Status()> ready_wait_;
};

// Copies `n` bytes, bytes [from, from + n) of a piece, to where they go
// in `to` (the piece's segments), hashing them.
void CopyInto(const Segments& to, size_t from, const uint8_t* src, size_t n,
              pieces::CopyHasher* h);

}  // namespace holdfast::checkpoint

#endif  // HOLDFAST_SRC_CHECKPOINT_STATE_H_
