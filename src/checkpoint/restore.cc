#include "src/checkpoint/restore.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "holdfast/status.h"
#include "src/checkpoint/peer_memory.h"
#include "src/checkpoint/pieces.h"
#include "src/common/host_key.h"
#include "src/common/logging.h"
#include "src/common/status_util.h"
#include "src/common/thread_util.h"

namespace holdfast::checkpoint {
namespace {

// The words each member contributes to a restore's first all-gather:
// these, then its same-host words (Restore::HostWord).
enum RestoreWord {
  kCommitted,
  kHigh,
  kLayout,
  kHeld,
  kHost,
  kRestoreWords = kHost + Restore::kHostWords
};

// A hash of a buffer: the whole of it up to 1 MiB (which covers per-slot
// values such as an RNG state), else of 256 blocks spread over it, so a
// start costs no pass over a large state.
uint64_t SampleHash(const uint8_t* data, size_t size) {
  constexpr size_t kWhole = size_t{1} << 20, kBlock = 4096, kBlocks = 256;
  if (size <= kWhole) return XXH3_64bits(data, size);
  uint64_t h = size;
  for (size_t i = 0; i < kBlocks; ++i) {
    const size_t at = i * (size - kBlock) / (kBlocks - 1);
    h = XXH3_64bits_withSeed(data + at, kBlock, h);
  }
  return h;
}

}  // namespace

std::vector<int64_t> PieceSets::Mine(int pieces) {
  return std::vector<int64_t>((static_cast<size_t>(pieces) + 63) / 64, 0);
}

void PieceSets::Add(std::vector<int64_t>* mine, int p) {
  (*mine)[static_cast<size_t>(p) / 64] |=
      static_cast<int64_t>(uint64_t{1} << (p % 64));
}

absl::StatusOr<PieceSets> PieceSets::Exchange(Communicator* comm, int world,
                                              std::vector<int64_t> mine) {
  PieceSets sets;
  sets.words = mine.size();
  sets.bits.resize(sets.words * static_cast<size_t>(world));
  HOLDFAST_RETURN_IF_ERROR(comm->AllGather(mine.data(), sets.bits.data(),
                                           sets.words, DataType::kInt64)
                               ->Wait());
  return sets;
}

bool PieceSets::Has(int m, int p) const {
  if (bits.empty()) return false;
  const uint64_t w = static_cast<uint64_t>(
      bits[static_cast<size_t>(m) * words + static_cast<size_t>(p) / 64]);
  return ((w >> (p % 64)) & 1) != 0;
}

absl::Status LayoutMismatch(int r, uint64_t theirs, int me, uint64_t mine) {
  return absl::InvalidArgumentError(absl::StrCat(
      "registered state differs between slots: slot ", r, " has layout hash ",
      theirs, ", slot ", me, " has ", mine,
      "; every slot must register the same names, kinds and sizes in the "
      "same order"));
}

absl::Status CheckReplicatedEqual(Communicator* comm, int world, int slot,
                                  const StateRegistry& state, bool* all_equal) {
  std::vector<int64_t> hashes;
  for (const StateBuffer& b : state.buffers()) {
    if (b.sharded) {
      hashes.push_back(0);
      continue;
    }
    hashes.push_back(static_cast<int64_t>(SampleHash(b.data, b.global)));
  }
  const uint64_t layout = state.LayoutHash();
  const int64_t mine[2] = {
      static_cast<int64_t>(layout),
      static_cast<int64_t>(XXH3_64bits(hashes.data(), hashes.size() * 8))};
  std::vector<int64_t> all(static_cast<size_t>(world) * 2);
  HOLDFAST_RETURN_IF_ERROR(
      comm->AllGather(mine, all.data(), 2, DataType::kInt64)->Wait());
  bool equal = true;
  for (int r = 0; r < world; ++r) {
    const int64_t* e = &all[static_cast<size_t>(r) * 2];
    if (e[0] != mine[0]) {
      return LayoutMismatch(r, static_cast<uint64_t>(e[0]), slot, layout);
    }
    equal = equal && e[1] == mine[1];
  }
  if (all_equal != nullptr) *all_equal = equal;
  if (equal) return absl::OkStatus();
  // Same layout, so the same count everywhere: which buffer, which slots.
  std::vector<int64_t> every(hashes.size() * static_cast<size_t>(world));
  HOLDFAST_RETURN_IF_ERROR(comm->AllGather(hashes.data(), every.data(),
                                           hashes.size(), DataType::kInt64)
                               ->Wait());
  for (size_t i = 0; i < hashes.size() && slot == 0; ++i) {
    for (int r = 1; r < world; ++r) {
      if (every[static_cast<size_t>(r) * hashes.size() + i] != every[i]) {
        HOLDFAST_LOG_WARN(
            "runtime: registered state '{}' differs between slots at the "
            "start (slot 0 and slot {} hold different bytes). Registered "
            "state is replicated: a restore rebuilds every slot's copy from "
            "pieces of all slots, so per-slot values would be mixed. Keep "
            "per-slot values (an RNG seeded by rank, a data position) out of "
            "registered state or derive them from the step",
            state.buffers()[i].name, r);
        return absl::OkStatus();
      }
    }
  }
  return absl::OkStatus();
}

PieceIo* Restore::io() const {
  static PieceIo plain;
  return hooks_.io != nullptr ? hooks_.io : &plain;
}

Restore::Restore(Communicator* comm, int world, int slot, StateRegistry* state,
                 Snapshots* snapshots, Progress* progress,
                 RestoreOptions options, RestoreHooks hooks)
    : comm_(comm),
      world_(world),
      slot_(slot),
      state_(state),
      snapshots_(snapshots),
      progress_(progress),
      options_(std::move(options)),
      hooks_(std::move(hooks)) {}

absl::StatusOr<Restore::Gathered> Restore::Gather(int64_t committed) {
  const uint64_t layout = state_->LayoutHash();
  int64_t mine[kRestoreWords];
  mine[kCommitted] = committed;
  mine[kHigh] = progress_->high_step;
  mine[kLayout] = static_cast<int64_t>(layout);
  mine[kHeld] = static_cast<int64_t>(snapshots_->count());
  FillHostWords(&mine[kHost]);
  Gathered g;
  std::vector<int64_t> all(static_cast<size_t>(world_) * kRestoreWords);
  HOLDFAST_RETURN_IF_ERROR(
      comm_->AllGather(mine, all.data(), kRestoreWords, DataType::kInt64)
          ->Wait());
  HOLDFAST_ASSIGN_OR_RETURN(g.in_place,
                            InPlaceReach(all, kRestoreWords, kHost));
  g.highs.resize(static_cast<size_t>(world_));
  g.states.resize(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    const int64_t* e = &all[static_cast<size_t>(r) * kRestoreWords];
    g.highs[static_cast<size_t>(r)] = e[kHigh];
    if (e[kLayout] != mine[kLayout]) {
      return LayoutMismatch(r, static_cast<uint64_t>(e[kLayout]), slot_,
                            layout);
    }
    g.states[static_cast<size_t>(r)] = {e[kCommitted], e[kHigh]};
    g.kmax = std::max(g.kmax, e[kHeld]);
  }
  return g;
}

absl::StatusOr<Restored> Restore::NoCopyLeft(int64_t target,
                                             const std::string& missing) {
  const std::string why =
      absl::StrCat("step ", target,
                   " cannot be restored from memory: no live member "
                   "holds a good copy of ",
                   missing.empty() ? std::string("any piece") : missing,
                   " (with replicas=", options_.replicas, " every piece has ",
                   options_.replicas + 1,
                   " copies; all of them are gone or failed their checksum)");
  HOLDFAST_ASSIGN_OR_RETURN(std::optional<Restored> from_live, FromLive(why));
  if (from_live.has_value()) return *from_live;
  progress_->live_step = -1;  // the disk tier writes the live state
  if (options_.checkpoint_dir.empty()) {
    return absl::DataLossError(absl::StrCat(
        why, "; no disk tier is configured (HOLDFAST_CHECKPOINT_DIR)"));
  }
  HOLDFAST_LOG_WARN("restore: {}; falling back to the disk tier", why);
  absl::StatusOr<std::optional<Restored>> d = FromDisk(/*required=*/true);
  if (!d.ok()) {
    return absl::Status(d.status().code(),
                        absl::StrCat(why, "; ", d.status().message()));
  }
  return **d;
}

absl::StatusOr<Restored> Restore::FromMemory(int64_t committed) {
  HOLDFAST_ASSIGN_OR_RETURN(const Gathered g, Gather(committed));
  const Target chosen = ChooseTarget(g.states);
  const int64_t target = chosen.step;
  progress_->lost_steps = chosen.lost;
  // Snapshots past the target belong to a timeline that was abandoned.
  snapshots_->AbandonAfter(target);

  std::vector<Piece*> at;
  std::vector<bool> good_at;
  HOLDFAST_ASSIGN_OR_RETURN(const std::vector<std::vector<OfferedCopy>> offers,
                            OfferCopies(target, g.kmax, &at, &good_at));
  const CutChoice choice = ChooseCut(offers);
  if (!choice.cut.has_value()) return NoCopyLeft(target, choice.missing);

  const Holders& use = choice.cut->holders;
  const int64_t use_gen = choice.cut->layout_generation;
  const int old_world = choice.cut->world;

  // Transfers, in one order every member follows.
  state_->RepartitionAll(world_, slot_);
  std::map<int, const Piece*> local;
  for (size_t i = 0; i < at.size(); ++i) {
    const Piece* p = at[i];
    if (good_at[i] && p->layout_generation == use_gen &&
        p->world == old_world) {
      local.emplace(p->slot, p);
    }
  }
  HOLDFAST_ASSIGN_OR_RETURN(
      PieceSets live,
      LivePieces(target, g.highs, old_world, use.checksum, local));
  std::map<int, std::unique_ptr<Piece>> received;
  Restored out;
  out.step = target;
  progress_->live_step = -1;  // until the target is in the live state
  HOLDFAST_RETURN_IF_ERROR(
      ApplyTarget(Source{target, use_gen, old_world, use, local, g.in_place},
                  live, &received, &out));
  // The received copies ApplyTarget kept stay: they cover a second fault
  // before the next commit.
  for (auto& [p, piece] : received) snapshots_->Add(std::move(piece));
  out.received_state = out.bytes_received > 0;
  progress_->high_step = std::max(progress_->high_step, target);
  progress_->live_step = target;
  progress_->ledger = use.ledger[0];  // every member alike
  return out;
}

// What every member holds of step `target` (up to `kmax` copies each,
// checked against their checksums): this member's in `at`, with whether
// each is good in `good_at`.
absl::StatusOr<std::vector<std::vector<OfferedCopy>>> Restore::OfferCopies(
    int64_t target, int64_t kmax, std::vector<Piece*>* at,
    std::vector<bool>* good_at) {
  Communicator* const comm = comm_;
  // What this member holds of the target: [layout generation, world,
  // slot, checksum, good, address, ledger...], padded with world = 0.
  constexpr int kFields = 6 + pieces::kLedgerWords;
  std::vector<int64_t> entries(static_cast<size_t>(kmax) * kFields, 0);
  *at = snapshots_->At(target);
  good_at->assign(at->size(), false);
  const size_t offered = std::min(at->size(), static_cast<size_t>(kmax));
  std::vector<uint64_t> sums(offered);
  ForEachOnThreads(offered, kRestoreThreads, [&](size_t i) {
    sums[i] = pieces::Checksum((*at)[i]->bytes.get(), (*at)[i]->size);
  });
  for (size_t i = 0; i < offered; ++i) {
    const Piece& p = *(*at)[i];
    const bool good = sums[i] == p.checksum;
    (*good_at)[i] = good;
    if (!good) {
      HOLDFAST_LOG_ERROR(
          "restore: slot {}'s copy of the piece of slot {} (world {}, step "
          "{}) failed its checksum; it is not used",
          slot_, p.slot, p.world, p.step);
    }
    int64_t* e = &entries[i * kFields];
    e[0] = p.layout_generation;
    e[1] = p.world;
    e[2] = p.slot;
    e[3] = static_cast<int64_t>(p.checksum);
    e[4] = good ? 1 : 0;
    e[5] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p.bytes.get()));
    std::copy(p.ledger.begin(), p.ledger.end(), e + 6);
  }
  std::vector<int64_t> every(entries.size() * static_cast<size_t>(world_));
  HOLDFAST_RETURN_IF_ERROR(comm->AllGather(entries.data(), every.data(),
                                           entries.size(), DataType::kInt64)
                               ->Wait());
  std::vector<std::vector<OfferedCopy>> offers(static_cast<size_t>(world_));
  for (int m = 0; m < world_; ++m) {
    for (int64_t i = 0; i < kmax; ++i) {
      const int64_t* e =
          &every[(static_cast<size_t>(m) * static_cast<size_t>(kmax) +
                  static_cast<size_t>(i)) *
                 kFields];
      OfferedCopy c{e[0],
                    static_cast<int>(e[1]),
                    static_cast<int>(e[2]),
                    static_cast<uint64_t>(e[3]),
                    e[4] != 0,
                    static_cast<uint64_t>(e[5])};
      std::copy(e + 6, e + kFields, c.ledger.begin());
      offers[static_cast<size_t>(m)].push_back(c);
    }
  }
  return offers;
}

