// File: pagedkv/attention.h
//
// The KV-cache kernels as host code calls them: write the new tokens' K/V through the slot
// mapping, paged decode attention (one query token per sequence), paged extend (prefill)
// attention (the new tokens of each sequence attend causally to the cached prefix and to
// each other), and paged MLA decode (DeepSeek-V2/V3: one latent vector per token, absorbed
// queries). Decode and extend serve every layer-group kind (layer_group.h: full, sliding
// window, chunked local) and optional attention sinks (gpt-oss). Each call runs on the Device it is
// given, with pointers of that device: host pointers for kCpu, device pointers for kCuda. Streams:
// every kernel call (and every KvStorage copy) takes its stream as the last argument, a
// cudaStream_t or nullptr for the legacy default stream, and is queued on it asynchronously; CPU
// calls ignore it. Run a step's write_kv, copies and attention on one stream (or order them). The
// CPU versions are the reference the CUDA ones are tested against; both share layouts, address
// math, the split plan and the softmax merge (kv_cache_view.h, decode_plan.h, merge_state.h).
//
// Supported: q / out dtype fp32, fp16, bf16; KV in the q dtype, or fp8 e4m3 with
// per-tensor fp32 scales (by pointer on the call's device; null means 1); head_dim 64, 128,
// 256; any block_size >= 1 (8, 16 and 32 are the tested ones); num_q_heads a multiple of
// num_kv_heads. Unsupported values are refused with InvalidArgument before any work.
//
// Block-table contract: row i of the table holds ceil(context_lens[i] / block_size) entries;
// entries beyond, and slots beyond the context length, are never read, so they may hold
// anything (tests fill them with NaN). For a windowed kind (kSlidingWindow,
// kChunkedLocal) the kernels read from the window start of the call's first query of the
// sequence on: entries of blocks wholly before it (released by the allocator, which writes
// kPaddingBlock there) and the slots before it are never read either, so the cost follows
// the window, not the context. The CPU wrappers check every id and length they read
// (InvalidArgument naming the sequence, the value and the limit); the CUDA wrappers cannot
// read device tables, so there those are the caller's contract.
//
// Example (one decode step of one layer, on whatever device is present):
//   Device device = default_device();
//   KvCacheView cache = storage.view(layer);
//   PAGEDKV_RETURN_IF_ERROR(write_kv(device, cache, {.k = k, .v = v,
//       .src_dtype = DType::kFloat32, .slot_mapping = slots, .num_tokens = num_seqs}));
//   PAGEDKV_RETURN_IF_ERROR(paged_decode_attention(device, cache, tables.padded(),
//       {.q = q, .out = out, .dtype = DType::kFloat32, .num_q_heads = 8,
//        .max_context_len = max_len}));
//   // Prefill / extend: write the new tokens' K/V first (write_kv with their slots), then
//   // sequence i's qo_indptr[i + 1] - qo_indptr[i] new query rows attend causally.
//   PAGEDKV_RETURN_IF_ERROR(paged_extend_attention(device, cache, tables.padded(),
//       {.q = q_new, .out = out_new, .dtype = DType::kFloat32, .num_q_heads = 8,
//        .qo_indptr = qo_indptr, .max_query_len = longest_prompt}));
//   // A sliding-window layer group (Gemma 3: 1,024 tokens) reads only its window.
//   PAGEDKV_RETURN_IF_ERROR(paged_decode_attention(device, cache, tables.padded(),
//       {.q = q, .out = out, .dtype = DType::kFloat32, .num_q_heads = 8,
//        .max_context_len = max_len, .kind = AttentionKind::kSlidingWindow, .window = 1024}));
#ifndef PAGEDKV_ATTENTION_H_
#define PAGEDKV_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "pagedkv/block_table.h"
#include "pagedkv/decode_plan.h"
#include "pagedkv/device.h"
#include "pagedkv/dtype.h"
#include "pagedkv/kv_cache_view.h"
#include "pagedkv/layer_group.h"

