// CUDA paged attention on tensor cores: decode (one query token per sequence, split-K with
// a parallel log-sum-exp combine) and extend (causal prefill over the paged cache), one
// kernel template for both.
//
// Grid: (num_seqs, num_kv_heads x row_chunks, z) CTAs of 4 warps; z is the decode split or
// the extend query tile (attention_params.h). A work item owns `item rows` = query tokens x
// group_size query heads of one KV head; a CTA takes 16 x kWarpsQ of them (a row chunk),
// padded with zero rows to whole 16-row MMA tiles, so the whole GQA group shares every K/V
// byte the CTA loads and costs tensor-core work, not a pass per head.
//
// Warps: kWarpsQ (1 or 4) along the rows x 4 / kWarpsQ along the tokens. Decode with a
// group of at most 16 uses one 16-row tile and 4 warps that each own 16 tokens of every
// 64-token tile; their softmax states merge once at the end. Larger groups and extend use
// 4 row tiles, each warp walking all 64 tokens of its rows.
//
// Per 64-token tile, K and V travel separately through a kStages-deep cp.async pipeline:
//   wait K(i); S = Q K(i)^T (mma m16n8k16, fp32 accumulate); online softmax in registers;
//   refill K with tile i + kStages; wait V(i); O += P V(i); refill V with tile i + kStages.
// A tile's byte offsets are computed once into shared memory from block ids read one tile
// ahead (TileOffsets in attention_common.h, shared with the MLA kernel: elem_offset()'s
// address math, a shift instead of a division when block_size is a power of two); tokens
// at or beyond the item's end are zero-filled by cp.async and their scores selected to
// -inf, so nothing past ceil(len / block_size) table entries is read and garbage there
// never reaches the output. K/V rows are XOR-swizzled in 16-byte chunks so ldmatrix and the
// scalar fragment loads are bank-conflict free.
//
// Windowed layer groups (sliding window, chunked local) run the same template with
// WINDOWED set: a work item starts at its first query's window start (describe_work), so
// nothing before it is read, and each row also selects away the tokens before its own
// window start (extend: a chunk boundary or the window's slide inside the query tile). With
// WINDOWED unset (kFull) that lower bound is compiled out: full attention runs exactly the
// code it ran before windows existed. Sink logits (gpt-oss) join a row's softmax once, where
// its output is written (here, or in the split combine).
//
// Operand types: fp16 q runs fp16 MMAs, bf16 and fp32 q run bf16 MMAs. 16-bit KV is read
// with ldmatrix; fp8 e4m3 KV is converted two values per instruction while the fragment is
// built (each element once per CTA in decode); fp32 values are split into three bf16 terms
// (x = t0 + t1 + t2 to 24 bits) and the products of terms i + j < 3 accumulated, so the
// fp32 path keeps fp32 accuracy on the same tensor-core code.
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

constexpr int kThreads = kAttentionThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 64;   // context tokens per pipeline stage
constexpr int kChunk = 16;  // tokens one warp multiplies at a time (the k of P V)
constexpr int kChunksPerTile = kTile / kChunk;

template <typename QT, typename KVT, int HD, int WARPS_Q>
struct Config {
  static constexpr bool kHalf = std::is_same_v<QT, Half>;  // else bf16 operands
  static constexpr int kQTerms = std::is_same_v<QT, float> ? 3 : 1;
  static constexpr int kKvTerms = std::is_same_v<KVT, float> ? 3 : 1;
  static constexpr int kTerms = kQTerms > kKvTerms ? kQTerms : kKvTerms;  // i + j < kTerms
  static constexpr bool kLdmatrix = sizeof(KVT) == 2;
  static constexpr int kRowBytes = HD * static_cast<int>(sizeof(KVT));
  static constexpr int kTileBytes = kTile * kRowBytes;
  static constexpr int kStages = kTileBytes <= 16384 ? 2 : 1;
  static constexpr int kWarpsQ = WARPS_Q;
  static constexpr int kWarpsKv = kWarps / WARPS_Q;
  static constexpr int kChunksPerWarp = kChunksPerTile / kWarpsKv;
  static constexpr int kCtaRows = 16 * WARPS_Q;
  static constexpr int kNTiles = HD / 8;   // 8-dim n tiles of the output
  static constexpr int kKSteps = HD / 16;  // 16-dim k steps of Q K^T
  static_assert(kRowBytes % 64 == 0, "rows of whole 16-byte chunks, at least 4");
};

