#include "src/control/wire/member_sink.h"

namespace holdfast::control {

absl::StatusOr<bool> BindStream(MemberSink** bound, MemberSink* sink) {
  if (*bound == sink) return false;
  if (sink->Closed()) {
    return absl::AbortedError("this stream was superseded by a newer one");
  }
  if (*bound != nullptr) {
    (*bound)->Close(absl::AbortedError("superseded by a newer stream"));
  }
  *bound = sink;
  return true;
}

}  // namespace holdfast::control