namespace pagedkv {

// Arguments of write_kv().
struct WriteKvArgs {
  const void* k = nullptr;            // [num_tokens, num_kv_heads, head_dim], src_dtype, contiguous
  const void* v = nullptr;            // same shape and dtype as k; null: K only (an MLA latent
                                      // cache, whose V pool may be null)
  DType src_dtype = DType::kFloat32;  // fp32, fp16 or bf16
  const int64_t* slot_mapping = nullptr;  // [num_tokens] slots; a negative slot is skipped
  int32_t num_tokens = 0;
  const float* maybe_k_scale = nullptr;  // fp8 cache: stored K = K / *k_scale (null: 1)
  const float* maybe_v_scale = nullptr;  // fp8 cache: stored V = V / *v_scale (null: 1)
};

// write_kv()
//
// Scatters the K and V of `num_tokens` new tokens into their slots of one layer's pools,
// converting from src_dtype to the cache dtype (rounding to nearest even; fp8 saturates to
// +-448 after dividing by the scale). Slot s is block s / block_size, offset s % block_size.
// With v null only K is written: the latents of an MLA cache (paged_mla_decode()).
// Errors: InvalidArgument for a null pointer, a negative count, an unsupported dtype pair,
// or (CPU) a slot at or beyond num_blocks * block_size, naming the token and the limit.
// On CUDA an out-of-range slot is the caller's contract (the kernel skips it).
[[nodiscard]] absl::Status write_kv(Device device, const KvCacheView& cache,
                                    const WriteKvArgs& args, void* stream = nullptr);

// Arguments of paged_decode_attention().
struct DecodeArgs {
  const void* q = nullptr;        // [num_seqs, num_q_heads, head_dim], dtype
  void* out = nullptr;            // [num_seqs, num_q_heads, head_dim], dtype
  float* maybe_lse = nullptr;     // [num_seqs, num_q_heads] natural log-sum-exp, or null
  DType dtype = DType::kFloat32;  // of q and out: fp32, fp16 or bf16
  int32_t num_q_heads = 0;
  float sm_scale = 0.0f;                 // softmax scale; 0 means 1 / sqrt(head_dim)
  const float* maybe_k_scale = nullptr;  // fp8 KV only (null: 1)
  const float* maybe_v_scale = nullptr;  // fp8 KV only (null: 1)
  // Upper bound of the batch's context lengths, used to plan split-K. Required on CUDA
  // when splitting (the lengths live in device memory); on CPU 0 means "compute it".
  int32_t max_context_len = 0;
  // Sum of the batch's context lengths, if known (the scheduler has them on the host): a
  // skewed batch (one long sequence among short ones) then splits its long sequence over
  // the whole GPU. 0 assumes every sequence has max_context_len tokens.
  int64_t total_context_len = 0;
  // The layer group's kind and window (layer_group.h; window > 0 for the windowed kinds,
  // ignored for kFull): the query at position p attends to [first_attended(kind, window,
  // p), p] only, and the split plan covers the window, not the context.
  AttentionKind kind = AttentionKind::kFull;
  int32_t window = 0;
  // [num_q_heads] fp32 sink logits on the call's device, or null (gpt-oss): in the units of
  // sm_scale * q.k, each joins its head's softmax denominator once, with no value; lse
  // includes it, and an empty context gives zeros and lse = sink.
  const float* maybe_sinks = nullptr;
};

// Options of paged_decode_attention().
struct DecodeOptions {
  int32_t num_splits = 0;  // 0: automatic plan; 1: no split; n > 1: exactly n splits
  // CUDA split-K partials (decode_workspace_bytes() of the plan). Null: a buffer the
  // library keeps and grows (one per process: not for calls on concurrent streams; while
  // the stream is capturing a CUDA graph it is used only if already large enough, since
  // growing it would break the capture: FailedPrecondition then). Pass a workspace per
  // stream, and one for graph capture.
  void* maybe_workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// paged_decode_attention()
//
// For each sequence i and query head h: out[i, h] = softmax(sm_scale * q[i, h] . K^T) V
// over the tokens its query (at position context_lens[i] - 1) attends: all of them for
// kFull, its window for the windowed kinds; read through its block-table row, with K/V of
// KV head h / (num_q_heads / num_kv_heads). A sink logit, when given, joins the softmax
// denominator. A zero-length context gives zeros (and lse -inf, or the sink). Split-K
// partials are merged by log-sum-exp in fp32.
// Errors: InvalidArgument naming the value and the limit (dtype, head_dim, head counts,
// kind and window, table shape, CPU: ids and lengths, CUDA: a workspace that is too small).
// FailedPrecondition when the library workspace would have to grow during graph capture.
// Internal if a CUDA launch fails. Debug builds of the CUDA kernels assert on block ids
// and lengths outside the table's contract.
[[nodiscard]] absl::Status paged_decode_attention(Device device, const KvCacheView& cache,
                                                  const BlockTableView& table,
                                                  const DecodeArgs& args,
                                                  const DecodeOptions& options = {},
                                                  void* stream = nullptr);

// The plan paged_decode_attention() uses for these arguments on `device` (SM count and
// occupancy of the current CUDA device; one worker on CPU).
[[nodiscard]] DecodePlan plan_decode_for(Device device, const KvCacheView& cache,
                                         const BlockTableView& table, const DecodeArgs& args,
                                         const DecodeOptions& options = {});

// Arguments of paged_extend_attention().
struct ExtendArgs {
  const void* q = nullptr;     // [num_new_tokens, num_q_heads, head_dim], dtype; the new
                               // tokens of all sequences, sequence after sequence
  void* out = nullptr;         // same shape and dtype as q
  float* maybe_lse = nullptr;  // [num_new_tokens, num_q_heads] natural log, or null
  DType dtype = DType::kFloat32;
  int32_t num_q_heads = 0;
  float sm_scale = 0.0f;  // 0 means 1 / sqrt(head_dim)
  const float* maybe_k_scale = nullptr;
  const float* maybe_v_scale = nullptr;
  // [num_seqs + 1]: the new tokens of sequence i are q rows qo_indptr[i] ..
  // qo_indptr[i + 1], and they are the last tokens of its context_lens[i].
  const int32_t* qo_indptr = nullptr;
  // Largest number of new tokens of one sequence. Required on CUDA (it sizes the grid);
  // on CPU 0 means "compute it".
  int32_t max_query_len = 0;
  // As in DecodeArgs: the group's kind and window (per query token, so a chunk boundary
  // inside the new tokens splits them), and optional sink logits.
  AttentionKind kind = AttentionKind::kFull;
  int32_t window = 0;
  const float* maybe_sinks = nullptr;
};

// paged_extend_attention()
//
// Prefill / extend attention over the paged cache: the K/V of the new tokens must already
// be written (write_kv). New token j of sequence i sits at position p = context_lens[i] -
// n_i + j and attends to context tokens [first_attended(kind, window, p), p] (kFull: the
// cached prefix and the new tokens up to itself, causal), read through the block table,
// K/V head h / group as in decode; sinks as in decode.
// Errors: as paged_decode_attention(), plus (CPU) a sequence with more new tokens than
// context, naming both.
[[nodiscard]] absl::Status paged_extend_attention(Device device, const KvCacheView& cache,
                                                  const BlockTableView& table,
                                                  const ExtendArgs& args, void* stream = nullptr);

// Arguments of paged_mla_decode().
struct MlaDecodeArgs {
  // [num_seqs, num_heads, kv_lora_rank + qk_rope_head_dim], dtype: the absorbed queries
  // (q_nope W_UK, then q_pe), in the order of the latent's elements.
  const void* q = nullptr;
  // [num_seqs, num_heads, kv_lora_rank], dtype: the probability-weighted latents, before
  // the value up-projection W_UV.
  void* out = nullptr;
  float* maybe_lse = nullptr;      // [num_seqs, num_heads] natural log-sum-exp, or null
  DType dtype = DType::kBFloat16;  // of q and out: fp32, fp16 or bf16
  int32_t num_heads = 0;           // query heads (the MMA's M dimension on CUDA), > 0
  int32_t kv_lora_rank = 0;        // value dims of a latent (DeepSeek-V2/V3: 512)
  int32_t qk_rope_head_dim = 0;    // rope dims after them (DeepSeek-V2/V3: 64)
  // Softmax scale, required (> 0): the model's, e.g. 1 / sqrt(qk_nope + qk_rope head dims)
  // (times the YaRN mscale^2), which the latent's dims do not determine.
  float sm_scale = 0.0f;
  // fp8 latent cache: dequantized latent = stored * *kv_scale (a per-tensor scale on the
  // call's device; null: 1).
  const float* maybe_kv_scale = nullptr;
  int32_t max_context_len = 0;    // as in DecodeArgs
  int64_t total_context_len = 0;  // as in DecodeArgs
};

// paged_mla_decode()
//
// Multi-head latent attention decode over a paged latent cache (DeepSeek-V2/V3, FlashMLA's
// layout): `cache` holds one latent vector per token, num_kv_heads == 1 and head_dim ==
// kv_lora_rank + qk_rope_head_dim, in its K pool (the V pool is not used and may be null).
// For each sequence i and head h, over the sequence's first context_lens[i] tokens t:
//   s_t = sm_scale * q[i, h] . latent_t          (all kv_lora_rank + rope elements)
//   out[i, h] = sum_t softmax(s)_t latent_t[0 .. kv_lora_rank)
// All heads share every latent row: CUDA serves them as the MMA's M dimension (up to 64
// heads per CTA, loading each latent tile once for all of them), split-K over long
// contexts with the decode plan and log-sum-exp merge. One head count per call; lengths
// may differ within the batch. A zero-length context gives zeros and lse -inf.
// Supported: CPU any dims and head count, q fp32/fp16/bf16, cache in the q dtype or fp8
// e4m3. CUDA: kv_lora_rank 512 + qk_rope_head_dim 64 only, q fp16 or bf16 (cache in the q
// dtype or fp8), any head count and block size; other dims or fp32 q are refused with
// InvalidArgument.
// Errors: InvalidArgument naming the value and the limit; FailedPrecondition and Internal
// as in paged_decode_attention().
[[nodiscard]] absl::Status paged_mla_decode(Device device, const KvCacheView& cache,
                                            const BlockTableView& table, const MlaDecodeArgs& args,
                                            const DecodeOptions& options = {},
                                            void* stream = nullptr);

// The plan paged_mla_decode() uses for these arguments on `device` (its workspace:
// decode_workspace_bytes(plan, num_seqs, num_heads, kv_lora_rank)).
[[nodiscard]] DecodePlan plan_mla_decode_for(Device device, const KvCacheView& cache,
                                             const BlockTableView& table, const MlaDecodeArgs& args,
                                             const DecodeOptions& options = {});

}  // namespace pagedkv

#endif  // PAGEDKV_ATTENTION_H_