// Whether the 64-row shape is compiled for these types: with fp32 terms or head_dim 256 its
// four token chunks of scores per warp would not fit in registers beside the output.
template <typename QT, int HD>
constexpr bool kWideShape = sizeof(QT) == 2 && HD <= 128;

struct SmemLayout {
  size_t q, k, v, offsets, merge, total;
};

template <typename C>
__host__ __device__ constexpr SmemLayout smem_layout() {
  SmemLayout s{};
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t start = at;
    at = (at + bytes + 127) / 128 * 128;
    return start;
  };
  s.q = take(size_t{C::kQTerms} * C::kCtaRows * C::kNTiles * 16);
  s.k = take(size_t{C::kStages} * C::kTileBytes);
  s.v = take(size_t{C::kStages} * C::kTileBytes);
  s.offsets = take(sizeof(int64_t) * C::kStages * kTile);
  // After the loop the K/V stages hold the states of warps 1.. along the tokens.
  s.merge = s.k;
  const size_t merge_bytes =
      sizeof(float) * (C::kWarpsKv - 1) * C::kWarpsQ * 32 * (C::kNTiles * 4 + 4);
  s.total = at > s.merge + merge_bytes ? at : s.merge + merge_bytes;
  return s;
}

// The three bf16 (or fp16) terms of x: x ~ t[0] + t[1] + t[2], each the rounding of what
// the previous terms left. Only t[0] is used for 16-bit and fp8 inputs (exact there).
template <bool kHalf, int N>
__device__ __forceinline__ void split_terms(float x, float (&t)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    t[i] = round_to_operand<kHalf>(x);
    x -= t[i];
  }
}

template <bool kHalf, int N>
__device__ __forceinline__ void pack_terms(float lo, float hi, uint32_t (&out)[N]) {
  float a[N], b[N];
  split_terms<kHalf>(lo, a);
  split_terms<kHalf>(hi, b);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = pack2<kHalf>(a[i], b[i]);
}

// acc += A B over the term products i + j < kTerms.
template <typename C, int NA, int NB>
__device__ __forceinline__ void mma_terms(float (&acc)[4], const uint32_t (&a)[NA][4],
                                          const uint32_t (&b)[NB][2]) {
#pragma unroll
  for (int i = 0; i < NA; ++i) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      if (i + j < C::kTerms) mma_16816<C::kHalf>(acc, a[i], b[j]);
    }
  }
}

// A fragments of Q (16 rows from `row0`, dims 16 ks .. 16 ks + 15), one per term.
template <typename C>
__device__ __forceinline__ void load_q(const char* q_s, int row0, int ks, int lane,
                                       uint32_t (&a)[C::kQTerms][4]) {
  constexpr int kRowBytes = C::kNTiles * 16;  // HD 16-bit values
  const int m = lane >> 3;
  const int row = row0 + (m & 1) * 8 + (lane & 7);
  const int byte = (2 * ks + (m >> 1)) * 16;
#pragma unroll
  for (int t = 0; t < C::kQTerms; ++t) {
    char* base = const_cast<char*>(q_s) + static_cast<size_t>(t) * C::kCtaRows * kRowBytes;
    ldmatrix_x4(a[t], tile_at<kRowBytes>(base, row, byte));
  }
}

// The four matrices of an ldmatrix x4 as the B fragments (term 0) of two n tiles.
template <int kTerms>
__device__ __forceinline__ void two_n_tiles(const uint32_t (&r)[4], uint32_t (&b)[2][kTerms][2]) {
  b[0][0][0] = r[0];
  b[0][0][1] = r[1];
  b[1][0][0] = r[2];
  b[1][0][1] = r[3];
}

