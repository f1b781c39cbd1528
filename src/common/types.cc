#include "holdfast/types.h"
#include "holdfast/trace.h"

namespace holdfast {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat64:
    case DataType::kInt64:
      return 8;
    case DataType::kBFloat16:
    case DataType::kFloat16:
      return 2;
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
  }
  return 0;
}

absl::string_view DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kFloat16:
      return "float16";
    case DataType::kUInt8:
      return "uint8";
    case DataType::kInt8:
      return "int8";
    case DataType::kBool:
      return "bool";
  }
  return "unknown";
}

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProduct:
      return "product";
    case ReduceOp::kAverage:
      return "average";
  }
  return "unknown";
}

absl::string_view OpTypeName(OpType op) {
  switch (op) {
    case OpType::kAllReduce:
      return "AllReduce";
    case OpType::kBroadcast:
      return "Broadcast";
    case OpType::kAllGather:
      return "AllGather";
    case OpType::kReduceScatter:
      return "ReduceScatter";
    case OpType::kAllToAll:
      return "AllToAll";
    case OpType::kBarrier:
      return "Barrier";
    case OpType::kSend:
      return "Send";
    case OpType::kRecv:
      return "Recv";
  }
  return "Unknown";
}

absl::string_view OpStateName(OpState state) {
  switch (state) {
    case OpState::kEnqueued:
      return "enqueued";
    case OpState::kStarted:
      return "started";
    case OpState::kCompleted:
      return "completed";
    case OpState::kFailed:
      return "failed";
    case OpState::kTimedOut:
      return "timed-out";
    case OpState::kAborted:
      return "aborted";
  }
  return "unknown";
}

}  // namespace holdfast
