// Pieces the CUDA attention kernels share (attention_kernels.cu: GQA decode and extend;
// mla_kernels.cu: MLA decode): the paged byte offsets of a tile's tokens, the XOR swizzle
// of shared-memory tiles, the opt-in to large shared memory, and the split-K combine kernel
// with its launch. No Abseil; device code and launch helpers only. Everything sits in an
// anonymous namespace: each .cu file instantiates its own copies.
#ifndef PAGEDKV_CUDA_ATTENTION_COMMON_H_
#define PAGEDKV_CUDA_ATTENTION_COMMON_H_

#include <cuda_runtime.h>

#include <cassert>
#include <cstdint>

#include "kernels/launch.h"
#include "pagedkv/attention_params.h"
#include "pagedkv/kv_cache_view.h"
#include "pagedkv/merge_state.h"
#include "pagedkv/numeric.h"

namespace pagedkv::internal {
namespace {

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The byte offsets, in a K or V pool, of the tokens of a work item's tiles of kTile tokens,
// written to the shared array `offsets` [stages][kTile] that a tile's cp.async copies read.
// Thread `tid` < kTile owns token `tid` of every tile: it reads that token's block id one
// tile ahead, so the table load of tile i + 1 overlaps the copies of tile i, and writes -1
// for a token at or past the item's end (the copies zero-fill it; its table entry is never
// read). The address is elem_offset() (kv_cache_view.h), the CPU reference's; a
// power-of-two block_size divides by a shift.
// NOTE: block_size_ is a copy and write() indexes the stage itself, so that both kernels
// compile to the PTX of their inline lambdas before this helper (compared with -DNDEBUG).
template <typename KVT, int kTile>
class TileOffsets {
 public:
  // `kv_head`: the KV head whose tokens the CTA copies (MLA: 0, its one latent).
  __device__ __forceinline__ TileOffsets(const AttentionParams& p, int32_t seq, int32_t kv_head,
                                         const WorkItem& w, int tid, int64_t* offsets)
      : kv_(p.kv),
        table_row_(p.table.block_table + int64_t{seq} * p.table.max_blocks),
        kv_head_(kv_head),
        begin_(w.begin),
        end_(w.end),
        tid_(tid),
        block_size_(kv_.block_size),
        offsets_(offsets) {
    pow2_ = (block_size_ & (block_size_ - 1)) == 0;
    shift_ = __ffs(block_size_) - 1;
    next_block_ = tid < kTile ? block_of(w.begin + tid) : -1;
  }

  // Writes the offsets of tile `tile` to stage `stage` of the shared array and reads the
  // block ids of the next tile.
  __device__ __forceinline__ void write(int tile, int stage) {
    if (tid_ >= kTile) return;
    const int32_t t = begin_ + tile * kTile + tid_;
    int64_t off = -1;
    if (t < end_) {
#ifndef NDEBUG
      assert(next_block_ >= 0 && next_block_ < kv_.num_blocks);
#endif
      const int32_t in_block = t - entry_of(t) * block_size_;
      off =
          static_cast<int64_t>(sizeof(KVT)) * elem_offset(kv_, next_block_, kv_head_, in_block, 0);
    }
    offsets_[stage * kTile + tid_] = off;
    next_block_ = block_of(t + kTile);
  }

 private:
  __device__ __forceinline__ int32_t entry_of(int32_t t) const {
    return pow2_ ? t >> shift_ : t / block_size_;
  }
  __device__ __forceinline__ int32_t block_of(int32_t t) const {
    return t < end_ ? table_row_[entry_of(t)] : -1;
  }

  const KvCacheView& kv_;
  const int32_t* table_row_;
  int32_t kv_head_;
  int32_t begin_;  // the work item's tokens: [begin_, end_)
  int32_t end_;
  int tid_;
  int32_t block_size_;
  int64_t* offsets_;
  bool pow2_;
  int shift_;
  int32_t next_block_;  // block id of this thread's token of the next tile written
};

// 16-byte chunk `chunk` of row `row`, XOR-swizzled so that the 8 rows an ldmatrix (or a
// quarter of the scalar loads) touches fall into 8 distinct bank groups. Rows of 128 bytes
// or more must hold a multiple of 8 chunks.
template <int kRowBytes>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  static_assert(kRowBytes == 64 || kRowBytes % 128 == 0, "64-byte rows or whole 128-byte lines");
  if constexpr (kRowBytes >= 128) {
    return chunk ^ (row & 7);
  } else {  // 64-byte rows: two rows share a 128-byte line
    return chunk ^ ((row >> 1) & 3);
  }
}
template <int kRowBytes>
__device__ __forceinline__ char* tile_at(char* base, int row, int byte) {
  return base + row * kRowBytes + swizzle<kRowBytes>(row, byte >> 4) * 16 + (byte & 15);
}

// Opts a kernel into more than 48 KiB of dynamic shared memory. A failure is cleared from
// the runtime's last-error slot so it cannot surface at an unrelated later launch.
template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
  if (err != cudaSuccess) cudaGetLastError();
  return err;
}

