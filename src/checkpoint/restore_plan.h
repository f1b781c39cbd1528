// The restore's decisions, apart from the transfers: which step every
// member rolls back to, and which cut of it (a snapshot cut into pieces
// for one world, in one generation's layout) is taken from whom. Pure
// functions of what the members told each other, so every member, given
// the same all-gathered words, decides the same, and tests need no
// processes.
#ifndef HOLDFAST_SRC_CHECKPOINT_RESTORE_PLAN_H_
#define HOLDFAST_SRC_CHECKPOINT_RESTORE_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/checkpoint/pieces.h"

namespace holdfast::checkpoint {

// What one member said about itself at the start of a restore.
struct MemberState {
  int64_t committed = -1;  // the newest step it saw committed
  int64_t high = -1;       // the newest step it completed
};

struct Target {
  int64_t step = 0;  // the newest committed step any member saw
  int64_t lost = 0;  // steps done past it, to redo
};

// The step to restore: the newest committed step any member knows of (a
// commit seen by one was reached by all), and how many steps past it were
// done and are lost.
Target ChooseTarget(const std::vector<MemberState>& members);

// One copy of a piece of the target that a member holds.
struct OfferedCopy {
  int64_t layout_generation = 0;  // the generation whose world cut it
  int world = 0;                  // 0: padding, not a copy
  int slot = 0;                   // whose piece, in that world
  uint64_t checksum = 0;          // the owner's checksum of the piece
  bool good = false;              // it passed the holder's check
  uint64_t address = 0;           // where it lies in the holder's memory
  pieces::Ledger ledger{};        // the piece's metadata
};

// Of one cut: per piece, the members holding a good copy (in member
// order), where each holds it, and the checksum they report.
struct Holders {
  std::vector<std::vector<int>> by_slot;
  std::vector<std::vector<uint64_t>> address_by_slot;
  std::vector<uint64_t> checksum;
  std::vector<pieces::Ledger> ledger;  // each piece's metadata
};

struct Cut {
  int64_t layout_generation = 0;
  int world = 0;
  Holders holders;
};

struct CutChoice {
  // The newest cut (by layout generation, then world) with a good copy of
  // every piece; nullopt when there is none.
  std::optional<Cut> cut;
  // When there is none: the pieces the newest cut lacks, as "the pieces
  // of slots 1, 3 (world 4, generation 2)"; empty when nobody offered any
  // copy.
  std::string missing;
};

// `offers[m]`: the copies member m holds. Copies that are padding, not
// good, or name a slot outside their world are not used.
CutChoice ChooseCut(const std::vector<std::vector<OfferedCopy>>& offers);

}  // namespace holdfast::checkpoint

#endif  // HOLDFAST_SRC_CHECKPOINT_RESTORE_PLAN_H_
