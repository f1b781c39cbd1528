#include "src/common/host_key.h"

#include <unistd.h>
#include <xxhash.h>

#include <fstream>
#include <sstream>
#include <string>

namespace holdfast {
namespace {

uint64_t ComputeHostKey() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::stringstream boot;
  boot << in.rdbuf();
  char ns[256];
  const ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns));
  if (boot.str().empty() || n <= 0) return 0;
  const std::string key = boot.str() + std::string(ns, static_cast<size_t>(n));
  const uint64_t h = XXH3_64bits(key.data(), key.size());
  return h == 0 ? 1 : h;
}

}  // namespace

uint64_t HostKey() {
  static const uint64_t key = ComputeHostKey();
  return key;
}

}  // namespace holdfast
