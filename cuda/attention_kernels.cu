// CUDA paged attention: decode (one query token per sequence, split-K with a log-sum-exp
// combine) and extend (causal prefill over the paged cache), one kernel template for both.
//
// Grid: (num_seqs, num_kv_heads, z) CTAs of kAttentionThreads threads; z is the decode
// split or the extend query tile (attention_params.h). A CTA owns `rows` = query tokens x
// group_size query heads of one KV head and walks its token range in tiles of kTile
// tokens. Per tile:
//   1. token offsets through the block table (only tokens < end <= context length, so
//      entries at or beyond ceil(len / block_size) are never read);
//   2. K and V tiles global -> shared with cp.async, once for the whole GQA group;
//   3. scores: 4 lanes per (row, token), fp32, q pre-scaled by sm_scale * k_scale * log2 e;
//   4. online softmax per row (one warp per row, MergeState), probabilities to shared;
//   5. o += p V for each row's valid tokens (loop bound = selection, no multiply by 0).
// Shared memory (dynamic): q [rows][HD] f32 | o [rows][HD] f32 | p [rows][kTile] f32 |
// state [rows] | alpha [rows] | offsets [kTile] i64 | K, V [kTile][row stride] KVT.
// A K/V row is padded so its stride is 4 (mod 8) 16-byte chunks: the 8 lanes of a
// quarter-warp (two quads on consecutive tokens) then hit 8 distinct bank groups.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/dispatch.h"
#include "launch.h"
#include "pagedkv/merge_state.h"
#include "pagedkv/numeric.h"