// Restore's fallback when a piece of the committed step has no good copy
// left and all state is replicated: the members whose live state is
// known to be a completed step (Progress::live_step) offer it, the newest such
// step is taken when every member holding it has the same hash, and the lowest
// of them broadcasts it to the others, who check it against that hash. nullopt
// when no member can offer (sharded state, or no member knows its live step);
// DataLoss when the holders disagree or a copy arrives damaged. `why`: why the
// pieces could not be used.
absl::StatusOr<std::optional<Restored>> Restore::FromLive(
    const std::string& why) {
  Communicator* const comm = comm_;
  if (!state_->ReplicatedOnly()) return std::nullopt;  // alike on every member
  int64_t mine[2] = {progress_->live_step, 0};
  if (progress_->live_step >= 0)
    mine[1] = static_cast<int64_t>(state_->LiveHash());
  std::vector<int64_t> all(static_cast<size_t>(world_) * 2);
  HOLDFAST_RETURN_IF_ERROR(
      comm->AllGather(mine, all.data(), 2, DataType::kInt64)->Wait());
  int64_t step = -1;
  for (int r = 0; r < world_; ++r) step = std::max(step, all[2 * r]);
  if (step < 0) return std::nullopt;
  int source = -1;
  std::vector<int> holders;
  for (int r = 0; r < world_; ++r) {
    if (all[2 * r] != step) continue;
    holders.push_back(r);
    if (source < 0) source = r;
    if (all[2 * r + 1] != all[2 * source + 1]) {
      return absl::DataLossError(absl::StrCat(
          why, "; the live state of step ", step,
          " cannot stand in for it: slot ", source, " and slot ", r,
          " hold it with different hashes (", absl::Hex(all[2 * source + 1]),
          ", ", absl::Hex(all[2 * r + 1]), ")"));
    }
  }
  const uint64_t want = static_cast<uint64_t>(all[2 * source + 1]);
  const bool receive = slot_ != source && progress_->live_step != step;
  progress_->live_step = -1;  // until the broadcast has landed and checked
  int64_t bytes = 0;
  for (const StateBuffer& b : state_->buffers()) {
    if (b.global == 0) continue;
    HOLDFAST_RETURN_IF_ERROR(
        comm->Broadcast(b.data, b.global, DataType::kUInt8, source)->Wait());
    bytes += static_cast<int64_t>(b.global);
  }
  HOLDFAST_RETURN_IF_ERROR(ShareLedger(source));
  if (state_->LiveHash() != want) {
    return absl::DataLossError(absl::StrCat(
        why, "; the live state of step ", step, " broadcast by slot ", source,
        " arrived at slot ", slot_, " with another hash"));
  }
  HOLDFAST_LOG_WARN(
      "restore: slot {}: {}; restored step {} from the live state of slot "
      "{} instead (slots {} hold it, with one hash)",
      slot_, why, step, source, absl::StrJoin(holders, ", "));
  return std::optional<Restored>(
      LiveLanded(step, receive ? bytes : 0, receive));
}

