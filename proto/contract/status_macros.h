// Early-return helpers for absl::Status (the packaged Abseil has none).
#ifndef HOSTKV_PROTO_CONTRACT_STATUS_MACROS_H_
#define HOSTKV_PROTO_CONTRACT_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns from the current function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status hostkv_status_ = (expr);            \
    if (!hostkv_status_.ok()) return hostkv_status_;   \
  } while (0)

#define HOSTKV_CONCAT_INNER(a, b) a##b
#define HOSTKV_CONCAT(a, b) HOSTKV_CONCAT_INNER(a, b)

// ASSIGN_OR_RETURN(T lhs, StatusOr<T> expr): assigns the value or returns
// the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  HOSTKV_ASSIGN_OR_RETURN_IMPL(HOSTKV_CONCAT(hostkv_or_, __LINE__), lhs, expr)

#define HOSTKV_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#endif  // HOSTKV_PROTO_CONTRACT_STATUS_MACROS_H_
