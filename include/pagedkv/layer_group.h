// File: pagedkv/layer_group.h
//
// Layer groups: the layers of a model that see the same tokens share one block table per
// sequence. A model of full-attention layers only is one group; a hybrid model has one
// group per attention kind (and window), e.g. Gemma 3: 52 sliding-window layers of 1,024
// tokens and 10 full layers, two groups. Each group has a pool of its own, sized in bytes
// of its own layers (KvCacheConfig), so no group pads its blocks to another's size.
//
//   kFull           a token attends to every earlier token and itself.
//   kSlidingWindow  a token at position p attends to [p - window + 1, p]
//                   (Mistral, Gemma 2/3, gpt-oss, Command-A: vLLM's sliding_window).
//   kChunkedLocal   a token at position p attends to [p - p % window, p], the tokens of
//                   its own window-aligned chunk (Llama 4's attention_chunk_size).
//   kState          not attention: state-space or linear-attention layers (Mamba2, Gated
//                   DeltaNet) that keep one fixed-size state per sequence, updated in
//                   place every token. The group's pool holds state slots, not token
//                   blocks: one per running sequence, the rest checkpoints (a copy of a
//                   sequence's state at a block-aligned position, found by the prefix
//                   hash there). A token reads no earlier token's K/V.
//
// Blocks wholly before the first position any future token of a sequence attends to are
// released by the manager (hashed ones stay cached); kernels never read them.
//
// No Abseil or CUDA dependency: kernels include it for first_attended() (full_attention() is
// host code).
#ifndef PAGEDKV_LAYER_GROUP_H_
#define PAGEDKV_LAYER_GROUP_H_

#include <cstdint>
#include <vector>

#include "pagedkv/host_device.h"

namespace pagedkv {

enum class AttentionKind : uint8_t {
  kFull,
  kSlidingWindow,
  kChunkedLocal,
  kState,
};

// The first position that a token at `pos` attends to, for a group of `kind` with
// `window` tokens (ignored for kFull). window > 0 for the windowed kinds.
PAGEDKV_HOST_DEVICE constexpr int64_t first_attended(AttentionKind kind, int32_t window,
                                                     int64_t pos) {
  switch (kind) {
    case AttentionKind::kSlidingWindow:
      return pos - window + 1 > 0 ? pos - window + 1 : 0;
    case AttentionKind::kChunkedLocal:
      return pos - pos % window;
    case AttentionKind::kState:
      return pos;
    case AttentionKind::kFull:
      break;
  }
  return 0;
}

// What the allocator knows of a group: which tokens its layers attend to, and its pools.
struct LayerGroup {
  AttentionKind kind = AttentionKind::kFull;
  int32_t window = 0;           // tokens: > 0 for the windowed kinds, 0 for kFull and kState
  int32_t num_blocks = 0;       // device blocks (kState: state slots) of the group's pool, > 0
  int32_t num_host_blocks = 0;  // host blocks (swap and host tier) of the group, >= 0
};

// The layer groups of a model whose layers all attend to every earlier token: one
// full-attention group of `num_blocks` device and `num_host_blocks` host blocks. E.g.
//   KvCacheManager::create({.block_size = 16, .layer_groups = full_attention(4096)});
inline std::vector<LayerGroup> full_attention(int32_t num_blocks, int32_t num_host_blocks = 0) {
  return {
      {.kind = AttentionKind::kFull, .num_blocks = num_blocks, .num_host_blocks = num_host_blocks}};
}

inline const char* attention_kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kFull:
      return "full";
    case AttentionKind::kSlidingWindow:
      return "sliding_window";
    case AttentionKind::kChunkedLocal:
      return "chunked_local";
    case AttentionKind::kState:
      return "state";
  }
  return "unknown";
}

}  // namespace pagedkv

#endif  // PAGEDKV_LAYER_GROUP_H_
