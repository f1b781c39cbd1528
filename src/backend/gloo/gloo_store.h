// Adapts holdfast::Store to gloo::rendezvous::Store, for Gloo's full-mesh
// connect. Gloo expects exceptions; store errors become gloo::IoException.
// Thread-safe if the underlying store is.
#ifndef HOLDFAST_SRC_BACKEND_GLOO_GLOO_STORE_H_
#define HOLDFAST_SRC_BACKEND_GLOO_GLOO_STORE_H_

#include <gloo/rendezvous/store.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "holdfast/store.h"

namespace holdfast::backend::gloo {

class GlooStore final : public ::gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<holdfast::Store> store, absl::Duration timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  const std::shared_ptr<holdfast::Store> store_;
  const absl::Duration timeout_;
};

}  // namespace holdfast::backend::gloo

#endif  // HOLDFAST_SRC_BACKEND_GLOO_GLOO_STORE_H_
