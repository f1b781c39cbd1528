// Key-value store used for rendezvous: ranks publish their addresses, the
// transport connects, and abort notices are left for peers to read.
// Implementations are thread-safe. The controller's store (a later layer)
// implements the same interface.
#ifndef HOLDFAST_STORE_H_
#define HOLDFAST_STORE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace holdfast {

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, replacing any previous value. Keys are non-empty.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // Returns the value of `key`, waiting up to `timeout` for it to appear.
  // DeadlineExceeded names the key if it never does.
  virtual absl::StatusOr<std::string> Get(absl::string_view key,
                                          absl::Duration timeout) = 0;

  // Returns the value of `key` if it is present now, nullopt otherwise.
  virtual absl::StatusOr<std::optional<std::string>> TryGet(
      absl::string_view key) = 0;

  // Waits up to `timeout` for all `keys` to be present. DeadlineExceeded
  // names the keys still missing.
  virtual absl::Status Wait(const std::vector<std::string>& keys,
                            absl::Duration timeout);
};

// A store in one process's memory: for threads of one process and tests.
std::shared_ptr<Store> NewMemoryStore();

// A store in a directory shared by the processes (one file per key, written
// atomically with rename). The directory is created if missing.
absl::StatusOr<std::shared_ptr<Store>> NewFileStore(const std::string& dir);

// A view of `base` in which every key is prefixed with `prefix`.
std::shared_ptr<Store> NewPrefixStore(std::string prefix,
                                      std::shared_ptr<Store> base);

}  // namespace holdfast

#endif  // HOLDFAST_STORE_H_