absl::Status Restore::ShareLedger(int source) {
  return comm_
      ->Broadcast(progress_->ledger.data(), pieces::kLedgerWords,
                  DataType::kInt64, source)
      ->Wait();
}

Restored Restore::LiveLanded(int64_t step, int64_t received, bool receive) {
  Restored out;
  out.step = step;
  out.bytes_received = received;
  out.received_state = receive;
  progress_->lost_steps = std::max<int64_t>(0, progress_->high_step - step);
  progress_->high_step = std::max(progress_->high_step, step);
  progress_->live_step = step;
  return out;
}

void Restore::FillHostWords(int64_t* words) const {
  // Zeros but the pid when reads in place are off.
  const bool offer = options_.read_in_place && HostKey() != 0;
  words[kHostKey] = offer ? static_cast<int64_t>(HostKey()) : 0;
  words[kPid] = static_cast<int64_t>(getpid());
  words[kProbeAddress] =
      offer ? static_cast<int64_t>(
                  reinterpret_cast<uintptr_t>(options_.probe_word))
            : 0;
  words[kProbeValue] = static_cast<int64_t>(*options_.probe_word);
}

// Each member reads the probe word of every other member with its own
// host key (one small process_vm_readv each) and the results are
// all-gathered, when any two members share a host key at all (every
// member knows whether they do, so all take part or none).
absl::StatusOr<Restore::InPlace> Restore::InPlaceReach(
    const std::vector<int64_t>& all, size_t stride, size_t first) {
  Communicator* const comm = comm_;
  InPlace in_place;
  auto at = [&](int r, HostWord word) {
    return all[static_cast<size_t>(r) * stride + first + word];
  };
  std::set<int64_t> keys;
  bool shared = false;
  for (int r = 0; r < world_; ++r) {
    in_place.pids.push_back(at(r, kPid));
    if (at(r, kHostKey) != 0) shared |= !keys.insert(at(r, kHostKey)).second;
  }
  if (!shared) return in_place;
  const int64_t key = at(slot_, kHostKey);
  std::vector<int64_t> mine = PieceSets::Mine(world_);
  for (int r = 0; r < world_; ++r) {
    if (r != slot_ && key != 0 && at(r, kHostKey) == key &&
        peer_memory::Probe(at(r, kPid),
                           static_cast<uint64_t>(at(r, kProbeAddress)),
                           static_cast<uint64_t>(at(r, kProbeValue)))) {
      PieceSets::Add(&mine, r);
    }
  }
  HOLDFAST_ASSIGN_OR_RETURN(in_place.reach,
                            PieceSets::Exchange(comm, world_, mine));
  return in_place;
}

