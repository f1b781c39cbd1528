#include "src/checkpoint/backup.h"

#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "holdfast/status.h"
#include "src/common/logging.h"
#include "src/common/thread_util.h"

namespace holdfast::checkpoint {
namespace {

// The slots wait for every slot to reach the same snapshot; that may take
// as long as a training step, so their agreement has no deadline of its
// own (a failure aborts the side communicator instead).
constexpr absl::Duration kAgreeTimeout = absl::Hours(24);

// How long a slot that acked a round waits for its commit before the
// round's verdict exchange (the commit comes first in the usual case, a
// fraction of a millisecond after the last ack). A slot that did not ack
// goes straight to the exchange, so when one found a damaged copy (or did
// not fence its deferred copy) the others learn it this much later, and
// their backup threads start no round meanwhile (one snapshot waits,
// later ones are skipped). It should exceed the ack-to-commit trip
// (docs/benchmarks.md); where the trip takes longer the exchange merely
// runs during it.
constexpr absl::Duration kVerdictAfter = absl::Milliseconds(5);

// Sets v[0..n) to its element-wise maximum over the members of `c` (a
// small all-reduce is one exchange in the Gloo backend).
absl::Status AgreeMax(Communicator* c, int64_t* v, size_t n) {
  OpOptions o;
  o.timeout = kAgreeTimeout;
  return c->AllReduce(v, n, DataType::kInt64, ReduceOp::kMax, o)->Wait();
}

// A copy this member keeps for an owner, as it arrives.
struct Incoming {
  std::unique_ptr<Piece> piece;
  pieces::CopyHasher hasher;
  bool damaged = false;  // arrived with another checksum than sent
};

class Round {
 public:
  Round(Piece* own, Communicator* side, bulk::Links* links,
        Snapshots* snapshots, const StateRegistry& state,
        const BackupHooks& hooks, RoundResult* out)
      : own_(own),
        side_(side),
        links_(links),
        snapshots_(snapshots),
        state_(state),
        hooks_(hooks),
        out_(out),
        s_(own->step),
        gen_(own->layout_generation),
        me_(own->slot) {}

  absl::StatusOr<bool> Run();

 private:
  // The agreement on the step; false when the slots offered different
  // steps (then out_->again is set).
  // `verify`: this generation checks copies on arrival.
  absl::StatusOr<bool> Agree(bool verify, bool* verdicts);
  // Moves the bytes. `good`: every copy this member keeps arrived intact.
  absl::Status Transfer(const BackupPlacement& placement, bool* good);
  // The buddies of this member's own piece; makes room in got_ for the
  // copies it keeps for others.
  std::vector<int> Allocate(const BackupPlacement& placement);
  // The sends of the own piece to `buddies`, a job per link: the first
  // link hashes the piece as it sends (with `hash`), the others wait for
  // its digest before they send the checksum.
  struct OwnDigest {
    pieces::CopyHasher hasher;
    absl::Notification done;
    bool ok = false;  // written before `done` is notified
  };
  void AddSends(const std::vector<int>& buddies, bool hash, OwnDigest* digest,
                std::vector<std::function<absl::Status()>>* jobs);
  // The receives of the copies in got_, a job per link; each hashes its
  // chunks as they land with `verify`.
  void AddReceives(bool verify,
                   std::vector<std::function<absl::Status()>>* jobs);
  // After the ack: the verdicts, the commit, and what follows it.
  absl::StatusOr<bool> Settle(bool good, bool verdicts);

