// Registered state as a slot sees it: the checkpoint layer's vocabulary,
// which Runtime (holdfast/runtime.h) hands to trainers.
#ifndef HOLDFAST_STATE_H_
#define HOLDFAST_STATE_H_

#include <cstddef>
#include <cstdint>

namespace holdfast {

// A slot's partition of a sharded global array.
struct ShardView {
  uint8_t* data = nullptr;  // this slot's bytes (moves after a recovery)
  size_t offset = 0;        // where they start in the global array
  size_t bytes = 0;
  size_t global_bytes = 0;
};

}  // namespace holdfast

#endif  // HOLDFAST_STATE_H_