// The pieces of step `target` (cut for `old_world`) that members need
// and need not receive: with replicated state only, a member that
// finished no step after the target (`highs`, every member's newest
// step) hashes the live bytes of each piece it needs and does not hold;
// one that equals the piece's checksum is the target's already (a step
// that failed half-way may have changed some bytes: those pieces are
// received as usual). When commits keep up with the steps, survivors of
// a fault then receive nothing. When no member is at the target nothing
// is hashed or exchanged.
absl::StatusOr<PieceSets> Restore::LivePieces(
    int64_t target, const std::vector<int64_t>& highs, int old_world,
    const std::vector<uint64_t>& checksums,
    const std::map<int, const Piece*>& local) {
  Communicator* const comm = comm_;
  PieceSets live;
  if (!state_->ReplicatedOnly() ||
      std::find(highs.begin(), highs.end(), target) == highs.end()) {
    return live;
  }
  std::vector<int64_t> mine = PieceSets::Mine(old_world);
  int count = 0;
  if (progress_->high_step == target) {
    for (int p = 0; p < old_world; ++p) {
      if (local.count(p) > 0 || state_->PieceSize(old_world, p) == 0 ||
          !state_->NeedsPiece(world_, slot_, old_world, p)) {
        continue;
      }
      pieces::CopyHasher h;
      for (const StateBuffer& b : state_->buffers()) {
        const pieces::Range r = StateRegistry::PartOf(b, old_world, p);
        if (r.bytes > 0) h.Update(b.data + r.offset, r.bytes);
      }
      if (h.Digest() == checksums[static_cast<size_t>(p)]) {
        PieceSets::Add(&mine, p);
        ++count;
      }
    }
  }
  HOLDFAST_ASSIGN_OR_RETURN(live,
                            PieceSets::Exchange(comm, world_, std::move(mine)));
  if (count > 0) {
    HOLDFAST_LOG_INFO(
        "restore: slot {} already holds {} piece(s) of step {} live; they "
        "are not received",
        slot_, count, target);
  }
  return live;
}

