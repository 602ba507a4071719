// CUDA paged MLA decode (DeepSeek-V2/V3) on tensor cores: one latent vector of 576
// elements per token (kv_lora_rank 512 + rope 64), absorbed queries of 576, scores over all
// 576, outputs the probability-weighted first 512, per head. Split-K over long contexts
// with the decode plan and the log-sum-exp combine the GQA kernel uses.
//
// All heads of a sequence share every latent row, so the heads are the MMA's M dimension:
// a CTA takes kRows = 16 x RT heads (RT = 1, 2 or 4 row tiles: 16, 32 or 64 heads; more
// heads take several CTAs, "row chunks"; a head count that is not a multiple of 16 is
// padded with zero rows) of one (sequence, split) and loads each 32-token latent tile once
// for all of them.
//
// Warps: RT row tiles x 2 column halves. The output of one head row is 512 fp32 values,
// too many for one warp's registers beside the scores, so warp (rt, c) owns the output
// columns [256 c, 256 c + 256) of row tile rt (128 accumulator registers per thread) and
// the scores of the tile's tokens [16 c, 16 c + 16):
//   S = Q K^T over the 576 dims for its 16 tokens (mma m16n8k16, fp32 accumulate);
//   the two halves exchange their row maxima through shared memory, so both rescale by
//   the same running max; each writes its P (16-bit) to shared memory;
//   O += P V over all 32 tokens of the tile, V = the first 512 dims of the same latent
//   rows (ldmatrix.trans from the tile already in shared memory).
// Each half sums its own tokens' probabilities; the row sums are added at the end.
//
// Pipeline: latent tiles travel through a 2-stage cp.async pipeline, byte offsets computed
// one tile ahead from the block table (any block size); tokens at or beyond the item's end
// are zero-filled (nothing read) and their scores selected to -inf. fp8 e4m3 tiles are
// converted once per tile into a 16-bit tile (each element once per CTA), so the MMAs read
// the same operands as for a 16-bit cache; the fp8 stage is refilled right after.
// Operand type: fp16 for fp16 q, bf16 for bf16 q (fp32 q is refused by the host wrapper).
//
// Shared memory (RT = 4, bf16): Q 72 KiB + 2 stages of 36 KiB + P 4 KiB + exchange and
// offsets 1 KiB = 149 KiB, within an A100's 163 KiB (one CTA per SM); fp8 halves the
// stages and adds a 36 KiB 16-bit tile: the same total.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <cassert>
#include <cstdint>
#include <type_traits>

#include "attention_common.h"
#include "kernels/dispatch.h"
#include "kernels/launch.h"
#include "mma.h"
#include "pagedkv/merge_state.h"
#include "pagedkv/numeric.h"

