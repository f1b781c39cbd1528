// XXH3 with AVX-512 (compiled with -mavx512f; see xxh3_variants.h).
#define HF_XXH3_VARIANT hf_xxh3_avx512
#define HF_XXH3_NAME "avx512"
#include "src/checkpoint/xxh3_variant.inc"
