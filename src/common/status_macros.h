// Internal helpers for propagating absl::Status. Debian 12's Abseil (20220623) predates
// absl's own return-if-error macro, so this gives the same shape in two lines.
#ifndef PAGEDKV_COMMON_STATUS_MACROS_H_
#define PAGEDKV_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"

#define PAGEDKV_RETURN_IF_ERROR(expr)                 \
  do {                                                \
    if (absl::Status pagedkv_status_ = (expr); !pagedkv_status_.ok()) { \
      return pagedkv_status_;                         \
    }                                                 \
  } while (false)

#endif  // PAGEDKV_COMMON_STATUS_MACROS_H_
