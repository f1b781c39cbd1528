// How an operation is named in errors, abort notices and diagnoses, and
// the trace state of one that ended.
#ifndef HOLDFAST_SRC_COMMON_OP_TEXT_H_
#define HOLDFAST_SRC_COMMON_OP_TEXT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "holdfast/trace.h"
#include "holdfast/types.h"

namespace holdfast {

// The trace state of an op that ended with `s`.
inline OpState FinalState(const absl::Status& s) {
  if (s.ok()) return OpState::kCompleted;
  if (s.code() == absl::StatusCode::kDeadlineExceeded)
    return OpState::kTimedOut;
  if (s.code() == absl::StatusCode::kAborted) return OpState::kAborted;
  return OpState::kFailed;
}

// "count x dtype".
inline std::string Elements(const TraceRecord& r) {
  return absl::StrCat(r.count, " x ", DataTypeName(r.dtype));
}

// " (count x dtype[, reduction])", or nothing for a barrier.
inline std::string Shape(const TraceRecord& r) {
  if (r.op == OpType::kBarrier) return "";
  std::string s = absl::StrCat(" (", Elements(r));
  if (r.op == OpType::kAllReduce || r.op == OpType::kReduceScatter) {
    absl::StrAppend(&s, ", ", ReduceOpName(r.reduce));
  }
  return absl::StrCat(s, ")");
}

// What every rank must issue alike for a collective (what MatchTag hashes,
// less the position): the kind, the root, the size, the type, the
// reduction. The same text on every rank.
inline std::string Signature(const TraceRecord& r) {
  std::string s(OpTypeName(r.op));
  if (r.op == OpType::kBroadcast) absl::StrAppend(&s, " root=", r.peer);
  return absl::StrCat(s, Shape(r));
}

}  // namespace holdfast

#endif  // HOLDFAST_SRC_COMMON_OP_TEXT_H_
