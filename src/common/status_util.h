// Internal helpers for building holdfast statuses: context prefixes and the
// peer rank attached as a payload, so upper layers can tell which peer an
// error concerns without parsing messages. Pure functions; thread-safe.
#ifndef HOLDFAST_SRC_COMMON_STATUS_UTIL_H_
#define HOLDFAST_SRC_COMMON_STATUS_UTIL_H_

#include <optional>
#include "absl/strings/string_view.h"

#include <vector>

#include "absl/status/status.h"

namespace holdfast {

// `status` with "prefix: " put before its message; OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view prefix);

// Copies every payload of `from` (the peer, the absent rank, the
// unreachable ranks) onto `to`.
void CopyPayloads(const absl::Status& from, absl::Status* to);

// Attaches / reads the rank of the peer an error concerns.
void SetPeer(absl::Status* status, int peer);
std::optional<int> GetPeer(const absl::Status& status);

// Attaches / reads the rank that never came to a rendezvous (it did not
// publish its address, or did not connect): the one to blame for it.
void SetAbsent(absl::Status* status, int rank);
std::optional<int> GetAbsent(const absl::Status& status);

// Attaches / reads every rank a rendezvous could not connect to (refused,
// no route, timed out): the evidence of who lost whom on the data network.
// Empty when none is attached.
void SetUnreachable(absl::Status* status, const std::vector<int>& ranks);
std::vector<int> GetUnreachable(const absl::Status& status);

}  // namespace holdfast

#endif  // HOLDFAST_SRC_COMMON_STATUS_UTIL_H_
