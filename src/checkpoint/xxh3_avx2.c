// XXH3 with AVX2 (compiled with -mavx2; see xxh3_variants.h).
#define HF_XXH3_VARIANT hf_xxh3_avx2
#define HF_XXH3_NAME "avx2"
#include "src/checkpoint/xxh3_variant.inc"
