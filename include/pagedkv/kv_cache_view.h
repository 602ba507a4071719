// File: pagedkv/kv_cache_view.h
//
// KvCacheView: one layer's K and V pools as the kernels see them: two raw pointers, the
// sizes and explicit element strides. Passed by value to every kernel; no allocator or
// storage object reaches a kernel. No Abseil dependency (cuda/ includes it).
//
// Layouts (per layer, K and V alike, element strides; the head_dim stride is always 1):
//   HND (default)  [num_blocks][num_kv_heads][block_size][head_dim]
//                  block_stride = num_kv_heads * block_size * head_dim
//                  head_stride  = block_size * head_dim,  token_stride = head_dim
//                  One KV head's tokens of a block are contiguous: what a per-KV-head
//                  decode CTA reads.
//   NHD            [num_blocks][block_size][num_kv_heads][head_dim]
//                  block_stride = block_size * num_kv_heads * head_dim
//                  head_stride  = head_dim,  token_stride = num_kv_heads * head_dim
//                  What FlashAttention-style kernels expect.
// Address math is int64 (elem_offset widens before multiplying); block ids are int32.
//
// Example:
//   KvCacheView view = make_kv_cache_view(k_pool, v_pool, DType::kBFloat16,
//                                         /*num_blocks=*/4096, /*num_kv_heads=*/8,
//                                         /*block_size=*/16, /*head_dim=*/128);
//   int64_t e = elem_offset(view, /*block=*/17, /*head=*/3, /*token=*/5, /*dim=*/0);
//   // K of that token/head starts at static_cast<bf16*>(view.k) + e.
#ifndef PAGEDKV_KV_CACHE_VIEW_H_
#define PAGEDKV_KV_CACHE_VIEW_H_

#include <cstdint>

#include "pagedkv/dtype.h"
#include "pagedkv/host_device.h"

namespace pagedkv {

enum class KvLayout : uint8_t {
  kHND,  // [num_blocks][num_kv_heads][block_size][head_dim]
  kNHD,  // [num_blocks][block_size][num_kv_heads][head_dim]
};

struct KvCacheView {
  void* k = nullptr;  // K pool of one layer, dtype elements
  void* v = nullptr;  // V pool of one layer, same shape and strides as K
  DType dtype = DType::kBFloat16;
  int32_t num_blocks = 0;
  int32_t num_kv_heads = 0;
  int32_t block_size = 0;  // tokens per block
  int32_t head_dim = 0;
  int64_t block_stride = 0;  // elements between consecutive blocks
  int64_t head_stride = 0;   // elements between consecutive KV heads
  int64_t token_stride = 0;  // elements between consecutive tokens of a block
};

// Strides of `layout` for the given sizes.
constexpr KvCacheView make_kv_cache_view(void* k, void* v, DType dtype, int32_t num_blocks,
                                         int32_t num_kv_heads, int32_t block_size, int32_t head_dim,
                                         KvLayout layout = KvLayout::kHND) {
  KvCacheView view;
  view.k = k;
  view.v = v;
  view.dtype = dtype;
  view.num_blocks = num_blocks;
  view.num_kv_heads = num_kv_heads;
  view.block_size = block_size;
  view.head_dim = head_dim;
  view.block_stride = int64_t{num_kv_heads} * block_size * head_dim;
  if (layout == KvLayout::kHND) {
    view.head_stride = int64_t{block_size} * head_dim;
    view.token_stride = head_dim;
  } else {
    view.head_stride = head_dim;
    view.token_stride = int64_t{num_kv_heads} * head_dim;
  }
  return view;
}

// Elements of one pool (K or V) of `view`: num_blocks * block_stride.
constexpr int64_t pool_elements(const KvCacheView& view) {
  return int64_t{view.num_blocks} * view.block_stride;
}

// Element offset of (block, head, token-in-block, dim) from the start of a pool.
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE int64_t elem_offset(const KvCacheView& view, int32_t block,
                                                       int32_t head, int32_t token, int32_t dim) {
  return static_cast<int64_t>(block) * view.block_stride +
         static_cast<int64_t>(head) * view.head_stride +
         static_cast<int64_t>(token) * view.token_stride + dim;
}

// Element offset of head `head`, dim 0 of the token in `slot` (block * block_size + offset).
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE int64_t slot_offset(const KvCacheView& view, int64_t slot,
                                                       int32_t head) {
  const int64_t block = slot / view.block_size;
  const int64_t token = slot - block * view.block_size;
  return block * view.block_stride + static_cast<int64_t>(head) * view.head_stride +
         token * view.token_stride;
}

// Element offset of (head, dim 0) of context token `t` of a sequence whose padded table row
// is `row`. Reads row[t / block_size] only, so t < context length keeps every read inside
// the first ceil(len / block_size) entries.
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE int64_t token_offset(const KvCacheView& view, const int32_t* row,
                                                        int32_t t, int32_t head) {
  const int32_t entry = t / view.block_size;
  return elem_offset(view, row[entry], head, t - entry * view.block_size, 0);
}

}  // namespace pagedkv

#endif  // PAGEDKV_KV_CACHE_VIEW_H_
