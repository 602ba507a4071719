// Internal, kernel side (src/kernels: what both src/attention and cuda/ include, so that
// folders depend one way). Launchers of the CUDA kernels, called by the host wrappers
// (src/attention, src/storage) after validation. Each returns the first CUDA error (cudaSuccess
// when the launch was queued). No Abseil: compiled by nvcc and g++ alike.
#ifndef PAGEDKV_KERNELS_LAUNCH_H_
#define PAGEDKV_KERNELS_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "pagedkv/attention_params.h"
#include "pagedkv/dtype.h"

namespace pagedkv::internal {

// Threads per attention CTA.
inline constexpr int kAttentionThreads = 128;

// The attention kernel serves a work item of `rows` query rows (q_tile x group_size) with
// CTAs of attention_cta_rows() rows each (16 or 64, padded to 16-row MMA tiles; more rows
// take several CTAs). Dynamic shared memory of that CTA shape, or 0 for an unsupported
// dtype / head_dim:
size_t attention_smem_bytes(DType q_dtype, DType kv_dtype, int32_t head_dim, int32_t rows);
int32_t attention_cta_rows(DType q_dtype, DType kv_dtype, int32_t head_dim, int32_t rows);

// Resident attention CTAs per SM on the current device for work items of `rows` rows, of
// the full-attention kernel or the windowed one.
cudaError_t attention_ctas_per_sm(DType q_dtype, DType kv_dtype, int32_t head_dim, int32_t rows,
                                  bool windowed, int* ctas_per_sm);

// Decode (p.maybe_qo_indptr == null; grid num_seqs x num_kv_heads x row chunks x
// num_splits, then a combine kernel when num_splits > 1) or extend (grid num_seqs x
// num_kv_heads x row chunks x num_q_tiles). p.kind picks the full-attention kernel or the
// windowed one (the same template with a lower bound per query row).
cudaError_t launch_paged_attention(const AttentionParams& p, cudaStream_t stream);

// MLA decode (kv_lora_rank 512 + rope 64; q fp16/bf16, latent in the q dtype or fp8): a CTA
// serves up to 64 heads of one (sequence, split); mla_cta_rows() heads per CTA (16, 32 or
// 64, padded to 16-row MMA tiles), 0 for a head count <= 0. Dynamic shared memory and
// resident CTAs per SM for `num_heads` heads, 0 / an error for unsupported dtypes.
int32_t mla_cta_rows(int32_t num_heads);
size_t mla_smem_bytes(DType q_dtype, DType kv_dtype, int32_t num_heads);
cudaError_t mla_ctas_per_sm(DType q_dtype, DType kv_dtype, int32_t num_heads, int* ctas_per_sm);

// p as paged_mla_decode() fills it (kv.num_kv_heads 1, kv.head_dim 576, v_dim 512, group
// = num_q_heads): grid num_seqs x row chunks x num_splits, then the combine kernel when
// num_splits > 1.
cudaError_t launch_mla_decode(const AttentionParams& p, cudaStream_t stream);

cudaError_t launch_write_kv(const WriteKvParams& p, cudaStream_t stream);

// Batched block copies between (or within) buffers holding `num_pools` pools each (one
// per layer and K/V), all with the same block layout. Op i copies, in every pool, the
// first ops[i].num_tokens tokens of block ops[i].src of the source to block ops[i].dst of
// the destination (num_tokens <= 0 or >= block_size: the whole block). One launch.
struct CopyBlocksParams {
  char* src = nullptr;         // pool 0 of the source (device or mapped host memory)
  char* dst = nullptr;         // pool 0 of the destination
  int64_t src_pool_bytes = 0;  // bytes between consecutive source pools
  int64_t dst_pool_bytes = 0;
  int32_t num_pools = 0;
  const int32_t* ops = nullptr;  // device, [num_ops][3]: src block, dst block, num_tokens
  int32_t num_ops = 0;
  int32_t block_size = 0;
  int64_t block_bytes = 0;    // bytes of one block in one pool (a multiple of 16)
  int32_t segments = 1;       // contiguous token runs per block: num_kv_heads (HND), 1 (NHD)
  int64_t segment_bytes = 0;  // bytes between segment starts
  int64_t token_bytes = 0;    // bytes of one token in one segment (a multiple of 16)
  bool exchange = false;      // swap src and dst (whole blocks) instead of copying
};
cudaError_t launch_copy_blocks(const CopyBlocksParams& p, cudaStream_t stream);

}  // namespace pagedkv::internal

#endif  // PAGEDKV_KERNELS_LAUNCH_H_
