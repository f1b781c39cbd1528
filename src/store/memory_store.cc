// MemoryStore: keys in a map guarded by one mutex; waiters sleep on it.
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "holdfast/store.h"

namespace holdfast {

namespace {

class MemoryStore final : public Store {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    if (key.empty()) return absl::InvalidArgumentError("store: empty key");
    absl::MutexLock lock(&mu_);
    data_[std::string(key)] = std::string(value);
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override {
    if (key.empty()) return absl::InvalidArgumentError("store: empty key");
    const std::string k(key);
    absl::MutexLock lock(&mu_);
    auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return data_.count(k) > 0;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("store: key '", key, "' did not appear within ",
                       absl::FormatDuration(timeout)));
    }
    return data_[k];
  }

  absl::StatusOr<std::optional<std::string>> TryGet(
      absl::string_view key) override {
    absl::MutexLock lock(&mu_);
    auto it = data_.find(std::string(key));
    if (it == data_.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }

  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& k : keys) {
        if (data_.count(k) == 0) return false;
      }
      return true;
    };
    if (mu_.AwaitWithTimeout(absl::Condition(&all), timeout)) {
      return absl::OkStatus();
    }
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (data_.count(k) == 0) missing.push_back(k);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "store: keys [", absl::StrJoin(missing, ", "),
        "] did not appear within ", absl::FormatDuration(timeout)));
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<Store> NewMemoryStore() {
  return std::make_shared<MemoryStore>();
}

}  // namespace holdfast
