// Fault points for a binding that checks its values its own way (the
// Python package's check_finite, on tensors of any dtype and device). Not
// part of the public API: fault injection is for holdfast's own tests and
// chaos runs.
#ifndef HOLDFAST_SRC_RUNTIME_FAULT_POINTS_H_
#define HOLDFAST_SRC_RUNTIME_FAULT_POINTS_H_

#include "holdfast/runtime.h"

namespace holdfast::runtime_internal {

// Whether the injected fault nan:slot=S:step=N fires for `rt` (made by
// Runtime::Create) at its current step; the caller then makes the values
// it checks NaN. True once per fault.
bool NanFaultFiresNow(Runtime& rt);

// The bit the injected fault gradflip:slot=S:step=N[:bit=B] flips for `rt`
// at its current step, or -1; the caller flips it in the values it checks
// (FlipLargestClearBit). Once per fault.
int GradientFlipBitNow(Runtime& rt);

// Flips bit `bit` of the float32 of largest magnitude among `data` whose
// bit is clear and whose flip leaves it finite (bit 30 of a value below 1
// multiplies it by 2^128); returns its index, or -1 when there is none.
int64_t FlipLargestClearBit(float* data, size_t count, int bit);

}  // namespace holdfast::runtime_internal

#endif  // HOLDFAST_SRC_RUNTIME_FAULT_POINTS_H_
