// CPU reference of the paged attention (GQA decode and extend, MLA decode) and cache-write
// kernels.
//
// Same work decomposition as the CUDA kernels (attention_params.h): per (sequence, KV
// head, z) the query rows of the GQA group (MLA: all heads) are loaded once, the item's
// context tokens [begin, end) are processed in chunks of kChunk tokens (gathered through
// the block table, converted to fp32 once per chunk and shared by all rows), and each row
// keeps an online-softmax MergeState over the tokens its window and causal limit select.
// Inner loops run over head_dim, a compile-time constant for GQA, with independent
// accumulators so the compiler vectorizes them; nothing is allocated per token.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention/cpu_kernels.h"
#include "kernels/dispatch.h"
#include "pagedkv/merge_state.h"
#include "pagedkv/numeric.h"

namespace pagedkv::internal {
namespace {

// Context tokens gathered per step. Independent of block_size, so a paged cache and a
// contiguous one run the same loops; only the row addresses differ.
constexpr int32_t kChunk = 32;

// Vector helpers over `n` floats. N > 0 makes the length a compile-time constant (GQA's
// head_dim: the loops vectorize fully); N == 0 takes it at run time (MLA's dims, any size).
template <int N>
inline float dot(const float* __restrict a, const float* __restrict b, int32_t n) {
  const int32_t len = N > 0 ? N : n;
  float acc[8] = {};
  int32_t d = 0;
  for (; d + 8 <= len; d += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[d + j] * b[d + j];
  }
  float tail = 0.0f;
  for (; d < len; ++d) tail += a[d] * b[d];
  return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}

template <int N>
inline void scale_row(float* __restrict o, float s, int32_t n) {
  const int32_t len = N > 0 ? N : n;
  for (int32_t d = 0; d < len; ++d) o[d] *= s;
}

template <int N>
inline void axpy(float* __restrict o, float p, const float* __restrict v, int32_t n) {
  const int32_t len = N > 0 ? N : n;
  for (int32_t d = 0; d < len; ++d) o[d] += p * v[d];
}

template <typename T, int N>
inline void convert_row(const T* __restrict src, float* __restrict dst, float scale, int32_t n) {
  const int32_t len = N > 0 ? N : n;
  for (int32_t d = 0; d < len; ++d) dst[d] = to_float(src[d]) * scale;
}

// Element offsets (head `head`, dim 0) of context tokens [t_begin, t_begin + count) of a
// sequence whose table row is `row`. Walks the row block by block, so it reads entries
// t / block_size for those tokens only, with one division per chunk.
inline void chunk_offsets(const KvCacheView& kv, const int32_t* row, int32_t head, int32_t t_begin,
                          int32_t count, int64_t* out) {
  int32_t entry = t_begin / kv.block_size;
  int32_t in_block = t_begin - entry * kv.block_size;
  int64_t base = elem_offset(kv, row[entry], head, 0, 0);
  for (int32_t j = 0; j < count; ++j) {
    out[j] = base + in_block * kv.token_stride;
    if (++in_block == kv.block_size && j + 1 < count) {
      in_block = 0;
      base = elem_offset(kv, row[++entry], head, 0, 0);
    }
  }
}

inline void prefetch_row(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
}

// One templated path for every attention the library runs on the CPU: GQA decode and
// extend (HD = head_dim, compile time) and MLA decode (HD = 0: the q/K dims kv.head_dim
// and the value dims v_dim at run time, V read from the K pool), full or windowed, with or
// without sinks.
template <typename QT, typename KVT, int HD>
void attention_typed(const AttentionParams& p) {
  const KvCacheView& kv = p.kv;
  const int32_t qk_dim = HD > 0 ? HD : kv.head_dim;
  const int32_t v_dim = HD > 0 ? HD : p.v_dim;
  const int32_t group = p.group_size;
  const int32_t max_rows = p.q_tile * group;
  const bool split = p.maybe_qo_indptr == nullptr && p.num_splits > 1;
  const int32_t num_z = p.maybe_qo_indptr == nullptr ? p.num_splits : p.num_q_tiles;
  const float k_scale = p.maybe_k_scale != nullptr ? *p.maybe_k_scale : 1.0f;
  const float v_scale = p.maybe_v_scale != nullptr ? *p.maybe_v_scale : 1.0f;
  const float q_scale = p.score_scale * k_scale;
  const int64_t k_row_bytes = int64_t{qk_dim} * static_cast<int64_t>(sizeof(KVT));
  const int64_t v_row_bytes = int64_t{v_dim} * static_cast<int64_t>(sizeof(KVT));

  // Work buffers, allocated once per call.
  std::vector<float> q_rows(static_cast<size_t>(max_rows) * qk_dim);
  std::vector<float> o_rows(static_cast<size_t>(max_rows) * v_dim);
  std::vector<MergeState> states(max_rows);
  std::vector<int32_t> row_first(max_rows), row_limit(max_rows);
  std::vector<float> o_total(split ? static_cast<size_t>(group) * v_dim : 0);
  std::vector<MergeState> totals(split ? group : 0);
  std::vector<float> k_buf(static_cast<size_t>(kChunk) * qk_dim);
  std::vector<float> v_buf(static_cast<size_t>(kChunk) * v_dim);
  float scores[kChunk];
  int64_t offsets[2][kChunk];

  const QT* q = static_cast<const QT*>(p.q);
  QT* out = static_cast<QT*>(p.o);
  const KVT* k_pool = static_cast<const KVT*>(kv.k);
  const KVT* v_pool = static_cast<const KVT*>(kv.v);

  // A sink joins the row's denominator once, as a state {m = sink, l = 1} with no vector.
  auto write_row = [&](int64_t q_row, int32_t head, float* o, MergeState st) {
    if (p.maybe_sinks != nullptr) {
      const MergeScales s = merge_into(st, MergeState{p.maybe_sinks[head] * kLog2e, 1.0f});
      scale_row<HD>(o, s.self, v_dim);
    }
    const float inv = inv_sum(st) * v_scale;
    QT* dst = out + (q_row * p.num_q_heads + head) * v_dim;
    for (int32_t d = 0; d < v_dim; ++d) dst[d] = from_float<QT>(o[d] * inv);
    if (p.maybe_lse != nullptr) p.maybe_lse[q_row * p.num_q_heads + head] = natural_lse(st);
  };

  for (int32_t seq = 0; seq < p.table.num_seqs; ++seq) {
    const int32_t* table_row = p.table.block_table + int64_t{seq} * p.table.max_blocks;
    for (int32_t kvh = 0; kvh < kv.num_kv_heads; ++kvh) {
      if (split) {
        std::fill(o_total.begin(), o_total.end(), 0.0f);
        std::fill(totals.begin(), totals.end(), MergeState{});
      }
      for (int32_t z = 0; z < num_z; ++z) {
        const WorkItem w = describe_work(p, seq, z);
        if (w.num_q == 0) continue;
        const int32_t rows = w.num_q * group;
        for (int32_t r = 0; r < rows; ++r) {
          const int64_t q_row = w.q_first + r / group;
          const int32_t head = kvh * group + r % group;
          convert_row<QT, HD>(q + (q_row * p.num_q_heads + head) * qk_dim,
                              &q_rows[size_t(r) * qk_dim], q_scale, qk_dim);
          states[r] = MergeState{};
          // The row's query sits at `pos` and sees tokens [window_first(pos), pos].
          const int32_t pos = w.causal_base + r / group;
          row_first[r] = window_first(p, pos);
          row_limit[r] = pos + 1;
        }
        std::fill(o_rows.begin(), o_rows.end(), 0.0f);

        // Element offsets of the current and the next chunk's tokens; the next chunk is
        // prefetched while the current one is computed (paged rows defeat the hardware
        // prefetcher at every block boundary).
        int32_t cur = 0;
        if (w.begin < w.end) {
          chunk_offsets(kv, table_row, kvh, w.begin, std::min(kChunk, w.end - w.begin),
                        offsets[cur]);
        }
        for (int32_t t0 = w.begin; t0 < w.end; t0 += kChunk) {
          const int32_t n = std::min(kChunk, w.end - t0);
          const int32_t t_next = t0 + kChunk;
          const int32_t n_next = t_next < w.end ? std::min(kChunk, w.end - t_next) : 0;
          if (n_next > 0) chunk_offsets(kv, table_row, kvh, t_next, n_next, offsets[cur ^ 1]);
          // The next chunk's rows are prefetched a few at a time, spread over this chunk's
          // rows, so the requests do not arrive in one burst.
          int32_t prefetched = 0;
          auto prefetch_until = [&](int32_t upto) {
            for (; prefetched < upto; ++prefetched) {
              prefetch_row(k_pool + offsets[cur ^ 1][prefetched], k_row_bytes);
              prefetch_row(v_pool + offsets[cur ^ 1][prefetched], v_row_bytes);
            }
          };
          // Gather: only tokens in [begin, end) are addressed (the item's window start to at
          // most the context length).
          for (int32_t j = 0; j < n; ++j) {
            // fp32 rows are copied too: the computation then always reads one dense
            // L1-resident tile, whatever the block size (measured: reading paged fp32
            // rows in place cost 1.2-1.4x a contiguous cache; copying them, less).
            const int64_t off = offsets[cur][j];
            convert_row<KVT, HD>(k_pool + off, &k_buf[size_t(j) * qk_dim], 1.0f, qk_dim);
            convert_row<KVT, HD>(v_pool + off, &v_buf[size_t(j) * v_dim], 1.0f, v_dim);
          }
          for (int32_t r = 0; r < rows; ++r) {
            prefetch_until(static_cast<int32_t>(int64_t{n_next} * (r + 1) / rows));
            // Selection: this row sees the chunk's tokens [lo, hi): its window and causal
            // limits.
            const int32_t lo = std::clamp(row_first[r] - t0, 0, n);
            const int32_t hi = std::clamp(row_limit[r] - t0, 0, n);
            if (lo >= hi) continue;
            const float* qr = &q_rows[size_t(r) * qk_dim];
            float tile_max = -INFINITY;
            for (int32_t j = lo; j < hi; ++j) {
              scores[j] = dot<HD>(qr, &k_buf[size_t(j) * qk_dim], qk_dim);
              tile_max = std::max(tile_max, scores[j]);
            }
            MergeState& st = states[r];
            float* orow = &o_rows[size_t(r) * v_dim];
            const float rescale = raise_max(st, tile_max);
            if (rescale != 1.0f) scale_row<HD>(orow, rescale, v_dim);
            for (int32_t j = lo; j < hi; ++j) {
              const float pj = exp2f(scores[j] - st.m);
              st.l += pj;
              axpy<HD>(orow, pj, &v_buf[size_t(j) * v_dim], v_dim);
            }
          }
          prefetch_until(n_next);  // rows skipped by `continue` above
          cur ^= 1;
        }

        for (int32_t r = 0; r < rows; ++r) {
          const int32_t head = kvh * group + r % group;
          float* orow = &o_rows[size_t(r) * v_dim];
          if (split) {  // merge partial z into the running total, in split order
            float* ot = &o_total[size_t(r) * v_dim];
            const MergeScales s = merge_into(totals[r], states[r]);
            for (int32_t d = 0; d < v_dim; ++d) ot[d] = ot[d] * s.self + orow[d] * s.other;
          } else {
            write_row(w.q_first + r / group, head, orow, states[r]);
          }
        }
      }
      if (split) {
        for (int32_t g = 0; g < group; ++g) {
          write_row(seq, kvh * group + g, &o_total[size_t(g) * v_dim], totals[g]);
        }
      }
    }
  }
}

template <typename Src, typename Dst>
void write_kv_typed(const WriteKvParams& p) {
  const KvCacheView& kv = p.kv;
  const int32_t head_dim = kv.head_dim;
  const bool fp8 = std::is_same_v<Dst, Fp8E4M3>;
  const float k_inv = fp8 && p.maybe_k_scale != nullptr ? 1.0f / *p.maybe_k_scale : 1.0f;
  const float v_inv = fp8 && p.maybe_v_scale != nullptr ? 1.0f / *p.maybe_v_scale : 1.0f;
  const Src* k = static_cast<const Src*>(p.k);
  const Src* v = static_cast<const Src*>(p.v);
  Dst* k_pool = static_cast<Dst*>(kv.k);
  Dst* v_pool = static_cast<Dst*>(kv.v);
  for (int32_t i = 0; i < p.num_tokens; ++i) {
    const int64_t slot = p.slot_mapping[i];
    if (slot < 0) continue;
    for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
      const int64_t src = (int64_t{i} * kv.num_kv_heads + h) * head_dim;
      const int64_t dst = slot_offset(kv, slot, h);
      if constexpr (std::is_same_v<Src, Dst>) {
        std::memcpy(k_pool + dst, k + src, sizeof(Src) * head_dim);
        if (v != nullptr) std::memcpy(v_pool + dst, v + src, sizeof(Src) * head_dim);
      } else {
        for (int32_t d = 0; d < head_dim; ++d) {
          k_pool[dst + d] = from_float<Dst>(to_float(k[src + d]) * k_inv);
        }
        for (int32_t d = 0; v != nullptr && d < head_dim; ++d) {
          v_pool[dst + d] = from_float<Dst>(to_float(v[src + d]) * v_inv);
        }
      }
    }
  }
}

}  // namespace

void paged_attention_cpu(const AttentionParams& p) {
  if (p.v_dim != 0) {  // MLA: dims at run time
    dispatch_attention_dtypes(p.q_dtype, p.kv.dtype, [&](auto q_tag, auto kv_tag) {
      attention_typed<typename decltype(q_tag)::type, typename decltype(kv_tag)::type, 0>(p);
      return true;
    });
    return;
  }
  dispatch_attention(p.q_dtype, p.kv.dtype, p.kv.head_dim, [&](auto q_tag, auto kv_tag, auto hd) {
    attention_typed<typename decltype(q_tag)::type, typename decltype(kv_tag)::type,
                    decltype(hd)::value>(p);
  });
}

void write_kv_cpu(const WriteKvParams& p) {
  dispatch_write_kv(p.src_dtype, p.kv.dtype, [&](auto src_tag, auto dst_tag) {
    write_kv_typed<typename decltype(src_tag)::type, typename decltype(dst_tag)::type>(p);
  });
}

}  // namespace pagedkv::internal