// Threads of a combine CTA. Its launch bounds name 8 resident CTAs (64 registers): with the
// thread count alone ptxas capped the windowed variants at 32 registers and spilled.
constexpr int kCombineThreads = 128;
constexpr int kCombineWarps = kCombineThreads / 32;

// Block-wide reduction of one float over kCombineThreads threads (op: max or sum).
template <typename Op>
__device__ __forceinline__ float block_reduce(float x, float* scratch, Op op) {
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, s));
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  __syncthreads();  // scratch may still be read from a previous reduction
  if ((threadIdx.x & 31) == 0) scratch[warp] = x;
  __syncthreads();
  x = scratch[0];
#pragma unroll
  for (int i = 1; i < kCombineWarps; ++i) x = op(x, scratch[i]);
  return x;
}

// Merges the splits of one (sequence, query head) by log-sum-exp, in parallel: the global
// max and the total sum first, then each split's vector of VD values (the output row)
// scaled by 2^(m_z - m), with the threads over (float4 column, split residue) and a
// fixed-order sum of the residues. Sequences that fit one split (decode_live_splits() 1)
// were finished by the attention kernel and are skipped. A sink logit, when given, joins
// the total once, as a state {m = sink, l = 1} with no vector.
template <typename QT, int VD>
__global__ void __launch_bounds__(kCombineThreads, 8)
    combine_splits_kernel(const AttentionParams p) {
  constexpr int kColumns = VD / 4;
  constexpr int kResidues = kCombineThreads / kColumns;
  static_assert(kResidues >= 1 && kCombineThreads % kColumns == 0, "whole float4 columns");
  __shared__ float scratch[kCombineWarps];
  __shared__ float4 partial[kCombineThreads];
  const int32_t seq = static_cast<int32_t>(blockIdx.x);
  const int32_t head = static_cast<int32_t>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x);
  const int32_t n = decode_live_splits(p, p.table.context_lens[seq]);
  if (n <= 1) return;
  const int64_t first = int64_t{seq} * p.num_q_heads + head;
  const int64_t stride = int64_t{p.table.num_seqs} * p.num_q_heads;  // between splits
  const float* ml = p.maybe_partial_ml;
  const float sink = p.maybe_sinks != nullptr ? p.maybe_sinks[head] * kLog2e : -INFINITY;

  float m = -INFINITY;
  for (int32_t zi = tid; zi < n; zi += kCombineThreads) {
    m = fmaxf(m, ml[(first + zi * stride) * 2]);
  }
  m = fmaxf(block_reduce(m, scratch, [](float a, float b) { return fmaxf(a, b); }), sink);
  const float base = m == -INFINITY ? 0.0f : m;
  float l = 0.0f;
  for (int32_t zi = tid; zi < n; zi += kCombineThreads) {
    const int64_t idx = first + zi * stride;
    l += ml[idx * 2 + 1] * exp2f(ml[idx * 2] - base);
  }
  l = block_reduce(l, scratch, [](float a, float b) { return a + b; }) + exp2f(sink - base);

  const int col = tid % kColumns;
  const int residue = tid / kColumns;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int32_t zi = residue; zi < n; zi += kResidues) {
    const int64_t idx = first + zi * stride;
    const float scale = exp2f(ml[idx * 2] - base);
    const float4 v = reinterpret_cast<const float4*>(p.maybe_partial_o + idx * VD)[col];
    acc.x += v.x * scale;
    acc.y += v.y * scale;
    acc.z += v.z * scale;
    acc.w += v.w * scale;
  }
  partial[tid] = acc;
  __syncthreads();
  if (residue != 0) return;
  for (int r = 1; r < kResidues; ++r) {
    const float4 v = partial[r * kColumns + col];
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  const MergeState total{m, l};
  const float inv = inv_sum(total) * (p.maybe_v_scale != nullptr ? *p.maybe_v_scale : 1.0f);
  QT* out = static_cast<QT*>(p.o) + first * VD + 4 * col;
  out[0] = from_float<QT>(acc.x * inv);
  out[1] = from_float<QT>(acc.y * inv);
  out[2] = from_float<QT>(acc.z * inv);
  out[3] = from_float<QT>(acc.w * inv);
  if (p.maybe_lse != nullptr && tid == 0) p.maybe_lse[first] = natural_lse(total);
}

// The combine of a split decode launch (grid num_seqs x num_q_heads); nothing without a
// split.
template <typename QT, int VD>
cudaError_t launch_combine(const AttentionParams& p, cudaStream_t stream) {
  if (p.num_splits <= 1) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.table.num_seqs), static_cast<unsigned>(p.num_q_heads));
  combine_splits_kernel<QT, VD><<<grid, kCombineThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace
}  // namespace pagedkv::internal

#endif  // PAGEDKV_CUDA_ATTENTION_COMMON_H_
