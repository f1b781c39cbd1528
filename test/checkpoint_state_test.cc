// The checkpoint layer's state registry, without processes: registration
// errors by name, pieces that cut the state into parts that add up, and
// pieces of one world put back into members of another (a shrink) with
// every byte where it was.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "src/checkpoint/pieces.h"
#include "src/checkpoint/snapshots.h"
#include "src/checkpoint/state.h"
#include "src/fault/fault.h"
#include "src/runtime/fault_points.h"

namespace {

using holdfast::checkpoint::Segments;
using holdfast::checkpoint::StateRegistry;

// A member's state: two replicated buffers (one odd-sized) and
// two sharded arrays of 4- and 8-byte units, filled from `seed`.
struct Member {
  std::vector<uint8_t> a, b;
  StateRegistry reg;

  Member(int world, int slot, uint8_t seed) : a(1000), b(37) {
    std::iota(a.begin(), a.end(), seed);
    std::iota(b.begin(), b.end(), static_cast<uint8_t>(seed + 7));
    REQUIRE(reg.AddReplicated("a", a.data(), a.size()).ok());
    REQUIRE(reg.AddSharded("s4", 4 * 101, 4, world, slot).ok());
    REQUIRE(reg.AddReplicated("b", b.data(), b.size()).ok());
    REQUIRE(reg.AddSharded("s8", 8 * 10, 8, world, slot).ok());
  }
};

// Fills member `slot` of a world's sharded partitions with the global
// array's bytes (byte i of array "s4" is i * 3 + 1, of "s8" i * 5 + 2).
void FillShards(StateRegistry& reg) {
  for (const char* name : {"s4", "s8"}) {
    auto v = reg.Shard(name);
    REQUIRE(v.ok());
    const int k = std::string(name) == "s4" ? 3 : 5;
    for (size_t i = 0; i < v->bytes; ++i) {
      v->data[i] = static_cast<uint8_t>((v->offset + i) * k + k - 2);
    }
  }
}

}  // namespace

