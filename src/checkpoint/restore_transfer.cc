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
    int64_t target, int64_t use_gen, int old_world, const Holders& use,
    const std::map<int, const Piece*>& local, const PieceSets& live,
    const InPlace& in_place, std::map<int, std::unique_ptr<Piece>>* received,
    Restored* out) {
  // Every member knows where the others' copies lie now.
  if (hooks_.before_transfers) hooks_.before_transfers();
  std::vector<std::pair<int, int>> todo;  // (piece, member)
  for (int p = 0; p < old_world; ++p) {
    const std::vector<int>& hs = use.by_slot[static_cast<size_t>(p)];
    if (state_->PieceSize(old_world, p) == 0) continue;
    for (int m = 0; m < world_; ++m) {
      if (std::find(hs.begin(), hs.end(), m) == hs.end() && !live.Has(m, p) &&
          state_->NeedsPiece(world_, m, old_world, p)) {
        todo.emplace_back(p, m);
      }
    }
    auto l = local.find(p);
    if (l != local.end() && state_->NeedsPiece(world_, slot_, old_world, p) &&
        !live.Has(slot_, p)) {
      state_->ApplyPiece(l->second->bytes.get(), old_world, p, world_, slot_);
    }
  }
  // A received copy is kept (it covers a second fault before the next
  // commit) where the piece has fewer holders than a commit leaves it
  // (replicas + 1): by its first receivers, as many as are missing. A
  // piece read in place and not kept goes straight into the live state.
  std::set<int> keep;
  {
    std::vector<int> missing(static_cast<size_t>(old_world));
    for (int p = 0; p < old_world; ++p) {
      missing[static_cast<size_t>(p)] =
          options_.replicas + 1 -
          static_cast<int>(use.by_slot[static_cast<size_t>(p)].size());
    }
    for (const auto& [p, m] : todo) {
      if (missing[static_cast<size_t>(p)]-- > 0 && m == slot_) {
        keep.insert(p);
      }
    }
  }
  size_t round = 0;
  std::set<int> arrived;  // received pieces that passed their check
  absl::Status lost;
  while (!todo.empty()) {
    HOLDFAST_RETURN_IF_ERROR(TransferRound(round++, target, use_gen, old_world,
                                           use, local, in_place, keep, &todo,
                                           received, &arrived, &lost, out));
  }
  if (!lost.ok()) return lost;
  for (int p = 0; p < old_world; ++p) {
    if (state_->PieceSize(old_world, p) > 0 &&
        state_->NeedsPiece(world_, slot_, old_world, p) &&
        !live.Has(slot_, p) && local.count(p) == 0 && arrived.count(p) == 0) {
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

absl::Status Restore::TransferRound(
    size_t round, int64_t target, int64_t use_gen, int old_world,
    const Holders& use, const std::map<int, const Piece*>& local,
    const InPlace& in_place, const std::set<int>& keep,
    std::vector<std::pair<int, int>>* todo,
    std::map<int, std::unique_ptr<Piece>>* received, std::set<int>* arrived,
    absl::Status* lost, Restored* out) {
  OpOptions oo;
  oo.tag = kRestoreTag;
  // Whether piece p has a holder after the one of `round`.
  auto has_next = [&use](int p, size_t r) {
    return use.by_slot[static_cast<size_t>(p)].size() > r + 1;
  };
  std::vector<std::shared_ptr<Work>> works;
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
  for (const auto& [p, m] : *todo) {
    const int from = use.by_slot[static_cast<size_t>(p)][round];
    const size_t size = state_->PieceSize(old_world, p);
    const uint64_t checksum = use.checksum[static_cast<size_t>(p)];
    const bool direct = in_place.reach.Has(m, from);
    if (slot_ == from && !direct) {
      PostSends(comm_, local.at(p)->bytes.get(), size, m, oo, &works);
    } else if (slot_ == m) {
      sender[p] = from;
      if (direct) reads.push_back(p);
      Segments live_at =
          direct ? state_->Landing(old_world, p, world_, slot_) : Segments{};
      if (!live_at.empty() && keep.count(p) == 0) {
        into_live.insert(p);
        lands[p] = std::move(live_at);
        received->erase(p);  // a copy that failed in an earlier round
        continue;
      }
      std::unique_ptr<Piece>& piece = (*received)[p];
      piece = snapshots_->NewPiece(target, use_gen, old_world, p, checksum);
      piece->ledger = use.ledger[static_cast<size_t>(p)];
      if (!direct) PostRecvs(comm_, piece.get(), from, oo, &works);
      lands[p] = {{piece->bytes.get(), piece->size}};
      if (!live_at.empty()) also_live[p] = std::move(live_at);
    }
  }
  std::vector<PieceIo::Take> takes;
  for (const auto& [p, from] : sender)
    takes.push_back({p, into_live.count(p) > 0});
  io()->Taking(target, takes);
  // The holders stay in this round (its all-gather below) until every
  // reader is done, so the pieces read are there; their checksums are
  // checked below all the same: a piece read into the live state, or
  // copied there as it lands, chunk by chunk, each hashed while it is
  // in the cache (`live_hashes`).
  // The works of the communicator go on meanwhile, and are waited for
  // before any error is returned (their buffers are `received`'s).
  std::map<int, pieces::CopyHasher> live_hashes;
  for (int p : reads) {
    if (into_live.count(p) > 0 || also_live.count(p) > 0) live_hashes[p];
  }
  auto read_piece = [&](int p) -> absl::Status {
    const int from = sender.at(p);
    auto hashed = live_hashes.find(p);
    auto copied = also_live.find(p);
    return ReadInPlace(p, from, in_place.pids[static_cast<size_t>(from)],
                       use.address_by_slot[static_cast<size_t>(p)][round],
                       lands.at(p),
                       hashed != live_hashes.end() ? &hashed->second : nullptr,
                       copied != also_live.end() ? &copied->second : nullptr);
  };
  std::vector<absl::Status> read_out(reads.size());
  ForEachOnThreads(reads.size(), kRestoreThreads,
                   [&](size_t i) { read_out[i] = read_piece(reads[i]); });
  absl::Status read_status;
  for (size_t i = 0; i < reads.size(); ++i) {
    if (!read_out[i].ok()) {
      read_status = read_out[i];
      break;
    }
    out->bytes_read_in_place +=
        static_cast<int64_t>(state_->PieceSize(old_world, reads[i]));
  }
  for (auto& w : works) HOLDFAST_RETURN_IF_ERROR(w->Wait());
  HOLDFAST_RETURN_IF_ERROR(read_status);
  for (const auto& [p, from] : sender) {
    if (std::find(reads.begin(), reads.end(), p) != reads.end()) continue;
    Piece& piece = *received->at(p);
    io()->Received(p, piece.bytes.get(), piece.size);
  }
  std::vector<int64_t> bad = PieceSets::Mine(old_world);
  for (const auto& [p, from] : sender) {
    out->bytes_received +=
        static_cast<int64_t>(state_->PieceSize(old_world, p));
    auto hashed = live_hashes.find(p);
    const uint64_t digest = hashed != live_hashes.end()
                                ? hashed->second.Digest()
                                : ApplyReceived(*received->at(p), old_world);
    if (digest == use.checksum[static_cast<size_t>(p)]) {
      arrived->insert(p);
      continue;
    }
    PieceSets::Add(&bad, p);
    const bool more = has_next(p, round);
    const std::string why = absl::StrCat(
        "the piece of slot ", p, " (world ", old_world, ", step ", target,
        ") received from slot ", from, " failed its checksum");
    HOLDFAST_LOG_ERROR("restore: slot {}: {}{}", slot_, why,
                       more ? "; receiving it from its next holder"
                            : "; no other member holds a good copy");
    if (!more && lost->ok()) *lost = absl::DataLossError(why);
  }
  HOLDFAST_ASSIGN_OR_RETURN(PieceSets failed,
                            PieceSets::Exchange(comm_, world_, std::move(bad)));
  std::vector<std::pair<int, int>> again;
  for (const auto& [p, m] : *todo) {
    if (failed.Has(m, p) && has_next(p, round)) again.emplace_back(p, m);
  }
  *todo = std::move(again);
  return absl::OkStatus();
}

}  // namespace holdfast::checkpoint
