// CUDA cache kernels: write_kv (scatter new tokens' K/V into their slots) and batched block
// copies (copy-on-write within a pool, swaps between the device pool and a mapped pinned
// host pool), one launch each.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dispatch.h"
#include "kernels/launch.h"
#include "pagedkv/kv_cache_view.h"
#include "pagedkv/numeric.h"

namespace pagedkv::internal {
namespace {

// One CTA per token, threads over (kv head, dim). A null v writes K only (MLA latents).
template <typename Src, typename Dst>
__global__ void __launch_bounds__(256) write_kv_kernel(const WriteKvParams p) {
  const int32_t i = static_cast<int32_t>(blockIdx.x);
  const int64_t slot = p.slot_mapping[i];
  const KvCacheView& kv = p.kv;
  if (slot < 0 || slot >= int64_t{kv.num_blocks} * kv.block_size) return;
  constexpr bool kFp8 = sizeof(Dst) == 1;
  const float k_inv = kFp8 && p.maybe_k_scale != nullptr ? 1.0f / *p.maybe_k_scale : 1.0f;
  const float v_inv = kFp8 && p.maybe_v_scale != nullptr ? 1.0f / *p.maybe_v_scale : 1.0f;
  const Src* k = static_cast<const Src*>(p.k);
  const Src* v = static_cast<const Src*>(p.v);
  Dst* k_pool = static_cast<Dst*>(kv.k);
  Dst* v_pool = static_cast<Dst*>(kv.v);
  const int32_t per_token = kv.num_kv_heads * kv.head_dim;
  // K, then V unless it is null (MLA latents: K only).
  for (int pass = 0; pass < 2; ++pass) {
    const Src* src_rows = pass == 0 ? k : v;
    Dst* pool = pass == 0 ? k_pool : v_pool;
    const float inv = pass == 0 ? k_inv : v_inv;
    if (src_rows == nullptr) return;
    for (int32_t e = static_cast<int32_t>(threadIdx.x); e < per_token;
         e += static_cast<int32_t>(blockDim.x)) {
      const int32_t h = e / kv.head_dim;
      const int32_t d = e - h * kv.head_dim;
      pool[slot_offset(kv, slot, h) + d] =
          from_float<Dst>(to_float(src_rows[int64_t{i} * per_token + e]) * inv);
    }
  }
}

// Grid (num_ops, num_pools); 16-byte copies, or swaps for an exchange.
__global__ void __launch_bounds__(256) copy_blocks_kernel(const CopyBlocksParams p) {
  const int32_t op = static_cast<int32_t>(blockIdx.x);
  const int32_t pool = static_cast<int32_t>(blockIdx.y);
  const int32_t src_block = p.ops[3 * op];
  const int32_t dst_block = p.ops[3 * op + 1];
  const int32_t num_tokens = p.ops[3 * op + 2];
  char* src = p.src + pool * p.src_pool_bytes + src_block * p.block_bytes;
  char* dst = p.dst + pool * p.dst_pool_bytes + dst_block * p.block_bytes;
  if (p.exchange) {  // whole blocks; each element is read by the thread that writes it
    uint4* a = reinterpret_cast<uint4*>(src);
    uint4* b = reinterpret_cast<uint4*>(dst);
    for (int64_t i = threadIdx.x; i < p.block_bytes / 16; i += blockDim.x) {
      const uint4 x = a[i];
      a[i] = b[i];
      b[i] = x;
    }
    return;
  }
  const bool whole = num_tokens <= 0 || num_tokens >= p.block_size;
  const int32_t segments = whole ? 1 : p.segments;
  const int64_t run = whole ? p.block_bytes / 16 : num_tokens * p.token_bytes / 16;
  for (int32_t s = 0; s < segments; ++s) {
    const uint4* from = reinterpret_cast<const uint4*>(src + s * p.segment_bytes);
    uint4* to = reinterpret_cast<uint4*>(dst + s * p.segment_bytes);
    for (int64_t i = threadIdx.x; i < run; i += blockDim.x) to[i] = from[i];
  }
}

}  // namespace

cudaError_t launch_write_kv(const WriteKvParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  bool ok = dispatch_write_kv(p.src_dtype, p.kv.dtype, [&](auto src_tag, auto dst_tag) {
    write_kv_kernel<typename decltype(src_tag)::type, typename decltype(dst_tag)::type>
        <<<static_cast<unsigned>(p.num_tokens), 256, 0, stream>>>(p);
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t launch_copy_blocks(const CopyBlocksParams& p, cudaStream_t stream) {
  if (p.num_ops == 0 || p.num_pools == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.num_ops), static_cast<unsigned>(p.num_pools));
  copy_blocks_kernel<<<grid, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace pagedkv::internal
