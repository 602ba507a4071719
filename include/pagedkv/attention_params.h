// File: pagedkv/attention_params.h
//
// The argument bundles the attention and cache-write kernels receive, on CPU and CUDA
// alike, and the work decomposition both follow. Host code normally calls the validated
// wrappers in pagedkv/attention.h instead; this header is what cuda/ includes (no Abseil).
//
// Work decomposition: one work item (a CTA on CUDA) per (sequence, KV head, z), where z is
// the split index for decode (split-K, see decode_plan.h) and the query-tile index for
// extend. A work item owns `rows` = query tokens x group_size query heads, which share
// every K/V tile it loads: the GQA group is served by one pass over the KV head's tokens.
// Row r is query token r / group_size and query head kv_head * group_size +
// r % group_size. Query token i of the item, at position pos_i = causal_base + i, attends
// to context tokens [first_attended(kind, window, pos_i), pos_i] (layer_group.h: every
// earlier token for kFull, its window for the windowed kinds); tokens outside are excluded
// by selection, never by multiplying with zero.
//
// What is read: an item reads context tokens [begin, end) only. begin is the first token
// its first query attends (0 for kFull), end is at most the context length, so a windowed
// group's blocks wholly before the window (released by the allocator, their table entries
// kPaddingBlock) are never addressed, and slots before the window in the first held block
// are never read either. Decode splits count from the window start rounded down to a block
// (decode_base()), so split boundaries stay block-aligned and the plan covers the window
// length, not the context length.
//
// MLA (paged_mla_decode): the same decomposition with one KV "head" holding one latent
// vector per token (kv.head_dim = kv_lora_rank + rope dims), the V pool being the K pool,
// v_dim = kv_lora_rank the value / output dims (the first v_dim of each latent), and the
// num_q_heads query heads forming one group.
#ifndef PAGEDKV_ATTENTION_PARAMS_H_
#define PAGEDKV_ATTENTION_PARAMS_H_

#include <cstdint>

#include "pagedkv/block_table.h"
#include "pagedkv/dtype.h"
#include "pagedkv/host_device.h"
#include "pagedkv/kv_cache_view.h"
#include "pagedkv/layer_group.h"