TEST_CASE("checkpoint state: bad registrations are refused by name") {
  StateRegistry reg;
  std::vector<uint8_t> x(8);
  CHECK(reg.AddReplicated("", x.data(), 8).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(reg.AddReplicated("x", nullptr, 8).message().find("'x'") !=
        std::string::npos);
  REQUIRE(reg.AddReplicated("x", x.data(), 8).ok());
  absl::Status twice = reg.AddReplicated("x", x.data(), 8);
  CHECK(twice.message().find("'x' is registered twice") != std::string::npos);
  auto bad_units = reg.AddSharded("s", 10, 4, 2, 0);
  CHECK(bad_units.status().message().find("not a whole number of units") !=
        std::string::npos);
  CHECK(reg.AddSharded("x", 8, 4, 2, 0).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(reg.Shard("x").status().code() == absl::StatusCode::kNotFound);
  CHECK(reg.Shard("nope").status().message().find("'nope'") !=
        std::string::npos);
  CHECK(reg.ReplicatedOnly());
  REQUIRE(reg.AddSharded("s", 16, 4, 2, 1).ok());
  CHECK(!reg.ReplicatedOnly());
  CHECK(reg.Shard("s")->offset == 8);
  CHECK(reg.Shard("s")->bytes == 8);
}

TEST_CASE(
    "checkpoint state: a world's pieces add up to the state and each member "
    "needs only what it holds") {
  for (int world : {1, 2, 3, 4, 7}) {
    Member m(world, 0, 1);
    size_t total = 0;
    for (int p = 0; p < world; ++p) total += m.reg.PieceSize(world, p);
    // Every byte of every buffer is in exactly one piece.
    CHECK(total == 1000 + 37 + 4 * 101 + 8 * 10);
    for (int slot = 0; slot < world; ++slot) {
      // A member needs every piece (the replicated state is in all of
      // them), and of the sharded arrays only its own partition.
      for (int p = 0; p < world; ++p)
        CHECK(m.reg.NeedsPiece(world, slot, world, p));
    }
  }
  // Sharded state alone: a member needs only the pieces that overlap its
  // partition.
  StateRegistry shards_only;
  REQUIRE(shards_only.AddSharded("s", 4 * 12, 4, 4, 0).ok());
  CHECK(shards_only.NeedsPiece(4, 1, 4, 1));
  CHECK(!shards_only.NeedsPiece(4, 1, 4, 0));
  CHECK(!shards_only.NeedsPiece(4, 1, 4, 2));
  // After a shrink to 2, slot 0 holds units 0-5: pieces 0 and 1 of 4.
  CHECK(shards_only.NeedsPiece(2, 0, 4, 0));
  CHECK(shards_only.NeedsPiece(2, 0, 4, 1));
  CHECK(!shards_only.NeedsPiece(2, 0, 4, 2));
}

TEST_CASE(
    "checkpoint state: pieces of a world of 3 rebuild a member of a world "
    "of 2 byte for byte") {
  // Three members cut their pieces; a fresh member at slot 1 of 2 applies
  // them all and must end with the replicated buffers and its partitions
  // of the global arrays.
  std::vector<std::vector<uint8_t>> pieces;
  std::vector<uint64_t> checksums;
  for (int slot = 0; slot < 3; ++slot) {
    Member m(3, slot, 1);
    FillShards(m.reg);
    std::vector<uint8_t> piece(m.reg.PieceSize(3, slot));
    holdfast::pieces::CopyHasher h;
    REQUIRE(m.reg.CopyPiece(3, slot, piece.data(), &h).ok());
    CHECK(h.Digest() == holdfast::pieces::Checksum(piece.data(), piece.size()));
    checksums.push_back(h.Digest());
    pieces.push_back(std::move(piece));
  }
  Member fresh(2, 1, 100);  // other bytes everywhere
  fresh.reg.RepartitionAll(2, 1);
  for (int p = 0; p < 3; ++p) {
    holdfast::pieces::CopyHasher h;
    fresh.reg.ApplyPiece(pieces[p].data(), 3, p, 2, 1, &h);
    CHECK(h.Digest() == checksums[static_cast<size_t>(p)]);
  }
  Member want(2, 1, 1);
  FillShards(want.reg);
  CHECK(fresh.a == want.a);
  CHECK(fresh.b == want.b);
  for (const char* name : {"s4", "s8"}) {
    auto got = fresh.reg.Shard(name);
    auto exp = want.reg.Shard(name);
    REQUIRE(got->bytes == exp->bytes);
    CHECK(got->offset == exp->offset);
    CHECK(std::equal(got->data, got->data + got->bytes, exp->data));
  }
  CHECK(fresh.reg.LiveHash() == want.reg.LiveHash());
  CHECK(fresh.reg.ShardedHash() == want.reg.ShardedHash());
}

TEST_CASE(
    "checkpoint state: replicated pieces land in place and land the same "
    "as Apply") {
  Member src(3, 0, 5);
  StateRegistry replicated;
  std::vector<uint8_t> a(src.a), b(src.b);
  REQUIRE(replicated.AddReplicated("a", a.data(), a.size()).ok());
  REQUIRE(replicated.AddReplicated("b", b.data(), b.size()).ok());
  for (int p = 0; p < 3; ++p) {
    std::vector<uint8_t> piece(replicated.PieceSize(3, p));
    REQUIRE(replicated.CopyPiece(3, p, piece.data()).ok());
    std::vector<uint8_t> a2(a.size()), b2(b.size());
    StateRegistry dst;
    REQUIRE(dst.AddReplicated("a", a2.data(), a2.size()).ok());
    REQUIRE(dst.AddReplicated("b", b2.data(), b2.size()).ok());
    const Segments land = dst.Landing(3, p, 3, 2);
    REQUIRE(!land.empty());
    holdfast::pieces::CopyHasher h;
    // In two chunks, as a transfer would deliver them.
    const size_t half = piece.size() / 2;
    holdfast::checkpoint::CopyInto(land, 0, piece.data(), half, &h);
    holdfast::checkpoint::CopyInto(land, half, piece.data() + half,
                                   piece.size() - half, &h);
    CHECK(h.Digest() == holdfast::pieces::Checksum(piece.data(), piece.size()));
    std::vector<uint8_t> a3(a.size()), b3(b.size());
    StateRegistry by_apply;
    REQUIRE(by_apply.AddReplicated("a", a3.data(), a3.size()).ok());
    REQUIRE(by_apply.AddReplicated("b", b3.data(), b3.size()).ok());
    by_apply.ApplyPiece(piece.data(), 3, p, 3, 2);
    CHECK(a2 == a3);
    CHECK(b2 == b3);
  }
  // A sharded part that is not wholly this member's does not land in place.
  CHECK(src.reg.Landing(3, 0, 2, 1).empty());
}

TEST_CASE(
    "checkpoint state: the live hash is one value however many threads "
    "compute it, and a receiver's block checksums give it") {
  // Buffers of 2.5 blocks, of half a block, and a sharded one between
  // (not part of it): blocks 0-2 of the first, block 3 of the second.
  constexpr size_t kBlock = StateRegistry::kLiveBlock;
  std::vector<uint8_t> big(2 * kBlock + kBlock / 2), small(kBlock / 2);
  uint32_t x = 7;  // no two blocks alike
  for (auto* v : {&big, &small}) {
    for (uint8_t& byte : *v)
      byte = static_cast<uint8_t>((x = x * 1103515245 + 12345) >> 16);
  }
  StateRegistry reg;
  REQUIRE(reg.AddReplicated("big", big.data(), big.size()).ok());
  REQUIRE(reg.AddSharded("s", 4 * 1000, 4, 2, 0).ok());
  REQUIRE(reg.AddReplicated("small", small.data(), small.size()).ok());
  const std::vector<StateRegistry::LiveBlock> blocks = reg.LiveBlocks();
  REQUIRE(blocks.size() == 4);
  CHECK(reg.FirstLiveBlock(0) == 0);
  CHECK(reg.FirstLiveBlock(2) == 3);
  CHECK(blocks[2].offset == 2 * kBlock);
  CHECK(blocks[2].bytes == kBlock / 2);
  CHECK(blocks[3].buffer == 2);
  const uint64_t one = reg.LiveHash(1);
  CHECK(reg.LiveHash(4) == one);
  std::vector<uint64_t> sums;
  for (const auto& k : blocks) {
    const uint8_t* data = k.buffer == 0 ? big.data() : small.data();
    sums.push_back(holdfast::pieces::Checksum(data + k.offset, k.bytes));
  }
  CHECK(StateRegistry::CombineLive(sums) == one);
  // Every block counts, the short last one too; the sharded array not.
  big.back() ^= 1;
  CHECK(reg.LiveHash(4) != one);
  big.back() ^= 1;
  std::swap(sums[0], sums[1]);
  CHECK(StateRegistry::CombineLive(sums) != one);
  auto shard = reg.Shard("s");
  REQUIRE(shard.ok());
  shard->data[0] ^= 1;
  CHECK(reg.LiveHash(2) == one);
}

TEST_CASE(
    "checkpoint state: the live hash follows the replicated bytes and the "
    "layout hash follows names and sizes") {
  Member x(2, 0, 1), y(2, 0, 1);
  CHECK(x.reg.LiveHash() == y.reg.LiveHash());
  y.a[3] ^= 1;
  CHECK(x.reg.LiveHash() != y.reg.LiveHash());
  CHECK(x.reg.LayoutHash() == y.reg.LayoutHash());
  StateRegistry other;
  std::vector<uint8_t> a(1000);
  REQUIRE(other.AddReplicated("A", a.data(), a.size()).ok());
  StateRegistry same;
  REQUIRE(same.AddReplicated("a", a.data(), a.size()).ok());
  StateRegistry shorter;
  REQUIRE(shorter.AddReplicated("a", a.data(), a.size() - 1).ok());
  CHECK(other.LayoutHash() != same.LayoutHash());
  CHECK(shorter.LayoutHash() != same.LayoutHash());
}

TEST_CASE(
    "checkpoint: the snapshot pipeline keeps the newest commits and a "
    "rollback drops what came after its step") {
  StateRegistry reg;
  holdfast::checkpoint::Snapshots snaps(&reg);
  snaps.SetKeep(2);
  auto add = [&](int64_t step) { snaps.Add(snaps.NewPiece(step, 0, 4, 1, 0)); };
  for (int64_t s = 0; s <= 3; ++s) {
    add(s);
    snaps.Committed(s);
  }
  // Steps 3 and 2 stay; 1 and 0 went at the commits after them.
  CHECK(snaps.kept_commits() == std::vector<int64_t>{3, 2});
  CHECK(snaps.At(3).size() == 1);
  CHECK(snaps.At(2).size() == 1);
  CHECK(snaps.At(1).empty());
  CHECK(snaps.At(0).empty());
  add(4);  // not committed: a rollback abandons it
  snaps.AbandonAfter(2);
  CHECK(snaps.kept_commits() == std::vector<int64_t>{2});
  CHECK(snaps.At(4).empty());
  CHECK(snaps.At(3).empty());
  CHECK(snaps.At(2).size() == 1);
  add(3);
  snaps.Committed(3);
  CHECK(snaps.kept_commits() == std::vector<int64_t>{3, 2});
  CHECK(snaps.count() == 2);
}

TEST_CASE(
    "checkpoint: the nan and spike and bitflip faults parse and need their "
    "step") {
  auto n = holdfast::fault::Parse(
      "nan:slot=1:step=20,spike:slot=2:step=7,bitflip:slot=0:step=4");
  REQUIRE(n.ok());
  CHECK(n->at(0).kind == holdfast::fault::Kind::kNan);
  CHECK(n->at(0).step == 20);
  CHECK(n->at(1).kind == holdfast::fault::Kind::kSpike);
  CHECK(n->at(2).kind == holdfast::fault::Kind::kBitflip);
  CHECK(n->at(2).step == 4);
  CHECK(!holdfast::fault::Parse("bitflip:slot=1").ok());
  CHECK(!holdfast::fault::Parse("nan:slot=1").ok());
  CHECK(!holdfast::fault::Parse("spike:slot=1:recovery=1").ok());
  CHECK(!holdfast::fault::Parse("nan:step=3").ok());
}

TEST_CASE(
    "checkpoint: the gradflip fault parses, takes a float32's bit, and "
    "flips the largest value whose bit is clear and stays finite") {
  auto g = holdfast::fault::Parse(
      "gradflip:slot=1:step=20,gradflip:slot=2:step=3:bit=31");
  REQUIRE(g.ok());
  CHECK(g->at(0).kind == holdfast::fault::Kind::kGradflip);
  CHECK(g->at(0).bit == 30);
  CHECK(g->at(1).bit == 31);
  CHECK(!holdfast::fault::Parse("gradflip:slot=1").ok());
  absl::Status bad =
      holdfast::fault::Parse("gradflip:slot=1:step=2:bit=32").status();
  CHECK_THAT(std::string(bad.message()), Catch::Contains("bit out of range"));
  CHECK(!holdfast::fault::Parse("nan:slot=1:step=2:bit=3").ok());
  // 1.5 would overflow (bit 30 multiplies by 2^128); 0.75 is the largest
  // below 1, and -0.5 is smaller; 3.0 has the bit set already.
  float v[] = {-0.5f, 1.5f, 0.75f, 3.0f};
  CHECK(holdfast::runtime_internal::FlipLargestClearBit(v, 4, 30) == 2);
  CHECK(v[2] == std::ldexp(0.75f, 128));
  CHECK(v[1] == 1.5f);
  CHECK(std::isfinite(v[2]));
  float none[] = {3.0f, -2.5f};
  CHECK(holdfast::runtime_internal::FlipLargestClearBit(none, 2, 30) == -1);
}