namespace pagedkv::internal {
namespace {

constexpr int kMlaDim = 576;   // elements of a latent (and of an absorbed query)
constexpr int kMlaVDim = 512;  // value / output elements: the first kv_lora_rank
constexpr int kMlaTile = 32;   // tokens per pipeline stage
constexpr int kMlaStages = 2;
constexpr int kMaxRowTiles = 4;  // 64 heads per CTA

template <typename QT, typename KVT, int RT>
struct MlaConfig {
  static constexpr bool kHalf = std::is_same_v<QT, Half>;  // else bf16 operands
  static constexpr bool kFp8 = sizeof(KVT) == 1;
  static constexpr int kRowTiles = RT;
  static constexpr int kRows = 16 * RT;  // heads per CTA
  static constexpr int kWarps = 2 * RT;  // row tiles x column halves
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowBytes = kMlaDim * 2;  // a 16-bit row in shared memory: 72 chunks
  static constexpr int kStageRowBytes = kMlaDim * static_cast<int>(sizeof(KVT));
  static constexpr int kStageBytes = kMlaTile * kStageRowBytes;
  static constexpr int kTileBytes = kMlaTile * kRowBytes;
  static constexpr int kKSteps = kMlaDim / 16;      // 16-dim k steps of Q K^T
  static constexpr int kHalfTokens = kMlaTile / 2;  // score tokens per warp
  static constexpr int kNTiles = kMlaVDim / 2 / 8;  // 8-column n tiles per warp: 32
  static constexpr int kPRowBytes = kMlaTile * 2;   // one row of P: 64 bytes
  static_assert(kRowBytes % 128 == 0 && kStageRowBytes % 16 == 0, "whole 16-byte chunks");
  static_assert(kHalfTokens == 16, "a warp's scores are two 8-token n tiles");
};

struct MlaSmem {
  size_t q, stages, tile16, p, exchange, offsets, total;
};

template <typename C>
__host__ __device__ constexpr MlaSmem mla_smem_layout() {
  MlaSmem s{};
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t start = at;
    at = (at + bytes + 127) / 128 * 128;
    return start;
  };
  s.q = take(size_t{C::kRows} * C::kRowBytes);
  s.stages = take(size_t{kMlaStages} * C::kStageBytes);
  s.tile16 = C::kFp8 ? take(C::kTileBytes) : s.stages;  // fp8: the converted tile
  s.p = take(size_t{C::kRows} * C::kPRowBytes);
  s.exchange = take(sizeof(float) * 2 * C::kRows);  // [column half][row]
  s.offsets = take(sizeof(int64_t) * kMlaStages * kMlaTile);
  s.total = at;
  return s;
}

// Shared-memory addresses of a warp's ldmatrix rows, hoisted out of the tile loop. In a
// swizzled row of 16-byte chunks, chunk 8 i + j of row r sits at chunk 8 i + (j ^ (r & 7)):
// the XOR touches the low three bits only, so each lane needs four base addresses (one
// per j / 2) and every other chunk pair is a constant 128-byte step, which the compiler
// folds into the instruction instead of keeping dozens of addresses alive.
struct MlaLanes {
  uint32_t q[4];  // Q A fragments: q[ks % 4] + 128 (ks / 4)
  uint32_t k[4];  // K^T B fragments, from a tile's start: k[ks % 4] + 128 (ks / 4)
  uint32_t v[4];  // V B fragments, from a tile's start: v[np % 4] + 128 (np / 4) + rows
  uint32_t p[2];  // P A fragments: p[kk]
};

template <typename C>
__device__ __forceinline__ MlaLanes mla_lanes(uint32_t q_base, uint32_t p_base, int rt, int half,
                                              int lane) {
  const int m = lane >> 3;
  const int x = lane & 7;  // row & 7 of every row a lane addresses
  MlaLanes a;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    // Q: rows 16 rt + 8 (m & 1) + x, chunk 2 ks + (m >> 1) (A: rows, then k).
    a.q[j] = q_base + (16 * rt + 8 * (m & 1) + x) * C::kRowBytes + 16 * ((2 * j + (m >> 1)) ^ x);
    // K^T: token rows tok0 + 8 (m >> 1) + x, chunk 2 ks + (m & 1) (B: n tiles of tokens).
    a.k[j] =
        (C::kHalfTokens * half + 8 * (m >> 1) + x) * C::kRowBytes + 16 * ((2 * j + (m & 1)) ^ x);
    // V: token rows 8 (m & 1) + x, chunk col0 / 8 + 2 np + (m >> 1) (transposed).
    a.v[j] = (8 * (m & 1) + x) * C::kRowBytes + 16 * (32 * half + ((2 * j + (m >> 1)) ^ x));
  }
  // P: 64-byte rows swizzled by (row >> 1) & 3, chunk 2 kk + (m >> 1).
  const int p_row = 16 * rt + 8 * (m & 1) + x;
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    a.p[kk] = p_base + p_row * C::kPRowBytes + 16 * ((2 * kk + (m >> 1)) ^ ((p_row >> 1) & 3));
  }
  return a;
}

