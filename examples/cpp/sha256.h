// The examples' parameter hash: SHA-256 (OpenSSL) of byte ranges, as hex.
#ifndef HOLDFAST_EXAMPLES_CPP_SHA256_H_
#define HOLDFAST_EXAMPLES_CPP_SHA256_H_

#include <openssl/evp.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace holdfast_examples {

inline std::string Sha256Hex(
    const std::vector<std::pair<const void*, size_t>>& parts) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  for (const auto& [p, n] : parts) EVP_DigestUpdate(ctx, p, n);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    absl::StrAppend(&hex, absl::Hex(md[i], absl::kZeroPad2));
  }
  return hex;
}

}  // namespace holdfast_examples

#endif  // HOLDFAST_EXAMPLES_CPP_SHA256_H_
