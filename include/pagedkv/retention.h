// File: pagedkv/retention.h
//
// Retention: how long cached blocks outlive others. A block's priority orders eviction:
// free cached blocks of the lowest priority are evicted first, least recently used first
// within a priority. With a duration, the priority holds for that many milliseconds of
// the pool's clock after the block is freed; then the block returns to the default
// priority at the place its last use gives it in that priority's LRU order. Priorities
// follow TensorRT-LLM's KV cache retention config: [0, 100], default 35. A pool where no
// block is given a priority evicts in its EvictionPolicy's order (LRU by default).
#ifndef PAGEDKV_RETENTION_H_
#define PAGEDKV_RETENTION_H_

#include <cstdint>
#include <limits>

namespace pagedkv {

inline constexpr int32_t kMinRetentionPriority = 0;
inline constexpr int32_t kMaxRetentionPriority = 100;
inline constexpr int32_t kDefaultRetentionPriority = 35;

// Which cached free block of the lowest priority is evicted first.
//   kLru: the least recently used (vLLM's, SGLang's and LMCache's order).
//   kAdaptive: ARC over cached blocks (recency against frequency, steered by ghost lists of
//     recently evicted hashes), never evicting a block before its cached children. It
//     gains over LRU where long one-off prompts flush reused prefixes: docs/results.md,
//     "Eviction beyond LRU". Costs 17 bytes per block, and ghosts (about 40 bytes each, at
//     most one per block) as blocks are evicted.
enum class EvictionPolicy : uint8_t { kLru, kAdaptive };

// The retention of the blocks of a sequence whose first token lies in [begin, end).
struct RetentionRange {
  int32_t begin = 0;
  int32_t end = std::numeric_limits<int32_t>::max();
  int32_t priority = kDefaultRetentionPriority;
  int64_t duration_ms = 0;  // 0: no expiry
};

}  // namespace pagedkv

#endif  // PAGEDKV_RETENTION_H_