template <typename QT, typename KVT, int RT>
__global__ void __launch_bounds__(MlaConfig<QT, KVT, RT>::kThreads, 1)
    mla_decode_kernel(const AttentionParams p) {
  using C = MlaConfig<QT, KVT, RT>;
  constexpr MlaSmem lay = mla_smem_layout<C>();
  extern __shared__ __align__(128) char smem[];
  const int32_t seq = static_cast<int32_t>(blockIdx.x);
  const int32_t row_chunk = static_cast<int32_t>(blockIdx.y);
  const int32_t z = static_cast<int32_t>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int rt = warp % RT;    // row tile
  const int half = warp / RT;  // column half of the output, token half of the scores
  const int g = lane >> 2;
  const int quad = lane & 3;

  const WorkItem w = describe_work(p, seq, z);
  const int32_t row0 = row_chunk * C::kRows;  // first head of this CTA
  const int32_t rows = min(C::kRows, p.num_q_heads - row0);
  const int32_t len = p.table.context_lens[seq];
  const int32_t live = decode_live_splits(p, len);
  const bool split = live > 1;
  if (rows <= 0 || (z > 0 && z >= live)) return;
#ifndef NDEBUG
  if (tid == 0)
    assert(len >= 0 && int64_t{len} <= int64_t{p.table.max_blocks} * p.table.block_size);
#endif

  char* q_s = smem + lay.q;
  char* stage_s = smem + lay.stages;
  char* tile16_s = smem + lay.tile16;
  char* p_s = smem + lay.p;
  float* exchange = reinterpret_cast<float*>(smem + lay.exchange);
  int64_t* off_s = reinterpret_cast<int64_t*>(smem + lay.offsets);
  const KvCacheView& kv = p.kv;
  const float kv_scale = p.maybe_k_scale != nullptr ? *p.maybe_k_scale : 1.0f;
  const float score_scale = p.score_scale * kv_scale;

  // Q rows of this CTA (16-bit, the operand type already); rows past `rows` are zeros.
  {
    constexpr int kChunks = C::kRowBytes / 16;
    const char* q = static_cast<const char*>(p.q);
    for (int i = tid; i < C::kRows * kChunks; i += C::kThreads) {
      const int r = i / kChunks;
      const int c = i - r * kChunks;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows) {
        const int64_t head = int64_t{seq} * p.num_q_heads + row0 + r;
        v = *reinterpret_cast<const uint4*>(q + head * C::kRowBytes + 16 * c);
      }
      *reinterpret_cast<uint4*>(tile_at<C::kRowBytes>(q_s, r, 16 * c)) = v;
    }
  }

  TileOffsets<KVT, kMlaTile> offsets(p, seq, /*kv_head=*/0, w, tid, off_s);
  // 16-bit stages are swizzled for ldmatrix; fp8 stages are plain rows, converted below.
  auto issue = [&](int stage) {
    constexpr int kChunks = C::kStageRowBytes / 16;
    const char* pool = static_cast<const char*>(kv.k);
    char* dst = stage_s + stage * C::kStageBytes;
    for (int i = tid; i < kMlaTile * kChunks; i += C::kThreads) {
      const int j = i / kChunks;
      const int c = i - j * kChunks;
      const int64_t off = off_s[stage * kMlaTile + j];
      char* to =
          C::kFp8 ? dst + j * C::kStageRowBytes + 16 * c : tile_at<C::kRowBytes>(dst, j, 16 * c);
      cp_async_16(to, pool + (off < 0 ? 0 : off) + 16 * c, off >= 0);
    }
  };
  // fp8 stage -> the 16-bit tile, each element once, two values per conversion.
  auto convert = [&](int stage) {
    constexpr int kChunks = C::kStageRowBytes / 16;  // 16 fp8 values -> two 16-byte chunks
    const char* src = stage_s + stage * C::kStageBytes;
    for (int i = tid; i < kMlaTile * kChunks; i += C::kThreads) {
      const int j = i / kChunks;
      const int c = i - j * kChunks;
      const uint4 bytes = *reinterpret_cast<const uint4*>(src + j * C::kStageRowBytes + 16 * c);
      const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
      uint32_t out[8];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        out[2 * k] = fp8x2_to_operand<C::kHalf>(static_cast<uint16_t>(words[k] & 0xffffu));
        out[2 * k + 1] = fp8x2_to_operand<C::kHalf>(static_cast<uint16_t>(words[k] >> 16));
      }
      *reinterpret_cast<uint4*>(tile_at<C::kRowBytes>(tile16_s, j, 32 * c)) =
          make_uint4(out[0], out[1], out[2], out[3]);
      *reinterpret_cast<uint4*>(tile_at<C::kRowBytes>(tile16_s, j, 32 * c + 16)) =
          make_uint4(out[4], out[5], out[6], out[7]);
    }
  };

  const int num_tiles = w.end > w.begin ? ceil_div(w.end - w.begin, kMlaTile) : 0;
