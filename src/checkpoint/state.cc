#include "src/checkpoint/state.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "holdfast/status.h"
#include "src/common/thread_util.h"

namespace holdfast::checkpoint {

namespace {

ShardView ViewOf(const StateBuffer& b) {
  ShardView v;
  v.data = const_cast<uint8_t*>(b.storage.data());
  v.offset = b.part.offset;
  v.bytes = b.part.bytes;
  v.global_bytes = b.global;
  return v;
}

void Repartition(StateBuffer& b, int world, int slot) {
  const pieces::Range r = StateRegistry::PartOf(b, world, slot);
  if (r.offset == b.part.offset && r.bytes == b.part.bytes &&
      b.storage.size() == r.bytes) {
    return;
  }
  b.storage.assign(r.bytes, 0);
  b.part = r;
}

// Where partition `r` of buffer `b` starts in this member's memory.
const uint8_t* Source(const StateBuffer& b, const pieces::Range& r) {
  return b.sharded ? b.storage.data() : b.data + r.offset;
}

}  // namespace

absl::Status StateRegistry::CheckName(const std::string& name) const {
  if (name.empty()) {
    return absl::InvalidArgumentError("RegisterState: the name is empty");
  }
  for (const StateBuffer& b : buffers_) {
    if (b.name == name) {
      return absl::InvalidArgumentError(
          absl::StrCat("RegisterState: '", name, "' is registered twice"));
    }
  }
  return absl::OkStatus();
}

absl::Status StateRegistry::AddReplicated(const std::string& name, void* data,
                                          size_t bytes) {
  if (data == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterState('", name, "'): the data is null but bytes is ", bytes));
  }
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  StateBuffer b;
  b.name = name;
  b.global = bytes;
  b.data = static_cast<uint8_t*>(data);
  buffers_.push_back(std::move(b));
  return absl::OkStatus();
}

absl::StatusOr<ShardView> StateRegistry::AddSharded(const std::string& name,
                                                    size_t global_bytes,
                                                    size_t unit_bytes,
                                                    int world, int slot) {
  if (unit_bytes == 0 || global_bytes % unit_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterShardedState('", name, "'): global_bytes ", global_bytes,
        " is not a whole number of units of ", unit_bytes, " bytes"));
  }
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  StateBuffer b;
  b.name = name;
  b.sharded = true;
  b.global = global_bytes;
  b.unit = unit_bytes;
  if (world > 0) Repartition(b, world, slot);
  buffers_.push_back(std::move(b));
  return ViewOf(buffers_.back());
}

absl::StatusOr<ShardView> StateRegistry::Shard(const std::string& name) const {
  for (const StateBuffer& b : buffers_) {
    if (b.name == name && b.sharded) return ViewOf(b);
  }
  return absl::NotFoundError(
      absl::StrCat("no sharded state named '", name, "' is registered"));
}

bool StateRegistry::ReplicatedOnly() const {
  return std::none_of(buffers_.begin(), buffers_.end(),
                      [](const StateBuffer& b) { return b.sharded; });
}

pieces::Range StateRegistry::PartOf(const StateBuffer& b, int world, int slot) {
  return pieces::Partition(b.global, b.unit, world, slot);
}

pieces::Range StateRegistry::Needed(const StateBuffer& b, int world, int slot) {
  return b.sharded ? PartOf(b, world, slot) : pieces::Range{0, b.global};
}

uint8_t* StateRegistry::LiveAt(StateBuffer& b, const pieces::Range& need,
                               size_t offset) {
  return b.sharded ? b.storage.data() + (offset - need.offset)
                   : b.data + offset;
}

void StateRegistry::RepartitionAll(int world, int slot) {
  for (StateBuffer& b : buffers_) {
    if (b.sharded) Repartition(b, world, slot);
  }
}

size_t StateRegistry::PieceSize(int world, int slot) const {
  size_t n = 0;
  for (const StateBuffer& b : buffers_) n += PartOf(b, world, slot).bytes;
  return n;
}

bool StateRegistry::NeedsPiece(int world, int slot, int old_world,
                               int p) const {
  for (const StateBuffer& b : buffers_) {
    if (pieces::Intersect(Needed(b, world, slot), PartOf(b, old_world, p))
            .bytes > 0) {
      return true;
    }
  }
  return false;
}

void StateRegistry::SetReadyWait(std::function<absl::Status()> wait) {
  ready_wait_ = std::move(wait);
}

absl::Status StateRegistry::AwaitReady() const {
  return ready_wait_ ? ready_wait_() : absl::OkStatus();
}

