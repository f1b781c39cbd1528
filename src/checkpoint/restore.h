// The restore: every member of a new generation rolls back to the newest
// committed step, from the pieces the members hold in memory, from the
// live state where no copy of a piece is left, or from the disk tier
// (docs/checkpoint.md, docs/recovery.md). The choices are the pure
// functions of restore_plan.h; this runs them and moves the bytes.
//
// Every member of the generation runs the same restore at the same time
// (its collectives pair up), on its training thread, with the backup
// thread quiesced (Snapshots::Quiesce).
#ifndef HOLDFAST_SRC_CHECKPOINT_RESTORE_H_
#define HOLDFAST_SRC_CHECKPOINT_RESTORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "holdfast/communicator.h"
#include "src/checkpoint/piece_io.h"
#include "src/checkpoint/restore_plan.h"
#include "src/checkpoint/snapshots.h"
#include "src/checkpoint/state.h"

namespace holdfast::checkpoint {

// What the training thread knows of its own progress. A restore reads it
// and sets it.
struct Progress {
  int64_t high_step = 0;  // the newest step this member completed
  // The completed step the live registered state is at, or -1 when that
  // is not known (a step failed after its fence, a restore was cut short,
  // a standby that never trained).
  int64_t live_step = -1;
  int64_t lost_steps = 0;  // the steps the last restore rolled back
  // This member's ledger (pieces::Ledger), which its snapshots carry.
  pieces::Ledger ledger{};
};

struct RestoreOptions {
  int replicas = 1;            // copies a commit leaves besides the owner's
  std::string checkpoint_dir;  // the disk tier; empty: none
  bool read_in_place = true;   // read pieces of peers on this host in place
  // A word of this process, never 0, that peers on this host read to find
  // out whether they may read its memory. Outlives the restore.
  const uint64_t* probe_word = nullptr;
};

// Where a test's faults enter a restore (the runtime's fault injection).
struct RestoreHooks {
  // Called once every member knows where the others' copies lie, before
  // any piece moves.
  std::function<void()> before_transfers;
  // The I/O of the pieces this member takes (null: the plain one);
  // outlives the restore.
  PieceIo* io = nullptr;
};

struct Restored {
  int64_t step = -1;
  int64_t bytes_received = 0;
  int64_t bytes_read_in_place = 0;  // of bytes_received
  bool received_state = false;
  bool from_disk = false;
};

// Per member, a set of piece numbers (those it holds live, those whose
// received copy failed; or members, for who may read whom in place):
// piece p is bit p of the member's words. Each member fills its own (Mine,
// Add) and Exchange all-gathers them. Empty: nobody has any.
struct PieceSets {
  size_t words = 0;           // per member
  std::vector<int64_t> bits;  // member m's at [m * words]
  static std::vector<int64_t> Mine(int pieces);
  static void Add(std::vector<int64_t>* mine, int p);
  static absl::StatusOr<PieceSets> Exchange(Communicator* comm, int world,
                                            std::vector<int64_t> mine);
  bool Has(int m, int p) const;
};

class Restore {
 public:
  // `comm`: a communicator of this generation with host buffers, on which
  // this member is `slot` of `world`. The pointers outlive the restore.
  Restore(Communicator* comm, int world, int slot, StateRegistry* state,
          Snapshots* snapshots, Progress* progress, RestoreOptions options,
          RestoreHooks hooks);

  // Rolls every member back to the newest committed step (`committed`:
  // the controller's, as this member knows it). Each member says which
  // pieces of that step it holds (after checking their checksums); the
  // pieces of the newest world cut that is complete are used, each member
  // receiving the ones it needs and lacks from the lowest member holding a
  // good copy (one damaged in transit comes again from the next). With a
  // piece lost everywhere: the live state, then the disk tier, else
  // DataLoss naming it.
  absl::StatusOr<Restored> FromMemory(int64_t committed);

  // Goes on from the newest live state instead, when that is a completed
  // step past `committed` and all state is replicated: the members whose
  // live state is that step (the holders; all with one hash, else
  // nullopt) keep it, and every other member receives an equal share of
  // each buffer from each holder at once, checked against the hash.
  // nullopt, having changed no holder's state, when it cannot (then
  // FromMemory): no such step, sharded state, layouts or hashes that
  // differ, a copy that arrived damaged.
  absl::StatusOr<std::optional<Restored>> FromLiveAhead(int64_t committed);

  // Restores the disk tier's newest complete checkpoint. nullopt when
  // there is none and it is not `required` (else DataLoss).
  absl::StatusOr<std::optional<Restored>> FromDisk(bool required);

  // The words a member says about itself so that peers on its host may
  // read its memory in place: its host key (0: it offers no reads in
  // place), its pid, and the address (0 with no host key) and value of
  // its probe word (RestoreOptions::probe_word).
  enum HostWord { kHostKey, kPid, kProbeAddress, kProbeValue, kHostWords };

  // Transfers between members go in chunks of kChunkBytes, so one op stays
  // well inside its deadline and the receiver's progress shows in the
  // trace.
  static constexpr size_t kChunkBytes = size_t{64} << 20;

