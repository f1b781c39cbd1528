// Reading another process's memory in place, for restores between members
// on one host: Linux cross-memory attach (process_vm_readv(2)), the single
// copy MPI libraries use within a node. A restore over the communicator
// moves each byte through two socket copies and the transport's thread; a
// read in place is one copy, made by the reader alone.
//
// The kernel allows it between processes of one user that may ptrace each
// other (no Yama restriction, no seccomp filter against the call, the
// target dumpable). Whether it does here is found out, not assumed: a
// member publishes its pid and the address and value of a random probe
// word, and a peer with the same host key (src/common/host_key.h) reads
// the word back (Probe).
// Anything else (another host, another pid namespace, a refusal) falls
// back to the communicator.
#ifndef HOLDFAST_SRC_CHECKPOINT_PEER_MEMORY_H_
#define HOLDFAST_SRC_CHECKPOINT_PEER_MEMORY_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace holdfast::peer_memory {

// Whether the 8 bytes at `address` of process `pid` read as `value`.
bool Probe(int64_t pid, uint64_t address, uint64_t value);

// Copies `size` bytes at `address` of process `pid` into `dst`.
// Unavailable naming the pid and the reason when the kernel refuses or the
// process is gone.
absl::Status Read(int64_t pid, uint64_t address, void* dst, size_t size);

}  // namespace holdfast::peer_memory

#endif  // HOLDFAST_SRC_CHECKPOINT_PEER_MEMORY_H_