// B fragments of K^T for the 16 tokens of chunk `c` (two n tiles of 8 tokens) and dims
// 16 ks .. 16 ks + 15: b[n tile][term].
template <typename C, typename KVT>
__device__ __forceinline__ void load_k(const char* k_s, int c, int ks, int lane,
                                       uint32_t (&b)[2][C::kKvTerms][2]) {
  char* base = const_cast<char*>(k_s);
  if constexpr (C::kLdmatrix) {
    const int m = lane >> 3;
    const int row = c * kChunk + (m >> 1) * 8 + (lane & 7);
    uint32_t r[4];
    ldmatrix_x4(r, tile_at<C::kRowBytes>(base, row, (2 * ks + (m & 1)) * 16));
    two_n_tiles(r, b);
  } else {
    const int g = lane >> 2;
    const int dim = 16 * ks + 2 * (lane & 3);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int row = c * kChunk + nt * 8 + g;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int d = dim + 8 * half;
        if constexpr (sizeof(KVT) == 1) {
          const uint16_t bits =
              *reinterpret_cast<const uint16_t*>(tile_at<C::kRowBytes>(base, row, d));
          b[nt][0][half] = fp8x2_to_operand<C::kHalf>(bits);
        } else {
          const float2 x =
              *reinterpret_cast<const float2*>(tile_at<C::kRowBytes>(base, row, 4 * d));
          uint32_t terms[C::kKvTerms];
          pack_terms<C::kHalf>(x.x, x.y, terms);
#pragma unroll
          for (int t = 0; t < C::kKvTerms; ++t) b[nt][t][half] = terms[t];
        }
      }
    }
  }
}

// B fragments of V for the 16 tokens of chunk `c` and the n tiles 2 np, 2 np + 1 (dims
// 16 np .. 16 np + 15): b[n tile][term].
template <typename C, typename KVT>
__device__ __forceinline__ void load_v(const char* v_s, int c, int np, int lane,
                                       uint32_t (&b)[2][C::kKvTerms][2]) {
  char* base = const_cast<char*>(v_s);
  if constexpr (C::kLdmatrix) {
    const int m = lane >> 3;
    const int row = c * kChunk + (m & 1) * 8 + (lane & 7);
    uint32_t r[4];
    ldmatrix_x4_trans(r, tile_at<C::kRowBytes>(base, row, (2 * np + (m >> 1)) * 16));
    two_n_tiles(r, b);
  } else {
    const int token = c * kChunk + 2 * (lane & 3);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int d = 16 * np + 8 * nt + (lane >> 2);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = token + 8 * half;
        if constexpr (sizeof(KVT) == 1) {
          const uint32_t lo =
              *reinterpret_cast<const uint8_t*>(tile_at<C::kRowBytes>(base, row, d));
          const uint32_t hi =
              *reinterpret_cast<const uint8_t*>(tile_at<C::kRowBytes>(base, row + 1, d));
          b[nt][0][half] = fp8x2_to_operand<C::kHalf>(static_cast<uint16_t>(lo | hi << 8));
        } else {
          const float lo = *reinterpret_cast<const float*>(tile_at<C::kRowBytes>(base, row, 4 * d));
          const float hi =
              *reinterpret_cast<const float*>(tile_at<C::kRowBytes>(base, row + 1, 4 * d));
          uint32_t terms[C::kKvTerms];
          pack_terms<C::kHalf>(lo, hi, terms);
#pragma unroll
          for (int t = 0; t < C::kKvTerms; ++t) b[nt][t][half] = terms[t];
        }
      }
    }
  }
}

struct CtaShape {
  int32_t row_chunks;  // CTAs along one KV head's item rows (grid.y / num_kv_heads)
};

