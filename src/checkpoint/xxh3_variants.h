// XXH3-64 (the same values as libxxhash's XXH3_64bits) compiled once per
// x86 vector extension, so a checksum runs with the widest vectors the CPU
// has. Debian's libxxhash is built for the x86-64 baseline (SSE2) and has
// no run-time dispatch; on the machines holdfast runs on, AVX2 and AVX-512
// hash 30-50 % faster. The hash is defined by the algorithm, not by the
// vector code, so every variant gives the same value.
//
// C, and kept apart from the C++ code: the variant files are compiled with
// -mavx2 or -mavx512f, and nothing inline from them may leak into callers
// that run on other CPUs.
#ifndef HOLDFAST_RUNTIME_XXH3_VARIANTS_H_
#define HOLDFAST_RUNTIME_XXH3_VARIANTS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct HfXxh3Variant {
  const char* name;
  uint64_t (*hash)(const void* data, size_t bytes);
  // Streaming: a state is reset on creation; NULL when out of memory.
  void* (*new_state)(void);
  void (*free_state)(void* state);
  void (*update)(void* state, const void* data, size_t bytes);
  uint64_t (*digest)(const void* state);
} HfXxh3Variant;

// The baseline build; always there.
extern const HfXxh3Variant hf_xxh3_baseline;
#ifdef HOLDFAST_XXH3_X86
extern const HfXxh3Variant hf_xxh3_avx2;
extern const HfXxh3Variant hf_xxh3_avx512;
#endif

// The fastest variant this CPU runs (chosen once).
const HfXxh3Variant* hf_xxh3_best(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // HOLDFAST_RUNTIME_XXH3_VARIANTS_H_
