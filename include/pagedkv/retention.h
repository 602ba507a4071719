// File: pagedkv/retention.h
//
// Retention: how long cached blocks outlive others. A block's priority orders eviction:
// free cached blocks of the lowest priority are evicted first, least recently used first
// within a priority. With a duration, the priority holds for that many milliseconds of
// the pool's clock after the block is freed; then the block returns to the default
// priority at the place its last use gives it in that priority's LRU order. Priorities
// follow TensorRT-LLM's KV cache retention config: [0, 100], default 35. A pool where no
// block is given a priority evicts in plain LRU order.
#ifndef PAGEDKV_RETENTION_H_
#define PAGEDKV_RETENTION_H_

#include <cstdint>
#include <limits>

namespace pagedkv {

inline constexpr int32_t kMinRetentionPriority = 0;
inline constexpr int32_t kMaxRetentionPriority = 100;
inline constexpr int32_t kDefaultRetentionPriority = 35;

// The retention of the blocks of a sequence whose first token lies in [begin, end).
struct RetentionRange {
  int32_t begin = 0;
  int32_t end = std::numeric_limits<int32_t>::max();
  int32_t priority = kDefaultRetentionPriority;
  int64_t duration_ms = 0;  // 0: no expiry
};

}  // namespace pagedkv

#endif  // PAGEDKV_RETENTION_H_
