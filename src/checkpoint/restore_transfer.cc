#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "holdfast/status.h"
#include "src/checkpoint/peer_memory.h"
#include "src/checkpoint/pieces.h"
#include "src/checkpoint/restore.h"
#include "src/common/logging.h"
#include "src/common/status_util.h"
#include "src/common/thread_util.h"

// Restore's transfers (ApplyTarget), in a file of their own.
namespace holdfast::checkpoint {
namespace {

// Posts the chunked sends of a piece's bytes to `peer`.
void PostSends(Communicator* c, const uint8_t* data, size_t size, int peer,
               const OpOptions& oo, std::vector<std::shared_ptr<Work>>* works) {
  constexpr size_t kChunk = Restore::kChunkBytes;
  for (size_t off = 0; off < size; off += kChunk) {
    works->push_back(c->Send(data + off, std::min(kChunk, size - off),
                             DataType::kUInt8, peer, oo));
  }
}

// Posts the chunked receives of piece `p`'s bytes from `peer`.
void PostRecvs(Communicator* c, Piece* p, int peer, const OpOptions& oo,
               std::vector<std::shared_ptr<Work>>* works) {
  constexpr size_t kChunk = Restore::kChunkBytes;
  for (size_t off = 0; off < p->size; off += kChunk) {
    works->push_back(c->Recv(p->bytes.get() + off,
                             std::min(kChunk, p->size - off), DataType::kUInt8,
                             peer, oo));
  }
}

}  // namespace

// The end of a restore: copies the target's pieces this member needs
// into its live buffers, from its own copies or received ones. Every
// piece some member needs and neither holds nor has live moves, in an
// order every member follows, from its first holder: read in place from
// the holder's memory where `in_place` says the member may (the holder
// sends nothing), else over the communicator. A piece read in place
// whose copy is not kept (see `keep`) is read straight into the live
// buffers and checked there; any other received piece is checked as it
// is copied into them (one pass over its bytes); one that fails
// (damaged in transit) is received again from its next holder, in a
// round every member takes part in: after each round with transfers the
// members exchange which pieces failed (one all-gather). DataLoss, naming
// the piece, when it failed from every holder; the live state it was
// partly copied into is then not used (the member does not go on).
absl::Status Restore::ApplyTarget(
    const Source& src, const PieceSets& live,
    std::map<int, std::unique_ptr<Piece>>* received, Restored* out) {
  const int old_world = src.old_world;
  // Every member knows where the others' copies lie now.
  if (hooks_.before_transfers) hooks_.before_transfers();
  Transfers t;
  t.received = received;
  t.out = out;
  for (int p = 0; p < old_world; ++p) {
    const std::vector<int>& hs = src.use.by_slot[static_cast<size_t>(p)];
    if (state_->PieceSize(old_world, p) == 0) continue;
    for (int m = 0; m < world_; ++m) {
      if (std::find(hs.begin(), hs.end(), m) == hs.end() && !live.Has(m, p) &&
          state_->NeedsPiece(world_, m, old_world, p)) {
        t.todo.emplace_back(p, m);
      }
    }
    auto l = src.local.find(p);
    if (l != src.local.end() &&
        state_->NeedsPiece(world_, slot_, old_world, p) &&
        !live.Has(slot_, p)) {
      state_->ApplyPiece(l->second->bytes.get(), old_world, p, world_, slot_);
    }
  }
  t.keep = Keep(src, t.todo);
  for (size_t round = 0; !t.todo.empty(); ++round) {
    HOLDFAST_RETURN_IF_ERROR(TransferRound(round, src, &t));
  }
  if (!t.lost.ok()) return t.lost;
  for (int p = 0; p < old_world; ++p) {
    if (state_->PieceSize(old_world, p) > 0 &&
        state_->NeedsPiece(world_, slot_, old_world, p) &&
        !live.Has(slot_, p) && src.local.count(p) == 0 &&
        t.arrived.count(p) == 0) {
      return absl::InternalError(
          absl::StrCat("restore: the piece of slot ", p, " never arrived"));
    }
  }
  return absl::OkStatus();
}

absl::Status Restore::ReadInPlace(int p, int from, int64_t pid,
                                  uint64_t address, const Segments& lands,
                                  pieces::CopyHasher* h, const Segments* also) {
  absl::Status s;
  size_t done = 0;  // of the piece's bytes
  for (const auto& [dst, bytes] : lands) {
    for (size_t off = 0; s.ok() && off < bytes; off += kReadChunk) {
      const size_t n = std::min(kReadChunk, bytes - off);
      s = io()->Read(p, pid, address + off, dst + off, n);
      if (h == nullptr || !s.ok()) continue;
      if (also != nullptr) {
        checkpoint::CopyInto(*also, done + off, dst + off, n, h);
      } else {
        h->Update(dst + off, n);
      }
    }
    if (!s.ok()) break;
    address += bytes;
    done += bytes;
  }
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "restore: the piece of slot ", p, " could not be read from slot ", from,
        " on this host: ", s.message()));
  }
  return absl::OkStatus();
}

