#include "src/checkpoint/peer_memory.h"

#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace holdfast::peer_memory {

bool Probe(int64_t pid, uint64_t address, uint64_t value) {
  uint64_t got = 0;
  return pid > 0 && address != 0 &&
         Read(pid, address, &got, sizeof(got)).ok() && got == value;
}

absl::Status Read(int64_t pid, uint64_t address, void* dst, size_t size) {
  auto* out = static_cast<uint8_t*>(dst);
  size_t done = 0;
  while (done < size) {
    iovec local{out + done, size - done};
    iovec remote{reinterpret_cast<void*>(address + done), size - done};
    const ssize_t n =
        process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      return absl::UnavailableError(
          absl::StrCat("reading ", size, " bytes of process ", pid,
                       " in place failed at ", done, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace holdfast::peer_memory