// Restores from the disk tier's newest complete checkpoint. nullopt when
// there is none and it is not `required` (else DataLoss).
absl::StatusOr<std::pair<int64_t, int>> Restore::AgreeDiskStep() {
  const std::string& dir = options_.checkpoint_dir;
  absl::StatusOr<std::optional<pieces::DiskStep>> found =
      pieces::FindNewest(dir, state_->LayoutHash());
  int64_t mine[2] = {-1, 0};
  if (found.ok() && found->has_value()) {
    mine[0] = (*found)->step;
    mine[1] = (*found)->world;
  } else if (!found.ok()) {
    mine[0] = -2;
  }
  std::vector<int64_t> all(static_cast<size_t>(world_) * 2);
  HOLDFAST_RETURN_IF_ERROR(
      comm_->AllGather(mine, all.data(), 2, DataType::kInt64)->Wait());
  int64_t step = -1;
  int world = 0;
  bool refused = false;
  for (int r = 0; r < world_; ++r) {
    refused |= all[static_cast<size_t>(r) * 2] == -2;
    if (all[static_cast<size_t>(r) * 2] > step) {
      step = all[static_cast<size_t>(r) * 2];
      world = static_cast<int>(all[static_cast<size_t>(r) * 2 + 1]);
    }
  }
  if (!found.ok()) return found.status();
  if (refused) {
    return absl::InvalidArgumentError(
        "another slot refused the disk checkpoint (see its log)");
  }
  return std::make_pair(step, world);
}

