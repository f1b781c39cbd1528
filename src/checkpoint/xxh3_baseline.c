// XXH3 for the baseline ISA, and the choice of variant (xxh3_variants.h).
#define HF_XXH3_VARIANT hf_xxh3_baseline
#define HF_XXH3_NAME "baseline"
#include "src/checkpoint/xxh3_variant.inc"

static const HfXxh3Variant* Choose(void) {
#ifdef HOLDFAST_XXH3_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return &hf_xxh3_avx512;
  if (__builtin_cpu_supports("avx2")) return &hf_xxh3_avx2;
#endif
  return &hf_xxh3_baseline;
}

const HfXxh3Variant* hf_xxh3_best(void) {
  // Benign race: every thread computes the same pointer.
  static const HfXxh3Variant* chosen;
  const HfXxh3Variant* c = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
  if (c == NULL) {
    c = Choose();
    __atomic_store_n(&chosen, c, __ATOMIC_RELEASE);
  }
  return c;
}