 private:
  // A restore checks the copies a member holds, and reads pieces in
  // place, on up to kRestoreThreads threads, a piece at a time each. A
  // piece read in place goes in chunks of kReadChunk, each hashed (and
  // copied into the live state, for a piece whose copy is kept) while it
  // is in the cache.
  static constexpr size_t kReadChunk = size_t{1} << 20;
  static constexpr size_t kRestoreThreads = 4;
  static constexpr uint32_t kRestoreTag = 0x5e570;

  // Who may read whose memory in place (bit r of member m's words: m
  // reads member r's), and every member's pid.
  struct InPlace {
    PieceSets reach;
    std::vector<int64_t> pids;
  };

  // The newest disk checkpoint any member sees, (step, world): step -1
  // for none. InvalidArgument when a member refused its disk tier.
  absl::StatusOr<std::pair<int64_t, int>> AgreeDiskStep();
  // Reads the pieces this member needs of disk step `step` (cut for
  // `world`) into the live state; read[1..] become the lowest piece read
  // and its ledger.
  absl::Status ReadDiskPieces(int64_t step, int world, int64_t* read);
  // The exchange a restore from memory starts with: every member's
  // committed and highest step, layout, copies held and same-host words.
  struct Gathered {
    InPlace in_place;
    int64_t kmax = 1;
    std::vector<int64_t> highs;
    std::vector<MemberState> states;
  };
  absl::StatusOr<Gathered> Gather(int64_t committed);
  // The fallback when step `target` has a piece with no good copy left
  // (`missing`): the live state, then the disk tier, else DataLoss.
  absl::StatusOr<Restored> NoCopyLeft(int64_t target,
                                      const std::string& missing);
  absl::StatusOr<std::vector<std::vector<OfferedCopy>>> OfferCopies(
      int64_t target, int64_t kmax, std::vector<Piece*>* at,
      std::vector<bool>* good_at);
  // The fallback when a piece has no good copy left (`why`): the live
  // state of replicated-only state (nullopt where it cannot stand in).
  absl::StatusOr<std::optional<Restored>> FromLive(const std::string& why);
  // The end of a restore from the live state (FromLive, FromLiveAhead):
  // every member goes on with slot `source`'s ledger, as a restore from
  // memory gives every member the ledger of the target's piece 0.
  absl::Status ShareLedger(int source);
  // And then: the live state is at `step`, `received` bytes of it
  // received (`receive`: this member took it from others).
  Restored LiveLanded(int64_t step, int64_t received, bool receive);
  // Who may read whose live state in place in FromLiveAhead, and where
  // each member's buffers lie (none: no receiver may read a holder).
  struct LiveReach {
    int64_t step = -1;  // the live step restored
    InPlace in_place;
    size_t buffers = 0;              // per member
    std::vector<int64_t> addresses;  // member m's buffer b: [m * buffers + b]
    bool Reads(int m, int from) const {
      return !addresses.empty() && in_place.reach.Has(m, from);
    }
    uint64_t Address(int m, size_t b) const {
      return static_cast<uint64_t>(
          addresses[static_cast<size_t>(m) * buffers + b]);
    }
  };
  // From FromLiveAhead's all-gathered words: who may read whom; and, when
  // any receiver may read a holder, every member's buffer addresses (one
  // all-gather), and who can read whose buffers indeed (one more).
  absl::StatusOr<LiveReach> LiveReachOf(int64_t step,
                                        const std::vector<int64_t>& all,
                                        const std::vector<int>& holders,
                                        const std::vector<int>& receivers);
  // What MoveLiveShares brought this member: bytes, of them read in
  // place, and (a receiver's) the checksums of the live state's blocks
  // (StateRegistry::LiveBlocks) as they landed.
  struct LiveMoved {
    int64_t received = 0;
    int64_t read_in_place = 0;
    std::vector<uint64_t> checksums;
  };
  // Blocks [first, first + count) of buffer `buffer`
  // (StateRegistry::LiveBlock), from member `from`.
  struct LiveRun {
    int from;
    size_t buffer;
    size_t first;
    size_t count;
  };
  // A receiver's end of MoveLiveShares: reads `reads` in place on its
  // threads while `works` (its receives of `arrivals`) go on, waits for
  // them, and checksums every block into moved->checksums as it lands.
  absl::Status LandLive(const std::vector<LiveRun>& reads,
                        const std::vector<LiveRun>& arrivals,
                        const LiveReach& reach,
                        std::vector<std::shared_ptr<Work>>* works,
                        LiveMoved* moved);
  // FromLiveAhead's transfers: each receiver takes holder h's share of
  // every buffer from it, read in place where `reach` allows it, else over
  // the communicator; `holder`: whether this member is one.
  absl::StatusOr<LiveMoved> MoveLiveShares(const std::vector<int>& holders,
                                           const std::vector<int>& receivers,
                                           bool holder, const LiveReach& reach);
  // This member's same-host words (HostWord) into words[0, kHostWords).
  void FillHostWords(int64_t* words) const;
  // Which members may read which members' memory in place, from the
  // all-gathered same-host words: member r's at all[r * stride + first].
  absl::StatusOr<InPlace> InPlaceReach(const std::vector<int64_t>& all,
                                       size_t stride, size_t first);
  absl::StatusOr<PieceSets> LivePieces(
      int64_t target, const std::vector<int64_t>& highs, int old_world,
      const std::vector<uint64_t>& checksums,
      const std::map<int, const Piece*>& local);
  // What a restore from memory goes back to: the step, the cut of its
  // pieces (layout generation, world), where their copies lie, this
  // member's own good copies, and who may read whose memory.
  struct Source {
    int64_t target;
    int64_t use_gen;
    int old_world;
    const Holders& use;
    const std::map<int, const Piece*>& local;
    const InPlace& in_place;
  };
  // ApplyTarget's transfers across their rounds.
  struct Transfers {
    std::vector<std::pair<int, int>> todo;  // (piece, member) still to move
    std::set<int> keep;     // received pieces this member keeps a copy of
    std::set<int> arrived;  // received pieces that passed their check
    absl::Status lost;      // a piece that failed from every holder
    std::map<int, std::unique_ptr<Piece>>* received;
    Restored* out;
  };
  // The pieces this member takes in one round, and how.
  struct RoundPlan {
    std::vector<std::shared_ptr<Work>> works;  // sends and receives posted
    std::map<int, int> sender;  // piece -> who sends it to this member
    std::vector<int> reads;     // pieces this member reads in place
    // Where each piece this member takes lands: its live buffers (the
    // pieces in `into_live`, read in place) or a piece buffer in
    // `received`.
    std::map<int, Segments> lands;
    std::set<int> into_live;
    // Kept pieces read in place whose bytes all go into the live state:
    // where, each chunk copied there from the cache as it lands.
    std::map<int, Segments> also_live;
    // The pieces read in place whose bytes go into the live state, hashed
    // chunk by chunk as they land.
    std::map<int, pieces::CopyHasher> live_hashes;
  };

