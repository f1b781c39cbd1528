#include "src/common/status_util.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace holdfast {
namespace {
constexpr absl::string_view kPeerPayload = "holdfast.dev/peer";
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
  status->SetPayload(kPeerPayload, absl::Cord(std::to_string(peer)));
}

std::optional<int> GetPeer(const absl::Status& status) {
  auto payload = status.GetPayload(kPeerPayload);
  int peer;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &peer)) {
    return std::nullopt;
  }
  return peer;
}

}  // namespace holdfast
