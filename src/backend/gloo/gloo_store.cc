#include "src/backend/gloo/gloo_store.h"

#include <gloo/common/error.h>

#include "absl/strings/string_view.h"

namespace holdfast::backend::gloo {
namespace {

[[noreturn]] void Throw(const absl::Status& status) {
  throw ::gloo::IoException(std::string(status.ToString()));
}

}  // namespace

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s =
      store_->Set(key, absl::string_view(data.data(), data.size()));
  if (!s.ok()) Throw(s);
}

std::vector<char> GlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> v = store_->Get(key, timeout_);
  if (!v.ok()) Throw(v.status());
  return std::vector<char>(v->begin(), v->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  absl::Status s = store_->Wait(keys, timeout_);
  if (!s.ok()) Throw(s);
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  absl::Status s =
      store_->Wait(keys, std::min(timeout_, absl::FromChrono(timeout)));
  if (!s.ok()) Throw(s);
}

}  // namespace holdfast::backend::gloo