namespace pagedkv::internal {
namespace {

constexpr int kThreads = kAttentionThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kLanesPerScore = 4;

__host__ __device__ constexpr int clamp_int(int x, int lo, int hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

template <typename KVT, int HD>
struct Tile {
  static constexpr int kRowBytes = HD * static_cast<int>(sizeof(KVT));
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks per K/V row
  static constexpr int kElemsPerChunk = 16 / static_cast<int>(sizeof(KVT));
  static constexpr int kStrideChunks = kChunks == 4 ? 4 : kChunks + 4;  // 4 (mod 8)
  static constexpr int kTokens = clamp_int(8192 / kRowBytes, 16, 64);
  static_assert(kChunks % kLanesPerScore == 0, "a K row splits over 4 lanes");
  static_assert(kStrideChunks % 8 == 4, "bank-conflict-free row stride");
};

struct SmemLayout {
  size_t q, o, p, state, alpha, offsets, k, v, total;
};

template <typename KVT, int HD>
__host__ __device__ SmemLayout smem_layout(int rows) {
  using T = Tile<KVT, HD>;
  SmemLayout s{};
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t start = at;
    at = (at + bytes + 15) / 16 * 16;
    return start;
  };
  s.q = take(sizeof(float) * rows * HD);
  s.o = take(sizeof(float) * rows * HD);
  s.p = take(sizeof(float) * rows * T::kTokens);
  s.state = take(sizeof(MergeState) * rows);
  s.alpha = take(sizeof(float) * rows);
  s.offsets = take(sizeof(int64_t) * T::kTokens);
  s.k = take(size_t{16} * T::kStrideChunks * T::kTokens);
  s.v = take(size_t{16} * T::kStrideChunks * T::kTokens);
  s.total = at;
  return s;
}

template <typename KVT>
__device__ __forceinline__ void load_pair(const char* at, float& a, float& b) {
  if constexpr (sizeof(KVT) == 4) {
    const float2 x = *reinterpret_cast<const float2*>(at);
    a = x.x;
    b = x.y;
  } else if constexpr (sizeof(KVT) == 2) {
    const uint32_t x = *reinterpret_cast<const uint32_t*>(at);
    a = to_float(KVT{static_cast<uint16_t>(x & 0xffffu)});
    b = to_float(KVT{static_cast<uint16_t>(x >> 16)});
  } else {
    const uint16_t x = *reinterpret_cast<const uint16_t*>(at);
    a = to_float(KVT{static_cast<uint8_t>(x & 0xffu)});
    b = to_float(KVT{static_cast<uint8_t>(x >> 8)});
  }
}

template <typename QT, typename KVT, int HD>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(const AttentionParams p) {
  using T = Tile<KVT, HD>;
  extern __shared__ __align__(16) char smem[];
  const int32_t seq = static_cast<int32_t>(blockIdx.x);
  const int32_t kvh = static_cast<int32_t>(blockIdx.y);
  const int32_t z = static_cast<int32_t>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;

  const WorkItem w = describe_work(p, seq, z);
  if (w.num_q <= 0) return;  // extend tile past this sequence's new tokens
  const int group = p.group_size;
  const int rows = w.num_q * group;
  const bool split = p.maybe_qo_indptr == nullptr && p.num_splits > 1;
  const SmemLayout lay = smem_layout<KVT, HD>(p.q_tile * group);
  float* q_s = reinterpret_cast<float*>(smem + lay.q);
  float* o_s = reinterpret_cast<float*>(smem + lay.o);
  float* p_s = reinterpret_cast<float*>(smem + lay.p);
  MergeState* st_s = reinterpret_cast<MergeState*>(smem + lay.state);
  float* alpha_s = reinterpret_cast<float*>(smem + lay.alpha);
  int64_t* off_s = reinterpret_cast<int64_t*>(smem + lay.offsets);
  uint4* k_s = reinterpret_cast<uint4*>(smem + lay.k);
  uint4* v_s = reinterpret_cast<uint4*>(smem + lay.v);

  const float k_scale = p.maybe_k_scale != nullptr ? *p.maybe_k_scale : 1.0f;
  const float v_scale = p.maybe_v_scale != nullptr ? *p.maybe_v_scale : 1.0f;
  const float q_scale = p.score_scale * k_scale;
  const QT* q = static_cast<const QT*>(p.q);
  for (int i = tid; i < rows * HD; i += kThreads) {
    const int r = i / HD;
    const int d = i - r * HD;
    const int64_t q_row = w.q_first + r / group;
    const int head = kvh * group + r % group;
    q_s[i] = to_float(q[(q_row * p.num_q_heads + head) * HD + d]) * q_scale;
    o_s[i] = 0.0f;
  }
  for (int r = tid; r < rows; r += kThreads) {
    st_s[r] = MergeState{};
    alpha_s[r] = 1.0f;
  }
  const int32_t* table_row = p.table.block_table + int64_t{seq} * p.table.max_blocks;
  const char* k_pool = static_cast<const char*>(p.kv.k);
  const char* v_pool = static_cast<const char*>(p.kv.v);
  __syncthreads();

  for (int32_t t0 = w.begin; t0 < w.end; t0 += T::kTokens) {
    const int n = min(T::kTokens, w.end - t0);
    // 1. Offsets of this tile's tokens (all < end <= len).
    if (tid < n) off_s[tid] = token_offset(p.kv, table_row, t0 + tid, kvh) * sizeof(KVT);
    __syncthreads();
    // 2. K and V tiles into shared memory.
    const int tile_chunks = n * T::kChunks;
    for (int i = tid; i < 2 * tile_chunks; i += kThreads) {
      const bool is_v = i >= tile_chunks;
      const int rem = is_v ? i - tile_chunks : i;
      const int j = rem / T::kChunks;
      const int c = rem - j * T::kChunks;
      const char* src = (is_v ? v_pool : k_pool) + off_s[j] + 16 * c;
      uint4* dst = (is_v ? v_s : k_s) + j * T::kStrideChunks + c;
      __pipeline_memcpy_async(dst, src, 16);
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    // 3. Scores, 4 lanes per (row, token); whole warps iterate so the shuffles are uniform.
    const int items = rows * n * kLanesPerScore;
    const int items_padded = (items + 31) / 32 * 32;
    for (int it = tid; it < items_padded; it += kThreads) {
      const bool active = it < items;
      const int quad = active ? it / kLanesPerScore : 0;
      const int part = it & (kLanesPerScore - 1);
      const int r = quad / n;
      const int j = quad - r * n;
      float partial = 0.0f;
      if (active) {
        const uint4* krow = k_s + j * T::kStrideChunks;
        const float* qr = q_s + r * HD;
#pragma unroll
        for (int c0 = 0; c0 < T::kChunks; c0 += kLanesPerScore) {
          const int c = c0 + part;
          union {
            uint4 raw;
            KVT e[T::kElemsPerChunk];
          } u;
          u.raw = krow[c];
          const float* qc = qr + c * T::kElemsPerChunk;
#pragma unroll
          for (int e = 0; e < T::kElemsPerChunk; ++e) partial += qc[e] * to_float(u.e[e]);
        }
      }
      partial += __shfl_xor_sync(0xffffffffu, partial, 1);
      partial += __shfl_xor_sync(0xffffffffu, partial, 2);
      if (active && part == 0) p_s[r * T::kTokens + j] = partial;
    }
    __syncthreads();
    // 4. Online softmax, one warp per row. Only the row's valid (causal) tokens are read.
    for (int r = warp; r < rows; r += kWarps) {
      const int valid = clamp_int(w.causal_base + r / group + 1 - t0, 0, n);
      float* pr = p_s + r * T::kTokens;
      float tile_max = -INFINITY;
      for (int j = lane; j < valid; j += 32) tile_max = fmaxf(tile_max, pr[j]);
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) {
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, s));
      }
      MergeState st = st_s[r];
      const float alpha = raise_max(st, tile_max);
      float sum = 0.0f;
      for (int j = lane; j < valid; j += 32) {
        const float e = exp2f(pr[j] - st.m);
        pr[j] = e;
        sum += e;
      }
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
      __syncwarp();
      if (lane == 0) {
        st.l += sum;
        st_s[r] = st;
        alpha_s[r] = alpha;
      }
    }
    __syncthreads();
    // 5. o = o * alpha + sum_j p_j v_j over the row's valid tokens; two dims per item.
    for (int it = tid; it < rows * (HD / 2); it += kThreads) {
      const int r = it / (HD / 2);
      const int d = 2 * (it - r * (HD / 2));
      const int valid = clamp_int(w.causal_base + r / group + 1 - t0, 0, n);
      const float alpha = alpha_s[r];
      float acc0 = o_s[r * HD + d] * alpha;
      float acc1 = o_s[r * HD + d + 1] * alpha;
      const float* pr = p_s + r * T::kTokens;
      const char* vcol = reinterpret_cast<const char*>(v_s) + d * sizeof(KVT);
#pragma unroll 4
      for (int j = 0; j < valid; ++j) {
        float v0, v1;
        load_pair<KVT>(vcol + j * (16 * T::kStrideChunks), v0, v1);
        acc0 += pr[j] * v0;
        acc1 += pr[j] * v1;
      }
      o_s[r * HD + d] = acc0;
      o_s[r * HD + d + 1] = acc1;
    }
    __syncthreads();
  }

