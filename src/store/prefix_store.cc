#include "absl/strings/str_cat.h"
#include "holdfast/store.h"

namespace holdfast {
namespace {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix)), base_(std::move(base)) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override {
    if (key.empty()) return absl::InvalidArgumentError("store: empty key");
    return base_->Set(absl::StrCat(prefix_, key), value);
  }
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override {
    if (key.empty()) return absl::InvalidArgumentError("store: empty key");
    return base_->Get(absl::StrCat(prefix_, key), timeout);
  }
  absl::StatusOr<std::optional<std::string>> TryGet(
      absl::string_view key) override {
    return base_->TryGet(absl::StrCat(prefix_, key));
  }
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(absl::StrCat(prefix_, k));
    return base_->Wait(full, timeout);
  }

 private:
  const std::string prefix_;
  const std::shared_ptr<Store> base_;
};

}  // namespace

std::shared_ptr<Store> NewPrefixStore(std::string prefix,
                                      std::shared_ptr<Store> base) {
  return std::make_shared<PrefixStore>(std::move(prefix), std::move(base));
}

}  // namespace holdfast