template <typename QT, typename KVT, int HD, int WARPS_Q, bool WINDOWED>
__global__ void __launch_bounds__(kThreads, 2)
    paged_attention_kernel(const AttentionParams p, const CtaShape shape) {
  using C = Config<QT, KVT, HD, WARPS_Q>;
  constexpr SmemLayout lay = smem_layout<C>();
  extern __shared__ __align__(128) char smem[];
  const int32_t seq = static_cast<int32_t>(blockIdx.x);
  const int32_t kvh = static_cast<int32_t>(blockIdx.y) / shape.row_chunks;
  const int32_t row_chunk = static_cast<int32_t>(blockIdx.y) - kvh * shape.row_chunks;
  const int32_t z = static_cast<int32_t>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int wq = (tid >> 5) % C::kWarpsQ;   // row tile of this warp
  const int wkv = (tid >> 5) / C::kWarpsQ;  // token slice of this warp

  const WorkItem w = describe_work(p, seq, z);
  const int32_t group = p.group_size;
  const int32_t row0 = row_chunk * C::kCtaRows;  // first item row of this CTA
  const int32_t rows = min(C::kCtaRows, w.num_q * group - row0);
  if (rows <= 0) return;  // extend tile past this sequence's new tokens
  const bool decode = p.maybe_qo_indptr == nullptr;
  const int32_t len = p.table.context_lens[seq];
  // A sequence whose window fits one split is finished by split 0 alone; splits past its
  // last one exit (those before it write a partial, empty or not, for the combine).
  const int32_t live = decode ? decode_live_splits(p, len) : 1;
  const bool split = live > 1;
  if (decode && z > 0 && z >= live) return;
#ifndef NDEBUG
  if (tid == 0)
    assert(len >= 0 && int64_t{len} <= int64_t{p.table.max_blocks} * p.table.block_size);
#endif

  char* q_s = smem + lay.q;
  char* k_s = smem + lay.k;
  char* v_s = smem + lay.v;
  int64_t* off_s = reinterpret_cast<int64_t*>(smem + lay.offsets);
  const KvCacheView& kv = p.kv;
  const float k_scale = p.maybe_k_scale != nullptr ? *p.maybe_k_scale : 1.0f;
  const float v_scale = p.maybe_v_scale != nullptr ? *p.maybe_v_scale : 1.0f;
  const float score_scale = p.score_scale * k_scale;

  // Q rows of this CTA, split into operand terms; rows past `rows` are zeros.
  {
    const QT* q = static_cast<const QT*>(p.q);
    constexpr int kQRowBytes = C::kNTiles * 16;
    for (int i = tid; i < C::kCtaRows * (HD / 2); i += kThreads) {
      const int r = i / (HD / 2);
      const int d = 2 * (i - r * (HD / 2));
      float x0 = 0.0f, x1 = 0.0f;
      if (r < rows) {
        const int32_t item_row = row0 + r;
        const int64_t q_row = w.q_first + item_row / group;
        const int32_t head = kvh * group + item_row % group;
        const QT* src = q + (q_row * p.num_q_heads + head) * HD + d;
        x0 = to_float(src[0]);
        x1 = to_float(src[1]);
      }
      uint32_t terms[C::kQTerms];
      pack_terms<C::kHalf>(x0, x1, terms);
#pragma unroll
      for (int t = 0; t < C::kQTerms; ++t) {
        char* base = q_s + static_cast<size_t>(t) * C::kCtaRows * kQRowBytes;
        *reinterpret_cast<uint32_t*>(tile_at<kQRowBytes>(base, r, 2 * d)) = terms[t];
      }
    }
  }

  TileOffsets<KVT, kTile> offsets(p, seq, kvh, w, tid, off_s);
  auto issue = [&](char* dst, const void* pool, int stage) {
    constexpr int kRowChunks = C::kRowBytes / 16;
    constexpr int kRowsPerPass = kThreads / kRowChunks;
    const int c = tid % kRowChunks;
    const char* src = static_cast<const char*>(pool) + 16 * c;
    for (int j = tid / kRowChunks; j < kTile; j += kRowsPerPass) {
      const int64_t off = off_s[stage * kTile + j];
      cp_async_16(tile_at<C::kRowBytes>(dst, j, 16 * c), src + (off < 0 ? 0 : off), off >= 0);
    }
  };

  const int num_tiles = w.end > w.begin ? ceil_div(w.end - w.begin, kTile) : 0;
#pragma unroll
  for (int s = 0; s < C::kStages; ++s) {
    if (s < num_tiles) offsets.write(s, s);
  }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < C::kStages; ++s) {
    if (s < num_tiles) issue(k_s + s * C::kTileBytes, kv.k, s);
    cp_async_commit();
    if (s < num_tiles) issue(v_s + s * C::kTileBytes, kv.v, s);
    cp_async_commit();
  }

  // Softmax state of the lane's two rows (g and g + 8 of the warp's tile); l is the lane's
  // share of the row sum until the end.
  const int g = lane >> 2;
  const int quad = lane & 3;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  int32_t limit[2];  // tokens < limit are visible to the row (causal, and < end)
  int32_t first[2];  // WINDOWED: tokens >= first are visible to the row (its window)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t item_row = row0 + 16 * wq + g + 8 * h;
    limit[h] = min(w.end, w.causal_base + item_row / group + 1);
    first[h] = WINDOWED ? window_first(p, w.causal_base + item_row / group) : 0;
  }
  const bool active = 16 * wq < rows;  // warps of all-padding row tiles only load
  float o[C::kNTiles][4] = {};

  for (int i = 0; i < num_tiles; ++i) {
    const int stage = i % C::kStages;
    const int32_t t0 = w.begin + i * kTile;
    const bool refill = i + C::kStages < num_tiles;
    cp_async_wait<2 * C::kStages - 1>();  // K(i) landed
    __syncthreads();
    if (refill) offsets.write(i + C::kStages, stage);

    uint32_t pa[C::kChunksPerWarp][C::kQTerms][4];  // P as A fragments
    if (active) {
      const char* k_tile = k_s + stage * C::kTileBytes;
      float s[C::kChunksPerWarp][2][4] = {};
#pragma unroll
      for (int ks = 0; ks < C::kKSteps; ++ks) {
        uint32_t a[C::kQTerms][4];
        load_q<C>(q_s, 16 * wq, ks, lane, a);
#pragma unroll
        for (int j = 0; j < C::kChunksPerWarp; ++j) {
          uint32_t b[2][C::kKvTerms][2];
          load_k<C, KVT>(k_tile, wkv + j * C::kWarpsKv, ks, lane, b);
          mma_terms<C>(s[j][0], a, b[0]);
          mma_terms<C>(s[j][1], a, b[1]);
        }
      }
      // Scale, select away invisible tokens, online softmax per row.
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < C::kChunksPerWarp; ++j) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = e >> 1;
            const int32_t t = t0 + (wkv + j * C::kWarpsKv) * kChunk + nt * 8 + 2 * quad + (e & 1);
            bool visible = t < limit[h];
            if constexpr (WINDOWED) visible = visible && t >= first[h];
            const float x = visible ? s[j][nt][e] * score_scale : -INFINITY;
            s[j][nt][e] = x;
            tile_max[h] = fmaxf(tile_max[h], x);
          }
        }
      }
      float alpha[2], base[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        const float m_new = fmaxf(m[h], tile_max[h]);
        base[h] = m_new == -INFINITY ? 0.0f : m_new;  // all hidden so far: p = 0, no NaN
        alpha[h] = exp2f(m[h] - base[h]);
        m[h] = m_new;
        l[h] *= alpha[h];
      }
