// Internal store helpers shared by the communicator's rendezvous and the
// runtime: a store whose waits a caller can cancel, and which of a set of
// keys are missing. Thread-safe as the base store is.
#ifndef HOLDFAST_SRC_STORE_STORE_UTIL_H_
#define HOLDFAST_SRC_STORE_STORE_UTIL_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "holdfast/store.h"

namespace holdfast {

// A view of `base` whose Get and Wait give up, with Aborted naming the
// reason, as soon as `cancelled` returns one (it is polled about every
// 100 ms), instead of waiting out their whole timeout for a key that will
// never come. Set and TryGet pass through.
std::shared_ptr<Store> NewCancellableStore(
    std::shared_ptr<Store> base,
    std::function<std::optional<std::string>()> cancelled);

// The indices of `keys` that `store` does not hold now (keys it cannot
// read count as present: nothing to blame).
std::vector<size_t> MissingKeys(Store& store,
                                const std::vector<std::string>& keys);

}  // namespace holdfast

#endif  // HOLDFAST_SRC_STORE_STORE_UTIL_H_