namespace pagedkv {

// log2(e): scores are kept in base 2 (see merge_state.h).
inline constexpr float kLog2e = 1.4426950408889634f;

struct AttentionParams {
  const void* q = nullptr;     // decode [num_seqs, num_q_heads, head_dim];
                               // extend [num_new_tokens, num_q_heads, head_dim]; dtype q_dtype
  void* o = nullptr;           // same shape and dtype as q
  float* maybe_lse = nullptr;  // [rows of q, num_q_heads], natural log; -inf when empty
  DType q_dtype = DType::kFloat32;
  KvCacheView kv;
  BlockTableView table;  // padded table; context_lens include any new (extend) tokens
  const int32_t* maybe_qo_indptr = nullptr;  // extend: [num_seqs + 1]; null for decode
  int32_t num_q_heads = 0;
  int32_t group_size = 1;                // num_q_heads / kv.num_kv_heads
  float score_scale = 0.0f;              // sm_scale * log2(e); the k scale is applied on top
  const float* maybe_k_scale = nullptr;  // fp8 KV: dequantized K = stored K * *k_scale
  const float* maybe_v_scale = nullptr;  // fp8 KV: dequantized V = stored V * *v_scale
  int32_t num_splits = 1;                // decode: z range; extend: 1
  int32_t tokens_per_split = 0;          // decode split size, a multiple of block_size
  int32_t q_tile = 1;                    // query tokens per work item (decode: 1)
  int32_t num_q_tiles = 1;               // extend: z range, ceil(max_query_len / q_tile)
  float* maybe_partial_o = nullptr;      // split-K: [num_splits, num_seqs, num_q_heads, head_dim]
  float* maybe_partial_ml = nullptr;     // split-K: [num_splits, num_seqs, num_q_heads, 2]
  // Which tokens a query attends (layer_group.h); window > 0 for the windowed kinds.
  AttentionKind kind = AttentionKind::kFull;
  int32_t window = 0;
  // [num_q_heads] sink logits, natural log units (the scale of sm_scale * q.k), or null.
  // A sink joins each row's softmax denominator once, with no value.
  const float* maybe_sinks = nullptr;
  // Value and output dims: 0 means kv.head_dim (GQA, V in its own pool). MLA: the first
  // v_dim elements of each latent, read from the K pool (kv.v == kv.k).
  int32_t v_dim = 0;
};

// First context token that the query at position `pos` (>= 0) attends: first_attended()
// of layer_group.h in 32-bit arithmetic (positions are int32 here, and a 64-bit remainder
// is a subroutine call on the device); tests check that both agree. 0 for kFull.
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE int32_t window_first(const AttentionParams& p, int32_t pos) {
  switch (p.kind) {
    case AttentionKind::kSlidingWindow:
      return pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
    case AttentionKind::kChunkedLocal:
      return pos - pos % p.window;
    case AttentionKind::kFull:
    case AttentionKind::kState:  // refused by the argument checks: no K/V to attend
      break;
  }
  return 0;
}

// Decode splits of a sequence of `len` tokens cover [decode_base(), len): the window start
// of its query rounded down to a block (0 for kFull), so split boundaries are block-aligned.
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE int32_t decode_base(const AttentionParams& p, int32_t len) {
  if (p.kind == AttentionKind::kFull) return 0;
  const int32_t first = window_first(p, len - 1);
  return first - first % p.kv.block_size;
}

// Decode splits of the sequence that hold tokens (1 when it is not split): split z covers
// tokens from decode_base() + z * tokens_per_split, the last one to the end.
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE int32_t decode_live_splits(const AttentionParams& p,
                                                              int32_t len) {
  const int32_t span = len - decode_base(p, len);
  if (p.num_splits <= 1 || span <= p.tokens_per_split) return 1;
  const int32_t n = (span + p.tokens_per_split - 1) / p.tokens_per_split;
  return n < p.num_splits ? n : p.num_splits;
}

// What one (sequence, z) work item covers.
struct WorkItem {
  int32_t q_first = 0;      // first query row of q/o (token index into q)
  int32_t num_q = 0;        // query tokens in this item (0: nothing to do)
  int32_t causal_base = 0;  // query token i sits at position causal_base + i and attends
                            // to [window_first(causal_base + i), causal_base + i]
  int32_t begin = 0;        // first context token this item reads (>= its window start)
  int32_t end = 0;          // one past the last; begin >= end means an empty item
};

PAGEDKV_HOST_DEVICE PAGEDKV_INLINE WorkItem describe_work(const AttentionParams& p, int32_t seq,
                                                          int32_t z) {
  WorkItem w;
  const int32_t len = p.table.context_lens[seq];
  if (p.maybe_qo_indptr == nullptr) {  // decode: one query token, split z of its window
    w.q_first = seq;
    w.num_q = 1;
    w.causal_base = len - 1;
    const int32_t first = len > 0 ? window_first(p, len - 1) : 0;
    if (p.num_splits <= 1) {
      w.begin = first;
      w.end = len;
    } else {
      const int64_t base = decode_base(p, len);
      const int64_t begin = base + int64_t{z} * p.tokens_per_split;
      const int64_t end = z == p.num_splits - 1 ? len : begin + p.tokens_per_split;
      w.begin = static_cast<int32_t>(begin < first ? first : (begin < len ? begin : len));
      w.end = static_cast<int32_t>(end < len ? end : len);
    }
    return w;
  }
  const int32_t q_begin = p.maybe_qo_indptr[seq];
  const int32_t num_new = p.maybe_qo_indptr[seq + 1] - q_begin;
  const int32_t first = z * p.q_tile;
  int32_t num_q = num_new - first;
  num_q = num_q < 0 ? 0 : (num_q > p.q_tile ? p.q_tile : num_q);
  w.q_first = q_begin + first;
  w.num_q = num_q;
  w.causal_base = len - num_new + first;
  // The item's first query attends the earliest token of any of its queries (first_attended
  // never decreases with the position).
  w.begin = num_q > 0 ? window_first(p, w.causal_base) : 0;
  const int32_t end = num_q > 0 ? w.causal_base + num_q : 0;
  w.end = end < 0 ? 0 : (end > len ? len : end);
  return w;
}

struct WriteKvParams {
  const void* k = nullptr;  // [num_tokens, num_kv_heads, head_dim], src_dtype, contiguous
  const void* v = nullptr;  // null: K only (MLA latents)
  DType src_dtype = DType::kFloat32;
  const int64_t* slot_mapping = nullptr;  // [num_tokens]; a negative slot is skipped
  int32_t num_tokens = 0;
  const float* maybe_k_scale = nullptr;  // fp8 cache: stored K = K / *k_scale
  const float* maybe_v_scale = nullptr;
  KvCacheView kv;
};

}  // namespace pagedkv

#endif  // PAGEDKV_ATTENTION_PARAMS_H_
