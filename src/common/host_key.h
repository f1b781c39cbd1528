// Which processes share a kernel and a pid namespace, so that a pid one of
// them names is the same process for the other: what reading another
// process's memory in place (src/checkpoint/peer_memory.h) and watching
// another process's /proc entry (src/control/wire/process_watch.h) need.
#ifndef HOLDFAST_SRC_COMMON_HOST_KEY_H_
#define HOLDFAST_SRC_COMMON_HOST_KEY_H_

#include <cstdint>

namespace holdfast {

// A hash of the kernel's boot id and this process's pid namespace: equal
// for processes of one kernel boot and one pid namespace; 0 when that
// cannot be told (no /proc). Read once.
uint64_t HostKey();

}  // namespace holdfast

#endif  // HOLDFAST_SRC_COMMON_HOST_KEY_H_