uint64_t Restore::ApplyReceived(const Piece& piece, int old_world) {
  pieces::CopyHasher h;
  state_->ApplyPiece(piece.bytes.get(), old_world, piece.slot, world_, slot_,
                     &h);
  return h.Digest();
}

std::set<int> Restore::Keep(
    const Source& src, const std::vector<std::pair<int, int>>& todo) const {
  // A received copy is kept (it covers a second fault before the next
  // commit) where the piece has fewer holders than a commit leaves it
  // (replicas + 1): by its first receivers, as many as are missing. A
  // piece read in place and not kept goes straight into the live state.
  std::set<int> keep;
  std::vector<int> missing(static_cast<size_t>(src.old_world));
  for (int p = 0; p < src.old_world; ++p) {
    missing[static_cast<size_t>(p)] =
        options_.replicas + 1 -
        static_cast<int>(src.use.by_slot[static_cast<size_t>(p)].size());
  }
  for (const auto& [p, m] : todo) {
    if (missing[static_cast<size_t>(p)]-- > 0 && m == slot_) keep.insert(p);
  }
  return keep;
}

Restore::RoundPlan Restore::PlanRound(size_t round, const Source& src,
                                      Transfers* t) {
  OpOptions oo;
  oo.tag = kRestoreTag;
  RoundPlan plan;
  for (const auto& [p, m] : t->todo) {
    const int from = src.use.by_slot[static_cast<size_t>(p)][round];
    const size_t size = state_->PieceSize(src.old_world, p);
    const bool direct = src.in_place.reach.Has(m, from);
    if (slot_ == from && !direct) {
      PostSends(comm_, src.local.at(p)->bytes.get(), size, m, oo, &plan.works);
      continue;
    }
    if (slot_ != m) continue;
    plan.sender[p] = from;
    if (direct) plan.reads.push_back(p);
    Segments live_at =
        direct ? state_->Landing(src.old_world, p, world_, slot_) : Segments{};
    if (!live_at.empty() && t->keep.count(p) == 0) {
      plan.into_live.insert(p);
      plan.lands[p] = std::move(live_at);
      t->received->erase(p);  // a copy that failed in an earlier round
      continue;
    }
    std::unique_ptr<Piece>& piece = (*t->received)[p];
    piece = snapshots_->NewPiece(src.target, src.use_gen, src.old_world, p,
                                 src.use.checksum[static_cast<size_t>(p)]);
    piece->ledger = src.use.ledger[static_cast<size_t>(p)];
    if (!direct) PostRecvs(comm_, piece.get(), from, oo, &plan.works);
    plan.lands[p] = {{piece->bytes.get(), piece->size}};
    if (!live_at.empty()) plan.also_live[p] = std::move(live_at);
  }
  for (int p : plan.reads) {
    if (plan.into_live.count(p) > 0 || plan.also_live.count(p) > 0) {
      plan.live_hashes[p];
    }
  }
  return plan;
}