  absl::Status ApplyTarget(const Source& src, const PieceSets& live,
                           std::map<int, std::unique_ptr<Piece>>* received,
                           Restored* out);
  // The copies received pieces keep: where a piece has fewer holders than
  // a commit leaves it (replicas + 1), by its first receivers.
  std::set<int> Keep(const Source& src,
                     const std::vector<std::pair<int, int>>& todo) const;
  // One round of ApplyTarget's transfers of t->todo, each from the holder
  // of index `round`; the pieces this member got right go to t->arrived,
  // and t->todo becomes what failed somewhere and has a next holder.
  absl::Status TransferRound(size_t round, const Source& src, Transfers* t);
  // Posts this member's sends and receives of the round, and plans its
  // reads in place.
  RoundPlan PlanRound(size_t round, const Source& src, Transfers* t);
  // The round's reads in place, on up to kRestoreThreads threads.
  absl::Status ReadRound(size_t round, const Source& src, RoundPlan& plan,
                         Restored* out);
  // Checks what arrived against the owners' checksums; every member learns
  // which pieces failed where (one all-gather).
  absl::Status CheckRound(size_t round, const Source& src, RoundPlan& plan,
                          Transfers* t);

  // Reads piece `p` in place from slot `from` (process `pid`, the copy at
  // `address`) into `lands`, chunk by chunk; with `h`, each chunk is hashed
  // (and copied on into `also`, if set) while it is in the cache.
  absl::Status ReadInPlace(int p, int from, int64_t pid, uint64_t address,
                           const Segments& lands, pieces::CopyHasher* h,
                           const Segments* also);
  // The piece I/O (RestoreHooks::io, or the plain one).
  PieceIo* io() const;

  // Copies what this member needs of a received `piece` (cut for
  // `old_world`) into the live state; the piece's hash.
  uint64_t ApplyReceived(const Piece& piece, int old_world);

  Communicator* const comm_;
  const int world_;
  const int slot_;
  StateRegistry* const state_;
  Snapshots* const snapshots_;
  Progress* const progress_;
  const RestoreOptions options_;
  const RestoreHooks hooks_;
};

// At a fresh start: replicated state must hold the same bytes on every
// slot, since a restore assembles each slot's copy from pieces of all
// slots. Warns, naming the first buffer that differs; a layout that
// differs is InvalidArgument. Collective over `comm` (host buffers).
// `equal`, if set: whether every replicated buffer held the same bytes.
absl::Status CheckReplicatedEqual(Communicator* comm, int world, int slot,
                                  const StateRegistry& state,
                                  bool* equal = nullptr);

// InvalidArgument: slot `r`'s state layout hash `theirs` differs from
// slot `me`'s `mine`.
absl::Status LayoutMismatch(int r, uint64_t theirs, int me, uint64_t mine);

}  // namespace holdfast::checkpoint

#endif  // HOLDFAST_SRC_CHECKPOINT_RESTORE_H_