#pragma unroll
      for (int nt = 0; nt < C::kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[nt][e] *= alpha[e >> 1];
      }
#pragma unroll
      for (int j = 0; j < C::kChunksPerWarp; ++j) {
        float pr[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            pr[nt][e] = exp2f(s[j][nt][e] - base[e >> 1]);
            l[e >> 1] += pr[nt][e];
          }
        }
        // C fragments of the two token n tiles are the A fragment of P (k = tokens).
        uint32_t t[4][C::kQTerms];
        pack_terms<C::kHalf>(pr[0][0], pr[0][1], t[0]);
        pack_terms<C::kHalf>(pr[0][2], pr[0][3], t[1]);
        pack_terms<C::kHalf>(pr[1][0], pr[1][1], t[2]);
        pack_terms<C::kHalf>(pr[1][2], pr[1][3], t[3]);
#pragma unroll
        for (int term = 0; term < C::kQTerms; ++term) {
#pragma unroll
          for (int r = 0; r < 4; ++r) pa[j][term][r] = t[r][term];
        }
      }
    }
    __syncthreads();  // K(i) consumed; the offsets of tile i + kStages are visible
    if (refill) issue(k_s + stage * C::kTileBytes, kv.k, stage);
    cp_async_commit();
    cp_async_wait<2 * C::kStages - 1>();  // V(i) landed
    __syncthreads();
    if (active) {
      const char* v_tile = v_s + stage * C::kTileBytes;
#pragma unroll
      for (int j = 0; j < C::kChunksPerWarp; ++j) {
#pragma unroll
        for (int np = 0; np < C::kNTiles / 2; ++np) {
          uint32_t b[2][C::kKvTerms][2];
          load_v<C, KVT>(v_tile, wkv + j * C::kWarpsKv, np, lane, b);
          mma_terms<C>(o[2 * np], pa[j], b[0]);
          mma_terms<C>(o[2 * np + 1], pa[j], b[1]);
        }
      }
    }
    __syncthreads();  // V(i) consumed
    if (refill) issue(v_s + stage * C::kTileBytes, kv.v, stage);
    cp_async_commit();
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages are free: they hold the merge states now

  // Row sums over the quad, then warps along the tokens merge into warp slice 0.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  MergeState st[2] = {{m[0], l[0]}, {m[1], l[1]}};
  if constexpr (C::kWarpsKv > 1) {
    constexpr int kValues = C::kNTiles * 4 + 4;
    float* merge = reinterpret_cast<float*>(smem + lay.merge);
    if (active && wkv > 0) {
      float* mine = merge + ((wkv - 1) * C::kWarpsQ + wq) * kValues * 32 + lane;
#pragma unroll
      for (int nt = 0; nt < C::kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(nt * 4 + e) * 32] = o[nt][e];
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mine[(C::kNTiles * 4 + 2 * h) * 32] = st[h].m;
        mine[(C::kNTiles * 4 + 2 * h + 1) * 32] = st[h].l;
      }
    }
    __syncthreads();
    if (!active || wkv > 0) return;
    for (int other = 1; other < C::kWarpsKv; ++other) {
      const float* theirs = merge + ((other - 1) * C::kWarpsQ + wq) * kValues * 32 + lane;
      MergeScales sc[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const MergeState part{theirs[(C::kNTiles * 4 + 2 * h) * 32],
                              theirs[(C::kNTiles * 4 + 2 * h + 1) * 32]};
        sc[h] = merge_into(st[h], part);
      }
#pragma unroll
      for (int nt = 0; nt < C::kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          o[nt][e] = o[nt][e] * sc[e >> 1].self + theirs[(nt * 4 + e) * 32] * sc[e >> 1].other;
        }
      }
    }
  }
  if (!active) return;

    // Outputs: each lane holds dims 8 nt + 2 quad, +1 of its two rows.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * wq + g + 8 * h;
    if (r >= rows) continue;
    const int32_t item_row = row0 + r;
    const int64_t q_row = w.q_first + item_row / group;
    const int32_t head = kvh * group + item_row % group;
    if (split) {  // fp32 partials of split z, merged by the combine kernel
      const int64_t idx = (int64_t{z} * p.table.num_seqs + seq) * p.num_q_heads + head;
      float* po = p.maybe_partial_o + idx * HD;
#pragma unroll
      for (int nt = 0; nt < C::kNTiles; ++nt) {
        *reinterpret_cast<float2*>(po + nt * 8 + 2 * quad) =
            make_float2(o[nt][2 * h], o[nt][2 * h + 1]);
      }
      if (quad == 0) {
        p.maybe_partial_ml[idx * 2] = st[h].m;
        p.maybe_partial_ml[idx * 2 + 1] = st[h].l;
      }
      continue;
    }
    // A sink joins the denominator once ({m = sink, l = 1}, no vector): the output's scale
    // absorbs the rescale of o.
    float o_scale = v_scale;
    if (p.maybe_sinks != nullptr) {
      o_scale *= merge_into(st[h], MergeState{p.maybe_sinks[head] * kLog2e, 1.0f}).self;
    }
    const float inv = inv_sum(st[h]) * o_scale;
    QT* out = static_cast<QT*>(p.o) + (q_row * p.num_q_heads + head) * HD;
