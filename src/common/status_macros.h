// Internal helpers for propagating absl::Status. Debian 12's Abseil (20220623) predates
// absl's own return-if-error macro, so this gives the same shape in two lines.
#ifndef PAGEDKV_COMMON_STATUS_MACROS_H_
#define PAGEDKV_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"

#define PAGEDKV_RETURN_IF_ERROR(expr)                                   \
  do {                                                                  \
    if (absl::Status pagedkv_status_ = (expr); !pagedkv_status_.ok()) { \
      return pagedkv_status_;                                           \
    }                                                                   \
  } while (false)

// PAGEDKV_ASSIGN_OR_RETURN(T lhs, expr): evaluates the StatusOr `expr`; returns its status
// on error, else declares `lhs` from its value.
#define PAGEDKV_STATUS_CONCAT_INNER(a, b) a##b
#define PAGEDKV_STATUS_CONCAT(a, b) PAGEDKV_STATUS_CONCAT_INNER(a, b)
#define PAGEDKV_ASSIGN_OR_RETURN(lhs, expr) \
  PAGEDKV_ASSIGN_OR_RETURN_IMPL(PAGEDKV_STATUS_CONCAT(pagedkv_statusor_, __LINE__), lhs, expr)
#define PAGEDKV_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return statusor.status();            \
  lhs = *std::move(statusor)

#endif  // PAGEDKV_COMMON_STATUS_MACROS_H_