#pragma unroll
  for (int s = 0; s < kMlaStages; ++s) {
    if (s < num_tiles) offsets.write(s, s);
  }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kMlaStages; ++s) {
    if (s < num_tiles) issue(s);
    cp_async_commit();
  }

  // Softmax state of the lane's two rows (g and g + 8 of the row tile); l is the lane's
  // share of the sum over this warp's tokens until the end.
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  const bool active = 16 * rt < rows;  // warps of all-padding row tiles only load
  float o[C::kNTiles][4] = {};
  const int tok0 = C::kHalfTokens * half;  // this warp's score tokens in a tile
  const int col0 = (kMlaVDim / 2) * half;  // this warp's output columns
  const MlaLanes lanes = mla_lanes<C>(smem_address(q_s), smem_address(p_s), rt, half, lane);

  for (int i = 0; i < num_tiles; ++i) {
    const int stage = i % kMlaStages;
    const int32_t t0 = w.begin + i * kMlaTile;
    const bool refill = i + kMlaStages < num_tiles;
    cp_async_wait<kMlaStages - 1>();  // tile i landed
    __syncthreads();                  // and tile i - 1 is consumed by every warp
    if (refill) offsets.write(i + kMlaStages, stage);
    uint32_t tile = smem_address(stage_s) + stage * C::kStageBytes;
    if constexpr (C::kFp8) {
      convert(stage);
      __syncthreads();  // the 16-bit tile is complete; the fp8 stage is free
      if (refill) issue(stage);
      cp_async_commit();
      tile = smem_address(tile16_s);
    }

    // Scores of this warp's 16 tokens, scaled; tokens at or beyond the end selected away.
    float s[2][4] = {};
    float tile_max[2] = {-INFINITY, -INFINITY};
    if (active) {
#pragma unroll
      for (int ks = 0; ks < C::kKSteps; ++ks) {
        uint32_t a[4], r[4];
        ldmatrix_x4(a, lanes.q[ks % 4] + 128 * (ks / 4));
        ldmatrix_x4(r, tile + lanes.k[ks % 4] + 128 * (ks / 4));
        // The four matrices: tokens 0-7 / 8-15 (n tiles) x dims 0-7 / 8-15 (k halves).
        const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
        mma_16816<C::kHalf>(s[0], a, b0);
        mma_16816<C::kHalf>(s[1], a, b1);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int32_t t = t0 + tok0 + nt * 8 + 2 * quad + (e & 1);
          const float x = t < w.end ? s[nt][e] * score_scale : -INFINITY;
          s[nt][e] = x;
          tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        if (quad == 0) exchange[half * C::kRows + 16 * rt + g + 8 * h] = tile_max[h];
      }
    }
    __syncthreads();  // both halves' maxima are visible
    if (active) {
      float base[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float other = exchange[(1 - half) * C::kRows + 16 * rt + g + 8 * h];
        const float m_new = fmaxf(m[h], fmaxf(tile_max[h], other));
        base[h] = m_new == -INFINITY ? 0.0f : m_new;  // all hidden so far: p = 0, no NaN
        const float alpha = exp2f(m[h] - base[h]);
        m[h] = m_new;
        l[h] *= alpha;
#pragma unroll
        for (int nt = 0; nt < C::kNTiles; ++nt) {
          o[nt][2 * h] *= alpha;
          o[nt][2 * h + 1] *= alpha;
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float p0 = exp2f(s[nt][2 * h] - base[h]);
          const float p1 = exp2f(s[nt][2 * h + 1] - base[h]);
          l[h] += p0 + p1;
          *reinterpret_cast<uint32_t*>(tile_at<C::kPRowBytes>(
              p_s, 16 * rt + g + 8 * h, (tok0 + nt * 8 + 2 * quad) * 2)) = pack2<C::kHalf>(p0, p1);
        }
      }
    }
    __syncthreads();  // P of both halves is in shared memory
    if (active) {
#pragma unroll
      for (int kk = 0; kk < kMlaTile / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, lanes.p[kk]);
#pragma unroll
        for (int np = 0; np < C::kNTiles / 2; ++np) {
          uint32_t r[4];
          ldmatrix_x4_trans(r, tile + lanes.v[np % 4] + 128 * (np / 4) + 16 * kk * C::kRowBytes);
          // Tokens 0-7 / 8-15 (k halves) x dims 0-7 / 8-15 (n tiles), transposed.
          const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
          mma_16816<C::kHalf>(o[2 * np], a, b0);
          mma_16816<C::kHalf>(o[2 * np + 1], a, b1);
        }
      }
    }
    if constexpr (!C::kFp8) {
      __syncthreads();  // the stage is consumed
      if (refill) issue(stage);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();

  // Row sums: over the quad, then the two halves through shared memory (the last reads of
  // the exchange came before the loop's last barrier).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (active && quad == 0) exchange[half * C::kRows + 16 * rt + g + 8 * h] = l[h];
  }
  __syncthreads();
  if (!active) return;

    // Outputs: each lane holds columns col0 + 8 nt + 2 quad, +1 of its two rows.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * rt + g + 8 * h;
    if (r >= rows) continue;
    const MergeState st{m[h], l[h] + exchange[(1 - half) * C::kRows + r]};
    const int64_t head = row0 + r;
    if (split) {  // fp32 partials of split z, merged by the combine kernel
      const int64_t idx = (int64_t{z} * p.table.num_seqs + seq) * p.num_q_heads + head;
      float* po = p.maybe_partial_o + idx * kMlaVDim + col0;
#pragma unroll
      for (int nt = 0; nt < C::kNTiles; ++nt) {
        *reinterpret_cast<float2*>(po + nt * 8 + 2 * quad) =
            make_float2(o[nt][2 * h], o[nt][2 * h + 1]);
      }
      if (half == 0 && quad == 0) {
        p.maybe_partial_ml[idx * 2] = st.m;
        p.maybe_partial_ml[idx * 2 + 1] = st.l;
      }
      continue;
    }
    const float inv = inv_sum(st) * kv_scale;
    QT* out = static_cast<QT*>(p.o) + (int64_t{seq} * p.num_q_heads + head) * kMlaVDim + col0;