absl::Status Restore::ReadRound(size_t round, const Source& src,
                                RoundPlan& plan, Restored* out) {
  auto read_piece = [&](int p) -> absl::Status {
    const int from = plan.sender.at(p);
    auto hashed = plan.live_hashes.find(p);
    auto copied = plan.also_live.find(p);
    return ReadInPlace(
        p, from, src.in_place.pids[static_cast<size_t>(from)],
        src.use.address_by_slot[static_cast<size_t>(p)][round],
        plan.lands.at(p),
        hashed != plan.live_hashes.end() ? &hashed->second : nullptr,
        copied != plan.also_live.end() ? &copied->second : nullptr);
  };
  std::vector<absl::Status> read_out(plan.reads.size());
  ForEachOnThreads(plan.reads.size(), kRestoreThreads,
                   [&](size_t i) { read_out[i] = read_piece(plan.reads[i]); });
  for (size_t i = 0; i < plan.reads.size(); ++i) {
    if (!read_out[i].ok()) return read_out[i];
    out->bytes_read_in_place +=
        static_cast<int64_t>(state_->PieceSize(src.old_world, plan.reads[i]));
  }
  return absl::OkStatus();
}

absl::Status Restore::CheckRound(size_t round, const Source& src,
                                 RoundPlan& plan, Transfers* t) {
  // Whether piece p has a holder after the one of `round`.
  auto has_next = [&](int p) {
    return src.use.by_slot[static_cast<size_t>(p)].size() > round + 1;
  };
  const int old_world = src.old_world;
  std::vector<int64_t> bad = PieceSets::Mine(old_world);
  for (const auto& [p, from] : plan.sender) {
    t->out->bytes_received +=
        static_cast<int64_t>(state_->PieceSize(old_world, p));
    auto hashed = plan.live_hashes.find(p);
    const uint64_t digest = hashed != plan.live_hashes.end()
                                ? hashed->second.Digest()
                                : ApplyReceived(*t->received->at(p), old_world);
    if (digest == src.use.checksum[static_cast<size_t>(p)]) {
      t->arrived.insert(p);
      continue;
    }
    PieceSets::Add(&bad, p);
    const bool more = has_next(p);
    const std::string why = absl::StrCat(
        "the piece of slot ", p, " (world ", old_world, ", step ", src.target,
        ") received from slot ", from, " failed its checksum");
    HOLDFAST_LOG_ERROR("restore: slot {}: {}{}", slot_, why,
                       more ? "; receiving it from its next holder"
                            : "; no other member holds a good copy");
    if (!more && t->lost.ok()) t->lost = absl::DataLossError(why);
  }
  HOLDFAST_ASSIGN_OR_RETURN(PieceSets failed,
                            PieceSets::Exchange(comm_, world_, std::move(bad)));
  std::vector<std::pair<int, int>> again;
  for (const auto& [p, m] : t->todo) {
    if (failed.Has(m, p) && has_next(p)) again.emplace_back(p, m);
  }
  t->todo = std::move(again);
  return absl::OkStatus();
}

absl::Status Restore::TransferRound(size_t round, const Source& src,
                                    Transfers* t) {
  RoundPlan plan = PlanRound(round, src, t);
  std::vector<PieceIo::Take> takes;
  for (const auto& [p, from] : plan.sender) {
    takes.push_back({p, plan.into_live.count(p) > 0});
  }
  io()->Taking(src.target, takes);
  // The holders stay in this round (its all-gather in CheckRound) until
  // every reader is done, so the pieces read are there; their checksums
  // are checked all the same: a piece read into the live state, or copied
  // there as it lands, chunk by chunk, each hashed while it is in the
  // cache. The works of the communicator go on meanwhile, and are waited
  // for before any error is returned (their buffers are `received`'s).
  const absl::Status read_status = ReadRound(round, src, plan, t->out);
  for (auto& w : plan.works) HOLDFAST_RETURN_IF_ERROR(w->Wait());
  HOLDFAST_RETURN_IF_ERROR(read_status);
  for (const auto& [p, from] : plan.sender) {
    if (std::find(plan.reads.begin(), plan.reads.end(), p) !=
        plan.reads.end()) {
      continue;
    }
    Piece& piece = *t->received->at(p);
    io()->Received(p, piece.bytes.get(), piece.size);
  }
  return CheckRound(round, src, plan, t);
}

}  // namespace holdfast::checkpoint
