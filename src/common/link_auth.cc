#include "src/common/link_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace holdfast::link_auth {

bool Nonce(uint8_t* out) { return RAND_bytes(out, kNonce) == 1; }

Mac Sign(const std::string& key, absl::string_view role,
         absl::string_view hello, const uint8_t* nonce) {
  std::string msg(role);
  msg.append(hello.data(), hello.size());
  msg.append(reinterpret_cast<const char*>(nonce), kNonce);
  Mac out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(),
       out.data(), &len);
  return out;
}

bool Equal(const uint8_t* a, const uint8_t* b) {
  return CRYPTO_memcmp(a, b, kMac) == 0;
}

}  // namespace holdfast::link_auth