absl::Status Restore::ReadDiskPieces(int64_t step, int world, int64_t* read) {
  const std::string& dir = options_.checkpoint_dir;
  const uint64_t layout = state_->LayoutHash();
  std::vector<uint8_t> data;
  for (int p = 0; p < world; ++p) {
    if (!state_->NeedsPiece(world_, slot_, world, p)) continue;
    pieces::PieceHeader h;
    const std::string path = pieces::PiecePath(dir, step, world, p);
    HOLDFAST_RETURN_IF_ERROR(pieces::ReadPiece(path, layout, &h, &data));
    if (data.size() != state_->PieceSize(world, p)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint piece ", path, " holds ", data.size(),
                       " bytes; ", state_->PieceSize(world, p), " expected"));
    }
    state_->ApplyPiece(data.data(), world, p, world_, slot_);
    if (read[1] == INT64_MAX) {
      read[1] = p;
      std::copy(h.ledger.begin(), h.ledger.end(), read + 2);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Restored>> Restore::FromDisk(bool required) {
  const std::string& dir = options_.checkpoint_dir;
  HOLDFAST_ASSIGN_OR_RETURN(const auto newest, AgreeDiskStep());
  const auto [step, world] = newest;
  if (step < 0) {
    if (!required) return std::optional<Restored>();
    return absl::DataLossError(absl::StrCat("the disk tier in ", dir,
                                            " holds no complete checkpoint"));
  }
  state_->RepartitionAll(world_, slot_);
  // [ok, the lowest piece read, its ledger]: every member goes on with the
  // ledger of the lowest piece any member read.
  constexpr size_t kWords = 2 + pieces::kLedgerWords;
  int64_t mine_read[kWords] = {1, INT64_MAX};
  const absl::Status s = ReadDiskPieces(step, world, mine_read);
  mine_read[0] = s.ok() ? 1 : 0;
  std::vector<int64_t> reads(static_cast<size_t>(world_) * kWords);
  HOLDFAST_RETURN_IF_ERROR(
      comm_->AllGather(mine_read, reads.data(), kWords, DataType::kInt64)
          ->Wait());
  if (!s.ok()) return s;
  const int64_t* lowest = nullptr;
  for (int r = 0; r < world_; ++r) {
    const int64_t* e = &reads[static_cast<size_t>(r) * kWords];
    if (e[0] == 0) {
      return absl::DataLossError(absl::StrCat(
          "slot ", r, " could not read the disk checkpoint of step ", step,
          " in ", dir, " (see its log)"));
    }
    if (lowest == nullptr || e[1] < lowest[1]) lowest = e;
  }
  if (lowest != nullptr && lowest[1] != INT64_MAX) {
    std::copy(lowest + 2, lowest + kWords, progress_->ledger.begin());
  }
  progress_->lost_steps = std::max<int64_t>(0, progress_->high_step - step);
  Restored out;
  out.step = step;
  out.from_disk = true;
  HOLDFAST_LOG_WARN("restore: slot {} restored step {} from the disk tier",
                    slot_, step);
  return std::optional<Restored>(out);
}

}  // namespace holdfast::checkpoint
