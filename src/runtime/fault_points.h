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

}  // namespace holdfast::runtime_internal

#endif  // HOLDFAST_SRC_RUNTIME_FAULT_POINTS_H_
