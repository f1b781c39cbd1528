// Element-wise reduction kernels for the Gloo backend, for every DataType
// and ReduceOp. 16-bit floats compute in float32. Pure functions.
#ifndef HOLDFAST_SRC_BACKEND_GLOO_REDUCE_H_
#define HOLDFAST_SRC_BACKEND_GLOO_REDUCE_H_

#include <cstddef>
#include <cstdint>

#include "holdfast/types.h"

namespace holdfast::backend::gloo {

// out[i] = a[i] (op) b[i] for i < n elements. out may alias a or b.
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// The kernel for (dtype, op); kAverage maps to the sum kernel (the caller
// divides afterwards with DivideInPlace). Null for an unknown pair.
ReduceFn GetReduceFn(DataType dtype, ReduceOp op);

// data[i] /= divisor, in the element type (integers truncate toward zero).
void DivideInPlace(void* data, size_t n, DataType dtype, int divisor);

// IEEE conversions used by the 16-bit kernels (round to nearest even).
float BFloat16ToFloat(uint16_t v);
uint16_t FloatToBFloat16(float f);
float Float16ToFloat(uint16_t v);
uint16_t FloatToFloat16(float f);

}  // namespace holdfast::backend::gloo

#endif  // HOLDFAST_SRC_BACKEND_GLOO_REDUCE_H_
