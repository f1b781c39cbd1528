// Writing a small file so that a reader never sees part of it.
#ifndef HOLDFAST_SRC_COMMON_FILE_UTIL_H_
#define HOLDFAST_SRC_COMMON_FILE_UTIL_H_

#include <cstdio>
#include <string>

#include "absl/strings/string_view.h"

namespace holdfast {

// Writes `text` to `path` + ".tmp", then renames it to `path`. False if any
// step failed.
inline bool WriteFileAtomically(const std::string& path,
                                absl::string_view text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return false;
  const bool written =
      std::fwrite(text.data(), 1, text.size(), f) == text.size();
  return std::fclose(f) == 0 && written &&
         std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace holdfast

#endif  // HOLDFAST_SRC_COMMON_FILE_UTIL_H_