  if (split) {  // fp32 partials; empty splits write the empty state
    const int64_t base = (int64_t{z} * p.table.num_seqs + seq) * p.num_q_heads;
    for (int i = tid; i < rows * HD; i += kThreads) {
      const int r = i / HD;
      const int d = i - r * HD;
      p.maybe_partial_o[(base + kvh * group + r) * HD + d] = o_s[i];
    }
    for (int r = tid; r < rows; r += kThreads) {
      p.maybe_partial_ml[(base + kvh * group + r) * 2] = st_s[r].m;
      p.maybe_partial_ml[(base + kvh * group + r) * 2 + 1] = st_s[r].l;
    }
    return;
  }
  QT* out = static_cast<QT*>(p.o);
  for (int i = tid; i < rows * HD; i += kThreads) {
    const int r = i / HD;
    const int d = i - r * HD;
    const int64_t q_row = w.q_first + r / group;
    const int head = kvh * group + r % group;
    out[(q_row * p.num_q_heads + head) * HD + d] =
        from_float<QT>(o_s[i] * (inv_sum(st_s[r]) * v_scale));
  }
  if (p.maybe_lse != nullptr) {
    for (int r = tid; r < rows; r += kThreads) {
      const int64_t q_row = w.q_first + r / group;
      p.maybe_lse[q_row * p.num_q_heads + kvh * group + r % group] = natural_lse(st_s[r]);
    }
  }
}

