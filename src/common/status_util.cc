#include "src/common/status_util.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace holdfast {
namespace {
constexpr absl::string_view kPeerPayload = "holdfast.dev/peer";
constexpr absl::string_view kAbsentPayload = "holdfast.dev/absent";

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
  status.ForEachPayload([&out](absl::string_view url, const absl::Cord& p) {
    out.SetPayload(url, p);
  });
  return out;
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

}  // namespace holdfast
