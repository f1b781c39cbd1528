// Status helpers for holdfast's public API.
// Every fallible call returns absl::Status or absl::StatusOr<T>; these macros
// propagate errors. Thread-safe: they are plain expressions.
#ifndef HOLDFAST_STATUS_H_
#define HOLDFAST_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define HOLDFAST_STATUS_CONCAT_INNER_(a, b) a##b
#define HOLDFAST_STATUS_CONCAT_(a, b) HOLDFAST_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define HOLDFAST_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::absl::Status holdfast_status_ = (expr);            \
    if (!holdfast_status_.ok()) return holdfast_status_; \
  } while (0)

// `lhs = value of rexpr` (an absl::StatusOr<T>), or returns its error.
#define HOLDFAST_ASSIGN_OR_RETURN(lhs, rexpr) \
  HOLDFAST_ASSIGN_OR_RETURN_IMPL_(            \
      HOLDFAST_STATUS_CONCAT_(holdfast_statusor_, __LINE__), lhs, rexpr)

#define HOLDFAST_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                    \
  if (!tmp.ok()) return tmp.status();                    \
  lhs = std::move(tmp).value()

#endif  // HOLDFAST_STATUS_H_