#pragma unroll
    for (int nt = 0; nt < C::kNTiles; ++nt) {
      out[nt * 8 + 2 * quad] = from_float<QT>(o[nt][2 * h] * inv);
      out[nt * 8 + 2 * quad + 1] = from_float<QT>(o[nt][2 * h + 1] * inv);
    }
    if (p.maybe_lse != nullptr && half == 0 && quad == 0) {
      p.maybe_lse[int64_t{seq} * p.num_q_heads + head] = natural_lse(st);
    }
  }
}

// Row tiles per CTA for `num_heads` heads: as many as the heads fill, at most 4.
int mla_row_tiles(int32_t num_heads) {
  const int tiles = ceil_div(num_heads, 16);
  return tiles <= 1 ? 1 : (tiles == 2 ? 2 : kMaxRowTiles);
}

// Calls f(MlaConfig) for the q / latent dtypes and the heads; false for unsupported dtypes
// (fp32 q).
template <typename F>
bool with_mla_config(DType q_dtype, DType kv_dtype, int32_t num_heads, F&& f) {
  return dispatch_attention_dtypes(q_dtype, kv_dtype, [&](auto q_tag, auto kv_tag) {
    using QT = typename decltype(q_tag)::type;
    using KVT = typename decltype(kv_tag)::type;
    if constexpr (std::is_same_v<QT, float>) {
      return false;
    } else {
      switch (mla_row_tiles(num_heads)) {
        case 1:
          f(MlaConfig<QT, KVT, 1>{});
          break;
        case 2:
          f(MlaConfig<QT, KVT, 2>{});
          break;
        default:
          f(MlaConfig<QT, KVT, kMaxRowTiles>{});
          break;
      }
      return true;
    }
  });
}