#pragma unroll
    for (int nt = 0; nt < C::kNTiles; ++nt) {
      out[nt * 8 + 2 * quad] = from_float<QT>(o[nt][2 * h] * inv);
      out[nt * 8 + 2 * quad + 1] = from_float<QT>(o[nt][2 * h + 1] * inv);
    }
    if (p.maybe_lse != nullptr && quad == 0) {
      p.maybe_lse[q_row * p.num_q_heads + head] = natural_lse(st[h]);
    }
  }
}

// The CTA shape for `item_rows` rows per work item: 64 rows when more than 16 are needed
// and the types allow it, else 16.
template <typename QT, int HD>
constexpr int warps_q_for(int32_t item_rows) {
  return item_rows > 16 && kWideShape<QT, HD> ? 4 : 1;
}

// Calls f(Config) for the shape that serves `item_rows`.
template <typename QT, typename KVT, int HD, typename F>
void with_config(int32_t item_rows, F&& f) {
  if constexpr (kWideShape<QT, HD>) {
    if (warps_q_for<QT, HD>(item_rows) == 4) return f(Config<QT, KVT, HD, 4>{});
  }
  f(Config<QT, KVT, HD, 1>{});
}

// Calls f(std::bool_constant<WINDOWED>) for the kernel variant of `kind`.
template <typename F>
void with_windowed(AttentionKind kind, F&& f) {
  if (kind == AttentionKind::kFull) return f(std::false_type{});
  f(std::true_type{});
}

