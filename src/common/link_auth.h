// The pieces of holdfast's link handshakes (Gloo pairs, backup links): fresh
// nonces and HMAC-SHA256 under the job's secret. Both handshakes have the
// same shape: the connecting side's hello (who it is, a nonce), the accepting
// side's challenge (its own nonce and a MAC of both), the connecting side's
// proof (its MAC of both). A replayed hello or proof meets a new nonce.
#ifndef HOLDFAST_SRC_COMMON_LINK_AUTH_H_
#define HOLDFAST_SRC_COMMON_LINK_AUTH_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace holdfast::link_auth {

constexpr size_t kNonce = 16;
constexpr size_t kMac = 32;  // HMAC-SHA256
using Mac = std::array<uint8_t, kMac>;

// Fills `out` (kNonce bytes) from OpenSSL's generator; false if it has none.
bool Nonce(uint8_t* out);

// HMAC-SHA256 under `key` of `role`, `hello` and `nonce` (kNonce bytes).
// `role` keeps one side's MAC from serving as the other's.
Mac Sign(const std::string& key, absl::string_view role,
         absl::string_view hello, const uint8_t* nonce);

// Whether two MACs are equal, in time that does not depend on where they
// differ.
bool Equal(const uint8_t* a, const uint8_t* b);

}  // namespace holdfast::link_auth

#endif  // HOLDFAST_SRC_COMMON_LINK_AUTH_H_
