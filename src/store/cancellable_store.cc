#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "src/store/store_util.h"

namespace holdfast {
namespace {

class CancellableStore final : public Store {
 public:
  CancellableStore(std::shared_ptr<Store> base,
                   std::function<std::optional<std::string>()> cancelled)
      : base_(std::move(base)), cancelled_(std::move(cancelled)) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override {
    return base_->Set(key, value);
  }
  absl::StatusOr<std::optional<std::string>> TryGet(
      absl::string_view key) override {
    return base_->TryGet(key);
  }
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override {
    std::string value;
    absl::Status s = Sliced(timeout, [&](absl::Duration slice) {
      absl::StatusOr<std::string> v = base_->Get(key, slice);
      if (v.ok()) value = *std::move(v);
      return v.status();
    });
    if (!s.ok()) return s;
    return value;
  }
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override {
    return Sliced(timeout, [&](absl::Duration slice) {
      return base_->Wait(keys, slice);
    });
  }

 private:
  static constexpr absl::Duration kSlice = absl::Milliseconds(100);

  // Runs `wait` (a wait on the base store) in slices of at most kSlice
  // until it ends other than by its own deadline, `timeout` passes, or the
  // wait is cancelled.
  template <typename F>
  absl::Status Sliced(absl::Duration timeout, F wait) {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      if (auto why = cancelled_()) return absl::AbortedError(*why);
      const absl::Duration left = deadline - absl::Now();
      absl::Status s = wait(std::min(left, kSlice));
      if (s.code() != absl::StatusCode::kDeadlineExceeded || left <= kSlice) {
        return s;
      }
    }
  }

  const std::shared_ptr<Store> base_;
  const std::function<std::optional<std::string>()> cancelled_;
};

}  // namespace

std::shared_ptr<Store> NewCancellableStore(
    std::shared_ptr<Store> base,
    std::function<std::optional<std::string>()> cancelled) {
  return std::make_shared<CancellableStore>(std::move(base),
                                            std::move(cancelled));
}

std::vector<size_t> MissingKeys(Store& store,
                                const std::vector<std::string>& keys) {
  std::vector<size_t> missing;
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::StatusOr<std::optional<std::string>> v = store.TryGet(keys[i]);
    if (v.ok() && !v->has_value()) missing.push_back(i);
  }
  return missing;
}

}  // namespace holdfast
