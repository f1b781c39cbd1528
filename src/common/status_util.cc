#include "src/common/status_util.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace holdfast {
namespace {
constexpr absl::string_view kPeerPayload = "holdfast.dev/peer";
constexpr absl::string_view kAbsentPayload = "holdfast.dev/absent";
constexpr absl::string_view kUnreachablePayload = "holdfast.dev/unreachable";

void SetRank(absl::Status* status, absl::string_view url, int rank) {
  status->SetPayload(url, absl::Cord(std::to_string(rank)));
}

std::optional<int> GetRank(const absl::Status& status, absl::string_view url) {
  auto payload = status.GetPayload(url);
  int rank;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &rank)) {
    return std::nullopt;
  }
  return rank;
}

}  // namespace

absl::Status Annotate(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(prefix, ": ", status.message()));
  CopyPayloads(status, &out);
  return out;
}

void CopyPayloads(const absl::Status& from, absl::Status* to) {
  from.ForEachPayload([to](absl::string_view url, const absl::Cord& p) {
    to->SetPayload(url, p);
  });
}

void SetPeer(absl::Status* status, int peer) {
  SetRank(status, kPeerPayload, peer);
}

std::optional<int> GetPeer(const absl::Status& status) {
  return GetRank(status, kPeerPayload);
}

void SetAbsent(absl::Status* status, int rank) {
  SetRank(status, kAbsentPayload, rank);
}

std::optional<int> GetAbsent(const absl::Status& status) {
  return GetRank(status, kAbsentPayload);
}

void SetUnreachable(absl::Status* status, const std::vector<int>& ranks) {
  status->SetPayload(kUnreachablePayload,
                     absl::Cord(absl::StrJoin(ranks, ",")));
}

std::vector<int> GetUnreachable(const absl::Status& status) {
  std::vector<int> out;
  auto payload = status.GetPayload(kUnreachablePayload);
  if (!payload) return out;
  for (absl::string_view part :
       absl::StrSplit(std::string(*payload), ',', absl::SkipEmpty())) {
    int rank;
    if (absl::SimpleAtoi(part, &rank)) out.push_back(rank);
  }
  return out;
}

}  // namespace holdfast
