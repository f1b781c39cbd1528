// CommunicatorImpl's abort and the diagnosis of a failure: the abort
// notice each member leaves in the store, and what a failed op learns
// from its peers' notices (a mismatch, a peer's timeout, a peer's abort).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "holdfast/status.h"
#include "src/comm/communicator_impl.h"
#include "src/common/logging.h"
#include "src/common/op_text.h"
#include "src/common/status_util.h"
#include "src/store/keys.h"
#include "src/store/store_util.h"
#include "src/trace/trace_json.h"

namespace holdfast::comm {
namespace {

// How many peers a rank whose collective timed out asks (through their
// abort notices) which collective they were in: the ones after it in rank
// order. Each is one store read.
constexpr int kMismatchPeers = 64;

// The most time those reads may add to a timeout's abort.
constexpr absl::Duration kMismatchBudget = absl::Seconds(1);

// How many of its last collectives an abort notice carries (the
// controller's diagnosis compares them across ranks).
constexpr size_t kNoticeTail = 32;

// The collective a peer's abort notice says it was in, if any.
struct NoticeOp {
  int64_t coll_seq = -1;
  std::string signature;
};
std::optional<NoticeOp> OpOfNotice(const nlohmann::json& notice) {
  // (A const json's operator[] must not be given a missing key.)
  if (!notice.is_object() || !notice.contains("op")) return std::nullopt;
  const nlohmann::json& op = notice.at("op");
  if (!op.is_object() || !op.contains("coll_seq") ||
      !op.contains("signature") || !op.at("coll_seq").is_number_integer() ||
      !op.at("signature").is_string()) {
    return std::nullopt;
  }
  return NoticeOp{op.at("coll_seq").get<int64_t>(),
                  op.at("signature").get<std::string>()};
}

// The Send or Recv a peer's abort notice says it was in, if any.
struct NoticeP2P {
  std::string kind;  // "Send" or "Recv"
  int64_t peer = -1;
  int64_t tag = -1;
  int64_t seq = -1;
  std::string elements;  // "count x dtype"
};
std::optional<NoticeP2P> P2POfNotice(const nlohmann::json& notice) {
  if (!notice.is_object() || !notice.contains("p2p")) return std::nullopt;
  const nlohmann::json& op = notice.at("p2p");
  if (!op.is_object()) return std::nullopt;
  for (const char* k : {"peer", "tag", "seq"}) {
    if (!op.contains(k) || !op.at(k).is_number_integer()) return std::nullopt;
  }
  for (const char* k : {"kind", "elements"}) {
    if (!op.contains(k) || !op.at(k).is_string()) return std::nullopt;
  }
  return NoticeP2P{op.at("kind").get<std::string>(),
                   op.at("peer").get<int64_t>(), op.at("tag").get<int64_t>(),
                   op.at("seq").get<int64_t>(),
                   op.at("elements").get<std::string>()};
}

}  // namespace

std::string CommunicatorImpl::Describe(const TraceRecord& r) const {
  std::string s = absl::StrCat(OpTypeName(r.op), " seq=", r.seq);
  if (IsCollective(r.op)) absl::StrAppend(&s, " coll_seq=", r.coll_seq);
  absl::StrAppend(&s, " gen=", r.generation, " rank=", options_.rank, "/",
                  options_.size);
  if (r.op == OpType::kBroadcast) absl::StrAppend(&s, " root=", r.peer);
  if (!IsCollective(r.op)) absl::StrAppend(&s, " peer=", r.peer);
  if (r.tag != 0) absl::StrAppend(&s, " tag=", r.tag);
  return absl::StrCat(s, Shape(r));
}

void CommunicatorImpl::AbortWith(const absl::Status& cause, Pending* trigger) {
  std::vector<std::shared_ptr<Pending>> finish;
  bool began;
  {
    absl::MutexLock lock(&mu_);
    began = BeginAbortLocked(cause, trigger, &finish);
  }
  if (began) CompleteAbort(cause, std::move(finish));
}

bool CommunicatorImpl::BeginAbortLocked(
    absl::Status cause, Pending* trigger,
    std::vector<std::shared_ptr<Pending>>* finish) {
  if (aborted_) return false;
  aborted_ = true;
  abort_status_ = cause;
  abort_mono_ns_ = MonotonicNanos();
  // What the notice names: a Send or Recv that caused this, else the
  // collective in progress.
  if (trigger != nullptr && !IsCollective(trigger->record.op)) {
    abort_op_ = trigger->record;
  } else if (running_) {
    abort_op_ = running_->record;
  }
  const std::string aborted_msg =
      absl::StrCat("communicator aborted: ", cause.message());
  auto outcome = [&](Pending* p) {
    if (p == trigger) {
      // The trigger's own message already describes it, unless the cause
      // came from elsewhere (a peer's notice); then prefix it.
      return cause.message().find(Describe(p->record)) == 0
                 ? cause
                 : Annotate(cause, Describe(p->record));
    }
    return absl::AbortedError(
        absl::StrCat(Describe(p->record), ": ", aborted_msg));
  };
  // Ops still inside the transport: their outcome is decided (and traced)
  // now; their Work finishes once the transport lets go of their buffers.
  auto decide = [&](Pending* p) {
    p->forced = outcome(p);
    ring_.Transition(p->record.seq, FinalState(*p->forced), Now(),
                     static_cast<int32_t>(p->forced->code()));
    p->traced_final = true;
  };
  if (running_) decide(running_.get());
  for (auto& q : p2p_) decide(q.get());
  if (trigger != nullptr && !trigger->forced.has_value()) decide(trigger);
  // Queued ops never touched their buffers: CompleteAbort finishes them as
  // soon as the evidence is kept, without waiting for the transport.
  for (auto& q : queue_) {
    decide(q.get());
    finish->push_back(q);
  }
  queue_.clear();
  return true;
}

void CommunicatorImpl::CompleteAbort(
    const absl::Status& cause, std::vector<std::shared_ptr<Pending>> finish) {
  // 1. Tell peers why, before closing the connections they will see drop.
  std::optional<TraceRecord> op;
  {
    absl::MutexLock lock(&mu_);
    op = abort_op_;
  }
  (void)WriteNotice(cause, op);  // a failure is logged
  HOLDFAST_LOG_ERROR("rank {}/{} gen {}: communicator aborted: {}",
                     options_.rank, options_.size, options_.generation,
                     cause.ToString());
  // 2. Keep the evidence, before any waiter is released.
  if (!options_.trace_dir.empty()) {
    const std::string path =
        absl::StrCat(options_.trace_dir, "/trace-g", options_.generation, "-r",
                     options_.rank, "-p", getpid(), ".json");
    std::error_code ec;  // a failure shows as the write's, below
    std::filesystem::create_directories(options_.trace_dir, ec);
    std::ofstream out(path);
    out << DumpTrace();
    out.close();
    if (out) {
      HOLDFAST_LOG_INFO("rank {}: trace written to {}", options_.rank, path);
    } else {
      HOLDFAST_LOG_WARN("rank {}: could not write trace to {}", options_.rank,
                        path);
    }
  }
  // 3. Close the transport: a blocked call returns now, and peers blocked on
  // this rank see its connections drop.
  backend_->Abort(cause.message());
  absl::MutexLock lock(&mu_);
  for (auto& q : finish) FinishLocked(q.get(), *q->forced);
}

absl::Status CommunicatorImpl::WriteNotice(
    const absl::Status& cause, const std::optional<TraceRecord>& op) {
  nlohmann::json notice = {
      {"rank", options_.rank},
      {"code", static_cast<int>(cause.code())},
      {"message", std::string(cause.message())},
      {"peer", GetPeer(cause).value_or(-1)},
  };
  if (op.has_value() && IsCollective(op->op)) {
    notice["op"] = {{"coll_seq", op->coll_seq}, {"signature", Signature(*op)}};
  } else if (op.has_value()) {
    notice["p2p"] = {{"kind", std::string(OpTypeName(op->op))},
                     {"peer", op->peer},
                     {"tag", op->tag},
                     {"seq", op->coll_seq},
                     {"elements", Elements(*op)}};
  }
  notice["trace"] =
      trace::CollectiveTail(ring_.Snapshot(), options_.generation, kNoticeTail);
  absl::Status written = store_->Set(
      keys::AbortNotice(options_.generation, options_.rank), notice.dump());
  if (!written.ok()) {
    HOLDFAST_LOG_WARN("rank {}: could not leave an abort notice: {}",
                      options_.rank, written.ToString());
  }
  return written;
}

absl::StatusOr<std::optional<nlohmann::json>> CommunicatorImpl::ReadNotice(
    int rank) const {
  HOLDFAST_ASSIGN_OR_RETURN(
      std::optional<std::string> raw,
      store_->TryGet(keys::AbortNotice(options_.generation, rank)));
  if (!raw.has_value()) return std::nullopt;
  nlohmann::json notice =
      nlohmann::json::parse(*raw, nullptr, /*allow_exceptions=*/false);
  if (!notice.is_object() || !notice["code"].is_number_integer() ||
      !notice["message"].is_string()) {
    return std::nullopt;
  }
  return notice;
}

absl::Status CommunicatorImpl::MismatchWith(const TraceRecord& mine, int peer,
                                            const nlohmann::json& notice) {
  std::string what;
  if (IsCollective(mine.op)) {
    std::optional<NoticeOp> theirs = OpOfNotice(notice);
    if (!theirs.has_value() || theirs->coll_seq != mine.coll_seq ||
        theirs->signature == Signature(mine)) {
      return absl::OkStatus();
    }
    what = absl::StrCat(
        "collective mismatch at collective #", mine.coll_seq, " of generation ",
        options_.generation, ": rank ", options_.rank, " issued ",
        Signature(mine), ", rank ", peer, " issued ", theirs->signature,
        "; every rank must issue the same collectives in the same order");
  } else {
    // The op that matches `mine`: the other kind, between the same two
    // ranks, with the same tag, at the same position among their messages.
    std::optional<NoticeP2P> theirs = P2POfNotice(notice);
    const OpType other =
        mine.op == OpType::kSend ? OpType::kRecv : OpType::kSend;
    if (!theirs.has_value() || peer != mine.peer ||
        theirs->kind != OpTypeName(other) || theirs->peer != options_.rank ||
        theirs->tag != mine.tag || theirs->seq != mine.coll_seq ||
        theirs->elements == Elements(mine)) {
      return absl::OkStatus();
    }
    const bool sending = mine.op == OpType::kSend;
    what = absl::StrCat(
        "point-to-point mismatch at message #", mine.coll_seq, " from rank ",
        sending ? options_.rank : peer, " to rank ",
        sending ? peer : options_.rank, " (tag ", mine.tag, ") of generation ",
        options_.generation, ": rank ", options_.rank,
        sending ? " sends " : " receives ", Elements(mine), ", rank ", peer,
        sending ? " receives " : " sends ", theirs->elements,
        "; a Send and the Recv it matches must have the same count and type");
  }
  absl::Status m = absl::InvalidArgumentError(what);
  // For the ranks that only saw a timeout (a runtime ends rather than
  // recovering into the same mismatch).
  absl::Status written = store_->Set(keys::Mismatch(options_.generation), what);
  if (!written.ok()) {
    HOLDFAST_LOG_WARN("rank {}: could not publish the mismatch: {}",
                      options_.rank, written.ToString());
  }
  return m;
}

absl::Status CommunicatorImpl::DiagnoseTimeout(const TraceRecord& mine,
                                               const absl::Status& cause) {
  // Say which collective this rank is in before reading the peers': of
  // two ranks that do this at once, the later reader sees the other's.
  // The abort waits for this: a store that fails (or takes longer than
  // kMismatchBudget in all) ends it.
  if (!WriteNotice(cause, mine).ok()) return cause;
  // A collective is compared with the ranks after this one; a Send or Recv
  // with its own peer alone.
  const bool collective = IsCollective(mine.op);
  const int peers =
      collective ? std::min(options_.size - 1, kMismatchPeers) : 1;
  const absl::Time give_up = absl::Now() + kMismatchBudget;
  for (int i = 1; i <= peers && absl::Now() < give_up; ++i) {
    const int peer =
        collective ? (options_.rank + i) % options_.size : mine.peer;
    absl::StatusOr<std::optional<nlohmann::json>> notice = ReadNotice(peer);
    if (!notice.ok()) break;
    if (!notice->has_value()) continue;
    absl::Status m = MismatchWith(mine, peer, **notice);
    if (!m.ok()) return m;
  }
  return cause;
}

absl::Status CommunicatorImpl::ExplainFailure(
    const absl::Status& error, const std::optional<TraceRecord>& running) {
  std::optional<int> peer = GetPeer(error);
  if (!peer.has_value()) return error;
  absl::StatusOr<std::optional<nlohmann::json>> found = ReadNotice(*peer);
  if (!found.ok() || !found->has_value()) return error;  // the peer just died
  const nlohmann::json& notice = **found;
  if (running.has_value()) {
    absl::Status m = MismatchWith(*running, *peer, notice);
    if (!m.ok()) return m;
  }
  const int code = notice["code"].get<int>();
  if (code <= 0 ||
      code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return error;
  }
  absl::Status adopted(static_cast<absl::StatusCode>(code),
                       absl::StrCat("rank ", *peer, " aborted the group: ",
                                    notice["message"].get<std::string>()));
  const int root_peer =
      notice["peer"].is_number_integer() ? notice["peer"].get<int>() : -1;
  SetPeer(&adopted, root_peer >= 0 ? root_peer : *peer);
  return adopted;
}

}  // namespace holdfast::comm