template <typename C>
auto mla_kernel_of(C) {
  using QT = std::conditional_t<C::kHalf, Half, BFloat16>;
  using KVT = std::conditional_t<C::kFp8, Fp8E4M3, QT>;
  return mla_decode_kernel<QT, KVT, C::kRowTiles>;
}

}  // namespace

int32_t mla_cta_rows(int32_t num_heads) {
  return num_heads <= 0 ? 0 : 16 * mla_row_tiles(num_heads);
}

size_t mla_smem_bytes(DType q_dtype, DType kv_dtype, int32_t num_heads) {
  size_t bytes = 0;
  with_mla_config(q_dtype, kv_dtype, num_heads,
                  [&](auto config) { bytes = mla_smem_layout<decltype(config)>().total; });
  return bytes;
}

cudaError_t mla_ctas_per_sm(DType q_dtype, DType kv_dtype, int32_t num_heads, int* ctas_per_sm) {
  cudaError_t err = cudaErrorInvalidValue;
  *ctas_per_sm = 0;
  with_mla_config(q_dtype, kv_dtype, num_heads, [&](auto config) {
    using C = decltype(config);
    constexpr size_t smem = mla_smem_layout<C>().total;
    auto kernel = mla_kernel_of(config);
    err = allow_smem(kernel, smem);
    if (err == cudaSuccess) {
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, kernel, C::kThreads, smem);
    }
  });
  return err;
}

cudaError_t launch_mla_decode(const AttentionParams& p, cudaStream_t stream) {
  if (p.table.num_seqs == 0) return cudaSuccess;
  if (p.kv.head_dim != kMlaDim || p.v_dim != kMlaVDim || p.kv.num_kv_heads != 1) {
    return cudaErrorInvalidValue;
  }
  cudaError_t err = cudaErrorInvalidValue;
  const bool served = with_mla_config(p.q_dtype, p.kv.dtype, p.num_q_heads, [&](auto config) {
    using C = decltype(config);
    constexpr size_t smem = mla_smem_layout<C>().total;
    auto kernel = mla_kernel_of(config);
    err = allow_smem(kernel, smem);
    if (err != cudaSuccess) return;
    const int32_t row_chunks = ceil_div(p.num_q_heads, C::kRows);
    const dim3 grid(static_cast<unsigned>(p.table.num_seqs), static_cast<unsigned>(row_chunks),
                    static_cast<unsigned>(p.num_splits));
    kernel<<<grid, C::kThreads, smem, stream>>>(p);
    err = cudaGetLastError();
    if (err != cudaSuccess) return;
    using QT = std::conditional_t<C::kHalf, Half, BFloat16>;
    err = launch_combine<QT, kMlaVDim>(p, stream);
  });
  return served ? err : cudaErrorInvalidValue;
}

}  // namespace pagedkv::internal
