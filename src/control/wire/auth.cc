#include "src/control/wire/auth.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace holdfast::control {

bool TokensEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

absl::StatusOr<std::string> LoadToken(const std::string& token_file) {
  std::string token;
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read token file '", token_file, "'"));
    }
    std::getline(in, token);
    while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) {
      token.pop_back();
    }
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token file '", token_file, "' is empty"));
    }
    return token;
  }
  const char* env = std::getenv("HOLDFAST_JOB_TOKEN");
  if (env == nullptr || *env == '\0') {
    return absl::InvalidArgumentError(
        "no job token: set HOLDFAST_JOB_TOKEN or give a token file");
  }
  return std::string(env);
}

}  // namespace holdfast::control
