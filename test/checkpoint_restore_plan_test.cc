// The restore plan without processes: the step every member rolls back to,
// and which cut of it is taken from whom, from what members offer.
#include <catch2/catch.hpp>
#include <vector>

#include "src/checkpoint/restore_plan.h"

namespace {

using holdfast::checkpoint::ChooseCut;
using holdfast::checkpoint::ChooseTarget;
using holdfast::checkpoint::CutChoice;
using holdfast::checkpoint::MemberState;
using holdfast::checkpoint::OfferedCopy;

OfferedCopy Copy(int64_t gen, int world, int slot, bool good = true) {
  OfferedCopy c;
  c.layout_generation = gen;
  c.world = world;
  c.slot = slot;
  c.checksum = 1000 + static_cast<uint64_t>(slot);
  c.good = good;
  c.address = 0x10000 * static_cast<uint64_t>(slot + 1);
  return c;
}

}  // namespace

TEST_CASE(
    "restore plan: the target is the newest committed step any member saw") {
  // One member saw the commit of step 7 before the failure, the others
  // only 6: 7 was held by everyone, so all roll back to 7; steps done past
  // it (9 at most) are lost.
  auto t = ChooseTarget({{6, 8}, {7, 9}, {6, 7}});
  CHECK(t.step == 7);
  CHECK(t.lost == 2);
  // Nobody past the target: nothing lost. A fresh standby (-1) counts for
  // nothing.
  t = ChooseTarget({{5, 5}, {-1, -1}, {5, 5}});
  CHECK(t.step == 5);
  CHECK(t.lost == 0);
  t = ChooseTarget({});
  CHECK(t.step == 0);
  CHECK(t.lost == 0);
}

TEST_CASE(
    "restore plan: the newest complete cut is chosen and every holder of a "
    "piece is listed in member order") {
  // World 3, generation 2: member 0 holds its own piece and a buddy copy
  // of piece 2, member 1 holds piece 1 and piece 0, member 2 is a fresh
  // standby with nothing.
  std::vector<std::vector<OfferedCopy>> offers = {
      {Copy(2, 3, 0), Copy(2, 3, 2), OfferedCopy{}},  // padding
      {Copy(2, 3, 1), Copy(2, 3, 0)},
      {}};
  CutChoice c = ChooseCut(offers);
  REQUIRE(c.cut.has_value());
  CHECK(c.cut->layout_generation == 2);
  CHECK(c.cut->world == 3);
  CHECK(c.missing.empty());
  const auto& h = c.cut->holders;
  CHECK(h.by_slot == std::vector<std::vector<int>>{{0, 1}, {1}, {0}});
  CHECK(h.address_by_slot[0] == std::vector<uint64_t>{0x10000, 0x10000});
  CHECK(h.checksum == std::vector<uint64_t>{1000, 1001, 1002});
}

TEST_CASE(
    "restore plan: a cut missing a piece falls back to an older complete "
    "cut and the missing pieces are named") {
  // Generation 3 cut for world 4 lacks pieces 1 and 3 (their holders
  // died); generation 1's cut for world 4 is complete and is taken.
  std::vector<std::vector<OfferedCopy>> offers = {
      {Copy(3, 4, 0), Copy(1, 4, 0), Copy(1, 4, 1)},
      {Copy(3, 4, 2), Copy(1, 4, 2), Copy(1, 4, 3)},
  };
  CutChoice c = ChooseCut(offers);
  REQUIRE(c.cut.has_value());
  CHECK(c.cut->layout_generation == 1);
  CHECK(c.cut->world == 4);
  // No complete cut: the newest one's gap is named.
  offers = {{Copy(3, 4, 0)}, {Copy(3, 4, 2), Copy(1, 2, 0)}};
  c = ChooseCut(offers);
  CHECK(!c.cut.has_value());
  CHECK(c.missing == "the pieces of slots 1, 3 (world 4, generation 3)");
  offers = {{Copy(2, 2, 0)}};
  c = ChooseCut(offers);
  CHECK(c.missing == "the piece of slot 1 (world 2, generation 2)");
  c = ChooseCut({{}, {}});
  CHECK(!c.cut.has_value());
  CHECK(c.missing.empty());
}

TEST_CASE(
    "restore plan: a copy that failed its check or names a slot outside "
    "its world is never used") {
  std::vector<std::vector<OfferedCopy>> offers = {
      {Copy(1, 2, 0), Copy(1, 2, 1, /*good=*/false)},
      {Copy(1, 2, 5), Copy(1, 2, -1)},
  };
  CutChoice c = ChooseCut(offers);
  CHECK(!c.cut.has_value());
  CHECK(c.missing == "the piece of slot 1 (world 2, generation 1)");
  // A good copy of piece 1 elsewhere completes it, and only that holder
  // is listed for it.
  offers[1].push_back(Copy(1, 2, 1));
  c = ChooseCut(offers);
  REQUIRE(c.cut.has_value());
  CHECK(c.cut->holders.by_slot[1] == std::vector<int>{1});
  // Of two complete cuts of one generation (the world changed within it),
  // the larger world's is taken, as the newest.
  offers = {{Copy(1, 2, 0), Copy(1, 3, 0), Copy(1, 3, 1), Copy(1, 3, 2)},
            {Copy(1, 2, 1)}};
  c = ChooseCut(offers);
  REQUIRE(c.cut.has_value());
  CHECK(c.cut->world == 3);
}