absl::Status StateRegistry::CopyPiece(int world, int slot, uint8_t* out,
                                      pieces::CopyHasher* hash) const {
  HOLDFAST_RETURN_IF_ERROR(AwaitReady());
  for (const StateBuffer& b : buffers_) {
    const pieces::Range r = PartOf(b, world, slot);
    if (r.bytes == 0) continue;
    if (hash != nullptr) {
      out = hash->Copy(out, Source(b, r), r.bytes);
    } else {
      std::memcpy(out, Source(b, r), r.bytes);
      out += r.bytes;
    }
  }
  return absl::OkStatus();
}

void StateRegistry::ApplyPiece(const uint8_t* piece, int old_world, int p,
                               int world, int slot, pieces::CopyHasher* hash) {
  size_t off = 0;
  for (StateBuffer& b : buffers_) {
    const pieces::Range r = PartOf(b, old_world, p);
    const pieces::Range need = Needed(b, world, slot);
    const pieces::Range x = pieces::Intersect(need, r);
    const uint8_t* from = piece + off;
    if (x.bytes > 0) {
      uint8_t* dst = LiveAt(b, need, x.offset);
      const size_t before = x.offset - r.offset;
      if (hash == nullptr) {
        std::memcpy(dst, from + before, x.bytes);
      } else {
        hash->Update(from, before);
        hash->Copy(dst, from + before, x.bytes);
        hash->Update(from + before + x.bytes, r.bytes - before - x.bytes);
      }
    } else if (hash != nullptr) {
      hash->Update(from, r.bytes);
    }
    off += r.bytes;
  }
}

Segments StateRegistry::Landing(int old_world, int p, int world, int slot) {
  Segments out;
  for (StateBuffer& b : buffers_) {
    const pieces::Range r = PartOf(b, old_world, p);
    if (r.bytes == 0) continue;
    const pieces::Range need = Needed(b, world, slot);
    if (pieces::Intersect(need, r).bytes != r.bytes) return {};
    out.emplace_back(LiveAt(b, need, r.offset), r.bytes);
  }
  return out;
}

uint64_t StateRegistry::LayoutHash() const {
  uint64_t h = 0x686f6c64;
  for (const StateBuffer& b : buffers_) {
    h = XXH3_64bits_withSeed(b.name.data(), b.name.size(), h);
    const uint64_t meta[3] = {b.sharded ? 1u : 0u, b.global, b.unit};
    h = XXH3_64bits_withSeed(meta, sizeof(meta), h);
  }
  return h;
}

std::vector<StateRegistry::LiveBlock> StateRegistry::LiveBlocks() const {
  std::vector<LiveBlock> out;
  for (size_t b = 0; b < buffers_.size(); ++b) {
    if (buffers_[b].sharded) continue;
    const size_t global = buffers_[b].global;
    for (size_t off = 0; off < global; off += kLiveBlock) {
      out.push_back({b, off, std::min(kLiveBlock, global - off)});
    }
  }
  return out;
}

size_t StateRegistry::FirstLiveBlock(size_t b) const {
  size_t first = 0;
  for (size_t i = 0; i < b && i < buffers_.size(); ++i) {
    if (!buffers_[i].sharded) {
      first += (buffers_[i].global + kLiveBlock - 1) / kLiveBlock;
    }
  }
  return first;
}

uint64_t StateRegistry::CombineLive(const std::vector<uint64_t>& checksums) {
  return pieces::Checksum(checksums.data(),
                          checksums.size() * sizeof(uint64_t));
}

uint64_t StateRegistry::LiveHash(size_t threads) const {
  const std::vector<LiveBlock> blocks = LiveBlocks();
  std::vector<uint64_t> sums(blocks.size());
  ForEachOnThreads(blocks.size(), threads, [&](size_t i) {
    const LiveBlock& k = blocks[i];
    sums[i] = pieces::Checksum(buffers_[k.buffer].data + k.offset, k.bytes);
  });
  return CombineLive(sums);
}

uint64_t StateRegistry::ShardedHash() const {
  pieces::CopyHasher h;
  for (const StateBuffer& b : buffers_) {
    if (b.sharded) h.Update(b.storage.data(), b.storage.size());
  }
  return h.Digest();
}

void CopyInto(const Segments& to, size_t from, const uint8_t* src, size_t n,
              pieces::CopyHasher* h) {
  size_t base = 0;  // of the piece, where the segment starts
  for (const auto& [dst, bytes] : to) {
    if (n == 0) break;
    if (from < base + bytes) {
      const size_t k = std::min(n, base + bytes - from);
      h->Copy(dst + (from - base), src, k);
      src += k;
      from += k;
      n -= k;
    }
    base += bytes;
  }
}

}  // namespace holdfast::checkpoint
