#include "holdfast/store.h"
#include "absl/time/clock.h"

namespace holdfast {

absl::Status Store::Wait(const std::vector<std::string>& keys,
                         absl::Duration timeout) {
  // Generic version: one Get per key against a shared deadline.
  const absl::Time deadline = absl::Now() + timeout;
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value = Get(key, deadline - absl::Now());
    if (!value.ok()) return value.status();
  }
  return absl::OkStatus();
}

}  // namespace holdfast