  Piece* const own_;
  Communicator* const side_;
  bulk::Links* const links_;
  Snapshots* const snapshots_;
  const StateRegistry& state_;
  const BackupHooks& hooks_;
  RoundResult* const out_;
  const int64_t s_;
  const int64_t gen_;
  const int me_;
  std::vector<std::unique_ptr<Incoming>> got_;
  int64_t moved_ = 0;
  int64_t transfer_us_ = 0;
  bool may_commit_ = false;
};

absl::StatusOr<bool> Round::Run() {
  const BackupPlacement placement = snapshots_->placement();
  if (placement.generation != gen_) {
    return absl::AbortedError("the placement is of another generation");
  }
  // Until it is acked (and may commit), a piece whose round failed is
  // dropped: no step can commit without it.
  absl::Cleanup drop_unless_may_commit = [this] {
    if (!may_commit_ && !out_->again) snapshots_->Drop(own_);
  };
  bool verdicts = false;
  HOLDFAST_ASSIGN_OR_RETURN(const bool same,
                            Agree(placement.verify, &verdicts));
  if (!same) return false;
  bool good = true;
  HOLDFAST_RETURN_IF_ERROR(Transfer(placement, &good));
  // A deferred piece is acked only if the trainer fenced its copy.
  if (good && own_->deferred) {
    const absl::Time gate_start = absl::Now();
    good = snapshots_->AwaitValidated(own_, gen_);
    out_->clock.gated = absl::Now() - gate_start;
  }
  if (good) {
    // This slot holds its piece and good copies of its owners' pieces: it
    // acks now, and the verdict travels while the ack does. The copies
    // are kept first: once every slot acked, the step can commit even if
    // this round fails from here on.
    for (auto& in : got_) snapshots_->Add(std::move(in->piece));
    may_commit_ = true;
    out_->clock.acked = absl::Now();
    hooks_.ack(s_, gen_);
    snapshots_->SetIdleRound(true);
  }
  return Settle(good, verdicts);
}

absl::StatusOr<bool> Round::Agree(bool verify, bool* verdicts) {
  // Each slot's step, and whether its piece is copied during a step (then
  // it acks only if the trainer fenced the copy, so every slot needs the
  // verdicts even without checks on arrival): the maximum of {step,
  // -step, deferred} over the slots gives the newest and the oldest step
  // offered and whether any piece was deferred.
  int64_t agreed[3] = {s_, -s_, own_->deferred ? 1 : 0};
  snapshots_->SetIdleRound(true);
  const absl::Status st = AgreeMax(side_, agreed, 3);
  snapshots_->SetIdleRound(false);
  HOLDFAST_RETURN_IF_ERROR(st);
  *verdicts = verify || agreed[2] != 0;
  const int64_t newest = agreed[0];
  const int64_t oldest = -agreed[1];
  if (newest == oldest) return true;
  // Some slot snapshotted another step (its previous backup was still
  // running when one of them was offered): nobody backs this round up.
  // The slots that offered the newest step offer it again and the others
  // drop theirs, so the next round pairs the same step. (Were every piece
  // dropped, a slot that always reaches its snapshot after the others end
  // the round would offer the step before theirs in every round from then
  // on.)
  out_->again = newest == s_;
  HOLDFAST_LOG_DEBUG(
      "backup: slot {} offered step {} to a round where the slots offered "
      "steps {} to {}: nothing is backed up; {}",
      me_, s_, oldest, newest,
      out_->again ? "step offered again" : "piece dropped");
  return false;
}

std::vector<int> Round::Allocate(const BackupPlacement& placement) {
  const int world = own_->world;
  std::vector<int> own_buddies;
  for (int o = 0; o < world; ++o) {
    for (int b : placement.buddies[static_cast<size_t>(o)]) {
      const size_t size = state_.PieceSize(world, o);
      if (size == 0) continue;
      if (me_ == o) {
        own_buddies.push_back(b);
      } else if (me_ == b) {
        auto in = std::make_unique<Incoming>();
        in->piece = snapshots_->NewPiece(s_, gen_, world, o, 0);
        got_.push_back(std::move(in));
      } else {
        continue;
      }
      moved_ += static_cast<int64_t>(size);
    }
  }
  return own_buddies;
}

void Round::AddSends(const std::vector<int>& buddies, bool hash,
                     OwnDigest* digest,
                     std::vector<std::function<absl::Status()>>* jobs) {
  for (size_t i = 0; i < buddies.size(); ++i) {
    jobs->push_back([this, &buddies, hash, digest, i]() -> absl::Status {
      Piece* own = own_;
      if (i == 0 && hash) {
        absl::Cleanup notify = [digest] { digest->done.Notify(); };
        HOLDFAST_RETURN_IF_ERROR(links_->SendPiece(
            buddies[i], s_, own->bytes.get(), own->size, &digest->hasher));
        own->checksum = digest->hasher.Digest();
        digest->ok = true;
      } else {
        HOLDFAST_RETURN_IF_ERROR(links_->SendPiece(
            buddies[i], s_, own->bytes.get(), own->size, nullptr));
        if (hash) {
          digest->done.WaitForNotification();
          if (!digest->ok) {
            return absl::AbortedError(absl::StrCat(
                "the checksum of slot ", me_, "'s piece of step ", s_,
                " was not computed: its first backup link failed"));
          }
        }
      }
      return links_->SendTrailer(buddies[i], {own->checksum, own->ledger});
    });
  }
}

void Round::AddReceives(bool verify,
                        std::vector<std::function<absl::Status()>>* jobs) {
  std::vector<int> owners;  // ascending, as got_
  for (const auto& in : got_) owners.push_back(in->piece->slot);
  hooks_.io->Receiving(s_, owners);
  for (auto& in : got_) {
    jobs->push_back([this, verify, p = in.get()]() -> absl::Status {
      Piece& piece = *p->piece;
      HOLDFAST_RETURN_IF_ERROR(links_->RecvPiece(
          piece.slot, s_, piece.bytes.get(), piece.size,
          [&](size_t off, size_t n) {
            hooks_.io->Landed(s_, piece.slot, piece.bytes.get(), off, n);
            if (verify) p->hasher.Update(piece.bytes.get() + off, n);
          }));
      absl::StatusOr<bulk::PieceTrailer> sent = links_->RecvTrailer(piece.slot);
      if (!sent.ok()) return sent.status();
      piece.checksum = sent->checksum;
      piece.ledger = sent->ledger;
      p->damaged = verify && p->hasher.Digest() != sent->checksum;
      return absl::OkStatus();
    });
  }
}

absl::Status Round::Transfer(const BackupPlacement& placement, bool* good) {
  // The bytes go on the backup links, a thread per link (this one takes
  // the last). The owner hashes each chunk of its piece just before
  // writing it (a deferred piece was hashed as it was copied) and sends
  // the checksum right after them, on the same thread; each receiver
  // hashes the chunks as they land and, on its thread, reads the checksum
  // and compares (with checks on arrival; else a restore does). So a
  // link's check does not wait for the others' bytes.
  const absl::Time transfer_start = absl::Now();
  const std::vector<int> own_buddies = Allocate(placement);
  const bool hash_own = !own_->deferred && !own_buddies.empty();
  OwnDigest digest;
  std::vector<std::function<absl::Status()>> jobs;
  AddSends(own_buddies, hash_own, &digest, &jobs);
  AddReceives(placement.verify, &jobs);
  bulk::Links* links = links_;
  const absl::Status st =
      RunJobs("the backup round", jobs,
              [links](absl::string_view why) { links->Abort(why); });
  if (!own_->deferred && !hash_own) {
    own_->checksum = pieces::Checksum(own_->bytes.get(), own_->size);
  }
  transfer_us_ = absl::ToInt64Microseconds(absl::Now() - transfer_start);
  HOLDFAST_RETURN_IF_ERROR(st);
  for (auto& in : got_) {
    if (!in->damaged) continue;
    HOLDFAST_LOG_ERROR(
        "backup: the backup of slot {}'s piece of step {} arrived corrupt; "
        "the step is not committed",
        in->piece->slot, s_);
    *good = false;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Round::Settle(bool good, bool verdicts) {
  RoundClock& clock = out_->clock;
  if (verdicts) {
    // A slot that found a damaged copy (or whose deferred copy was not
    // fenced) did not ack, so the step never commits: everyone learns it
    // here and drops the step, instead of waiting for that commit.
    // Unchecked copies of pieces copied between the steps have no verdict
    // to share. A slot that acked first waits (bounded) for the commit,
    // which then comes before this exchange rather than during it: the
    // exchange's wake-ups do not compete with the commit's on a busy
    // host (see kVerdictAfter).
    if (good && hooks_.await_decided(s_, gen_, absl::Now() + kVerdictAfter) &&
        hooks_.committed() >= s_) {
      clock.seen = absl::Now();
    }
    int64_t bad = good ? 0 : 1;  // on any slot: the step is dropped
    HOLDFAST_RETURN_IF_ERROR(AgreeMax(side_, &bad, 1));
    if (bad != 0) {
      // The copies of this round, if kept (the cleanup drops own).
      may_commit_ = false;
      const int64_t s = s_, gen = gen_;
      const Piece* own = own_;
      snapshots_->Evict([s, gen, own](const Piece& p) {
        return p.step == s && p.layout_generation == gen && &p != own;
      });
      return false;
    }
  } else if (!good) {
    return false;
  }
  out_->moved = moved_;
  out_->transfer_us = transfer_us_;
  hooks_.await_decided(s_, gen_, absl::InfiniteFuture());
  if (hooks_.committed() < s_) return false;
  if (clock.seen == absl::InfinitePast()) clock.seen = absl::Now();
  // Older steps are superseded everywhere, but for the newest few commits
  // (a rollback past a numeric anomaly).
  snapshots_->Committed(s_);
  if (hooks_.after_commit) hooks_.after_commit(own_);
  return true;
}

}  // namespace

absl::StatusOr<bool> BackupRound(Piece* own, Communicator* side,
                                 bulk::Links* links, Snapshots* snapshots,
                                 const StateRegistry& state,
                                 const BackupHooks& hooks, RoundResult* out) {
  return Round(own, side, links, snapshots, state, hooks, out).Run();
}

}  // namespace holdfast::checkpoint