// Merges the num_splits partials of one (sequence, query head) in split order.
// Grid (num_seqs, num_q_heads), 64 threads, HD / 64 dims per thread.
template <typename QT, int HD>
__global__ void __launch_bounds__(64) combine_splits_kernel(const AttentionParams p) {
  const int32_t seq = static_cast<int32_t>(blockIdx.x);
  const int32_t head = static_cast<int32_t>(blockIdx.y);
  constexpr int kPer = HD / 64;
  const float v_scale = p.maybe_v_scale != nullptr ? *p.maybe_v_scale : 1.0f;
  MergeState total;
  float o[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) o[e] = 0.0f;
  for (int32_t z = 0; z < p.num_splits; ++z) {
    const int64_t idx = (int64_t{z} * p.table.num_seqs + seq) * p.num_q_heads + head;
    const MergeState part{p.maybe_partial_ml[idx * 2], p.maybe_partial_ml[idx * 2 + 1]};
    const MergeScales s = merge_into(total, part);
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const float po = p.maybe_partial_o[idx * HD + threadIdx.x + 64 * e];
      o[e] = o[e] * s.self + po * s.other;
    }
  }
  const float inv = inv_sum(total) * v_scale;
  QT* out = static_cast<QT*>(p.o) + (int64_t{seq} * p.num_q_heads + head) * HD;
#pragma unroll
  for (int e = 0; e < kPer; ++e) out[threadIdx.x + 64 * e] = from_float<QT>(o[e] * inv);
  if (p.maybe_lse != nullptr && threadIdx.x == 0) {
    p.maybe_lse[int64_t{seq} * p.num_q_heads + head] = natural_lse(total);
  }
}

template <typename QT, typename KVT, int HD>
cudaError_t launch_typed(const AttentionParams& p, cudaStream_t stream) {
  const int rows = p.q_tile * p.group_size;
  const size_t smem = smem_layout<KVT, HD>(rows).total;
  auto kernel = paged_attention_kernel<QT, KVT, HD>;
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const int32_t num_z = p.maybe_qo_indptr == nullptr ? p.num_splits : p.num_q_tiles;
  const dim3 grid(static_cast<unsigned>(p.table.num_seqs), static_cast<unsigned>(p.kv.num_kv_heads),
                  static_cast<unsigned>(num_z));
  kernel<<<grid, kThreads, smem, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (p.maybe_qo_indptr == nullptr && p.num_splits > 1) {
    const dim3 combine_grid(static_cast<unsigned>(p.table.num_seqs),
                            static_cast<unsigned>(p.num_q_heads));
    combine_splits_kernel<QT, HD><<<combine_grid, 64, 0, stream>>>(p);
    err = cudaGetLastError();
  }
  return err;
}

}  // namespace

size_t attention_smem_bytes(DType q_dtype, DType kv_dtype, int32_t head_dim, int32_t rows) {
  size_t bytes = 0;
  dispatch_attention(q_dtype, kv_dtype, head_dim, [&](auto, auto kv_tag, auto hd) {
    bytes = smem_layout<typename decltype(kv_tag)::type, decltype(hd)::value>(rows).total;
  });
  return bytes;
}

cudaError_t attention_ctas_per_sm(DType q_dtype, DType kv_dtype, int32_t head_dim, int32_t rows,
                                  int* ctas_per_sm) {
  cudaError_t err = cudaErrorInvalidValue;
  *ctas_per_sm = 0;
  dispatch_attention(q_dtype, kv_dtype, head_dim, [&](auto q_tag, auto kv_tag, auto hd) {
    using QT = typename decltype(q_tag)::type;
    using KVT = typename decltype(kv_tag)::type;
    constexpr int HD = decltype(hd)::value;
    const size_t smem = smem_layout<KVT, HD>(rows).total;
    auto kernel = paged_attention_kernel<QT, KVT, HD>;
    err = cudaSuccess;
    if (smem > 48 * 1024) {
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(smem));
    }
    if (err == cudaSuccess) {
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, kernel, kThreads, smem);
    }
  });
  return err;
}

cudaError_t launch_paged_attention(const AttentionParams& p, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  if (p.table.num_seqs == 0) return cudaSuccess;
  dispatch_attention(p.q_dtype, p.kv.dtype, p.kv.head_dim, [&](auto q_tag, auto kv_tag, auto hd) {
    err = launch_typed<typename decltype(q_tag)::type, typename decltype(kv_tag)::type,
                       decltype(hd)::value>(p, stream);
  });
  return err;
}

}  // namespace pagedkv::internal