template <typename QT, typename KVT, int HD>
cudaError_t launch_typed(const AttentionParams& p, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  with_config<QT, KVT, HD>(p.q_tile * p.group_size, [&](auto config) {
    with_windowed(p.kind, [&](auto windowed) {
      using C = decltype(config);
      constexpr size_t smem = smem_layout<C>().total;
      auto kernel = paged_attention_kernel<QT, KVT, HD, C::kWarpsQ, decltype(windowed)::value>;
      err = allow_smem(kernel, smem);
      if (err != cudaSuccess) return;
      const CtaShape shape{ceil_div(p.q_tile * p.group_size, C::kCtaRows)};
      const int32_t num_z = p.maybe_qo_indptr == nullptr ? p.num_splits : p.num_q_tiles;
      const dim3 grid(static_cast<unsigned>(p.table.num_seqs),
                      static_cast<unsigned>(p.kv.num_kv_heads * shape.row_chunks),
                      static_cast<unsigned>(num_z));
      kernel<<<grid, kThreads, smem, stream>>>(p, shape);
      err = cudaGetLastError();
    });
  });
  if (err != cudaSuccess || p.maybe_qo_indptr != nullptr) return err;
  return launch_combine<QT, HD>(p, stream);
}

}  // namespace

size_t attention_smem_bytes(DType q_dtype, DType kv_dtype, int32_t head_dim, int32_t rows) {
  size_t bytes = 0;
  dispatch_attention(q_dtype, kv_dtype, head_dim, [&](auto q_tag, auto kv_tag, auto hd) {
    using QT = typename decltype(q_tag)::type;
    using KVT = typename decltype(kv_tag)::type;
    with_config<QT, KVT, decltype(hd)::value>(
        rows, [&](auto config) { bytes = smem_layout<decltype(config)>().total; });
  });
  return bytes;
}

int32_t attention_cta_rows(DType q_dtype, DType kv_dtype, int32_t head_dim, int32_t rows) {
  int32_t cta_rows = 0;
  dispatch_attention(q_dtype, kv_dtype, head_dim, [&](auto q_tag, auto kv_tag, auto hd) {
    using QT = typename decltype(q_tag)::type;
    using KVT = typename decltype(kv_tag)::type;
    with_config<QT, KVT, decltype(hd)::value>(
        rows, [&](auto config) { cta_rows = decltype(config)::kCtaRows; });
  });
  return cta_rows;
}

cudaError_t attention_ctas_per_sm(DType q_dtype, DType kv_dtype, int32_t head_dim, int32_t rows,
                                  bool windowed, int* ctas_per_sm) {
  cudaError_t err = cudaErrorInvalidValue;
  *ctas_per_sm = 0;
  dispatch_attention(q_dtype, kv_dtype, head_dim, [&](auto q_tag, auto kv_tag, auto hd) {
    using QT = typename decltype(q_tag)::type;
    using KVT = typename decltype(kv_tag)::type;
    constexpr int HD = decltype(hd)::value;
    with_config<QT, KVT, HD>(rows, [&](auto config) {
      with_windowed(
          windowed ? AttentionKind::kSlidingWindow : AttentionKind::kFull, [&](auto windowed_tag) {
            using C = decltype(config);
            constexpr size_t smem = smem_layout<C>().total;
            auto kernel =
                paged_attention_kernel<QT, KVT, HD, C::kWarpsQ, decltype(windowed_tag)::value>;
            err = allow_smem(kernel, smem);
            if (err == cudaSuccess) {
              err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, kernel, kThreads,
                                                                  smem);
            }
          });
    });
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
