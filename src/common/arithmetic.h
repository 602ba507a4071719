// Integer helpers shared by the allocator, the planner and the storage layout.
#ifndef PAGEDKV_SRC_COMMON_ARITHMETIC_H_
#define PAGEDKV_SRC_COMMON_ARITHMETIC_H_

#include <cstdint>

namespace pagedkv::internal {

// ceil(a / b) for a >= 0, b > 0; in int64, so block counts near INT32_MAX do not wrap.
constexpr int64_t div_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace pagedkv::internal

#endif  // PAGEDKV_SRC_COMMON_ARITHMETIC_H_
