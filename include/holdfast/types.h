// Element types, reductions and operation kinds of holdfast's collectives.
// Plain value types; safe from any thread.
#ifndef HOLDFAST_TYPES_H_
#define HOLDFAST_TYPES_H_

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"

namespace holdfast {

// Element types of communication buffers. kBFloat16 and kFloat16 are 16-bit
// storage types; reductions on them compute in float32 and round to nearest
// even.
enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kBFloat16 = 4,
  kFloat16 = 5,
  kUInt8 = 6,
  kInt8 = 7,
  // One byte per element, 0 or 1. A sum is a logical or, a product a
  // logical and; an average is refused.
  kBool = 8,
};
inline constexpr int kNumDataTypes = 9;

// kAverage divides the sum by the group size; on integer types the quotient
// is truncated toward zero.
// Where a communicator's buffers live: host memory (Gloo) or the memory of
// one CUDA device (NCCL).
enum class MemoryKind : uint8_t {
  kHost = 0,
  kCudaDevice = 1,
};

enum class ReduceOp : uint8_t {
  kSum = 0,
  kMin = 1,
  kMax = 2,
  kProduct = 3,
  kAverage = 4,
};
inline constexpr int kNumReduceOps = 5;

enum class OpType : uint8_t {
  kAllReduce = 0,
  kBroadcast = 1,
  kAllGather = 2,
  kReduceScatter = 3,
  kAllToAll = 4,
  kBarrier = 5,
  kSend = 6,
  kRecv = 7,
};

// Size in bytes of one element; 0 for a value outside the enum.
size_t DataTypeSize(DataType dtype);
absl::string_view DataTypeName(DataType dtype);
absl::string_view ReduceOpName(ReduceOp op);
absl::string_view OpTypeName(OpType op);

// True if `op` is a collective (every rank of the group takes part).
inline bool IsCollective(OpType op) {
  return op != OpType::kSend && op != OpType::kRecv;
}

}  // namespace holdfast

#endif  // HOLDFAST_TYPES_H_
