// Test fixtures for the attention kernels: a paged cache built from a random block
// permutation with NaN in every unused slot, unused block and padding entry, and
// references computed independently (own address math, fp64, two-pass softmax). Windowed
// cases (sliding window, chunked local) hold only the blocks from the window start of a
// sequence's first query on: the entries before point at NaN blocks or at kPaddingBlock
// (released, as the allocator leaves them), and the slots before the window start in the
// first held block are NaN too. Sinks: one random logit per query head.
// run_attention() / run_mla() run a fixture on either backend; check_attention() /
// check_mla() check a backend against the fp64 reference and, on CUDA, against the CPU
// reference run too. Shared by attention_test.cc, attention_mla_test.cc and
// kernels_cuda_test.cc.
#ifndef PAGEDKV_TESTS_ATTENTION_TEST_UTIL_H_
#define PAGEDKV_TESTS_ATTENTION_TEST_UTIL_H_

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/attention.h"
#include "pagedkv/block_table.h"
#include "pagedkv/dtype.h"
#include "pagedkv/kv_cache_view.h"
#include "pagedkv/layer_group.h"
#include "pagedkv/numeric.h"
#include "support/backends.h"

namespace pagedkv::testing {

inline float load_elem(const uint8_t* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kFloat32:
      return reinterpret_cast<const float*>(base)[i];
    case DType::kFloat16:
      return to_float(reinterpret_cast<const Half*>(base)[i]);
    case DType::kBFloat16:
      return to_float(reinterpret_cast<const BFloat16*>(base)[i]);
    case DType::kFloat8E4M3:
      return to_float(reinterpret_cast<const Fp8E4M3*>(base)[i]);
  }
  return 0.0f;
}

inline void store_elem(uint8_t* base, DType dtype, int64_t i, float x) {
  switch (dtype) {
    case DType::kFloat32:
      reinterpret_cast<float*>(base)[i] = x;
      return;
    case DType::kFloat16:
      reinterpret_cast<Half*>(base)[i] = from_float<Half>(x);
      return;
    case DType::kBFloat16:
      reinterpret_cast<BFloat16*>(base)[i] = from_float<BFloat16>(x);
      return;
    case DType::kFloat8E4M3:
      reinterpret_cast<Fp8E4M3*>(base)[i] = from_float<Fp8E4M3>(x);
      return;
  }
}

// `count` elements of `dtype`, each NaN: one element's bytes, copied in doubling runs (the
// pools of the largest cases hold tens of MB).
inline std::vector<uint8_t> nan_pool(DType dtype, int64_t count) {
  const int64_t elem = bytes_per_element(dtype);
  std::vector<uint8_t> pool(count * elem);
  if (count == 0) return pool;
  store_elem(pool.data(), dtype, 0, NAN);
  for (int64_t done = elem; done < count * elem; done *= 2) {
    std::memcpy(pool.data() + done, pool.data(), std::min(done, count * elem - done));
  }
  return pool;
}

struct AttentionCase {
  int32_t head_dim = 128;
  int32_t block_size = 16;
  int32_t num_q_heads = 8;
  int32_t num_kv_heads = 2;
  DType q_dtype = DType::kFloat32;
  DType kv_dtype = DType::kFloat32;
  KvLayout layout = KvLayout::kHND;
  std::vector<int32_t> lens = {};        // context length of each sequence
  std::vector<int32_t> new_tokens = {};  // extend: new tokens per sequence; empty for decode
  uint64_t seed = 1;
  AttentionKind kind = AttentionKind::kFull;
  int32_t window = 0;  // tokens, > 0 for the windowed kinds
  bool sinks = false;  // one sink logit per query head

  bool extend() const { return !new_tokens.empty(); }
  // First token any query of sequence `seq` attends (its first query's window start).
  int32_t first_read(int32_t seq) const {
    const int32_t len = lens[seq];
    const int64_t pos = extend() ? len - new_tokens[seq] : len - 1;
    return pos <= 0 ? 0 : static_cast<int32_t>(first_attended(kind, window, pos));
  }
  std::string name() const {
    std::string s = std::string(dtype_name(q_dtype)) + "/" + dtype_name(kv_dtype) +
                    " hd=" + std::to_string(head_dim) + " bs=" + std::to_string(block_size) +
                    " heads=" + std::to_string(num_q_heads) + "/" + std::to_string(num_kv_heads) +
                    (layout == KvLayout::kHND ? " HND" : " NHD") + " " + attention_kind_name(kind) +
                    " window=" + std::to_string(window) + (sinks ? " sinks" : "") + " lens=";
    for (size_t i = 0; i < lens.size() && i < 8; ++i) s += std::to_string(lens[i]) + ",";
    if (lens.size() > 8) s += "...(" + std::to_string(lens.size()) + ")";
    return s;
  }
};

// Host data of one case.
struct AttentionFixture {
  AttentionCase c;
  int32_t num_blocks = 0;
  int32_t max_blocks = 0;
  std::vector<uint8_t> k_pool, v_pool;
  std::vector<int32_t> table, lens, qo_indptr;
  std::vector<uint8_t> q;    // [query rows, num_q_heads, head_dim], q dtype
  std::vector<float> sinks;  // [num_q_heads] natural-log sink logits; empty without sinks
  int32_t num_q_rows = 0;
  float k_scale = 1.0f;
  float v_scale = 1.0f;

  int32_t num_seqs() const { return static_cast<int32_t>(lens.size()); }
  bool fp8() const { return c.kv_dtype == DType::kFloat8E4M3; }
  const float* k_scale_ptr() const { return fp8() ? &k_scale : nullptr; }
  const float* sinks_ptr() const { return sinks.empty() ? nullptr : sinks.data(); }
  const float* v_scale_ptr() const { return fp8() ? &v_scale : nullptr; }
  int32_t max_len() const { return *std::max_element(lens.begin(), lens.end()); }

  KvCacheView view() {
    return make_kv_cache_view(k_pool.data(), v_pool.data(), c.kv_dtype, num_blocks, c.num_kv_heads,
                              c.block_size, c.head_dim, c.layout);
  }
  BlockTableView table_view() const {
    return {table.data(), lens.data(), num_seqs(), max_blocks, c.block_size};
  }

  // Independent address math (not elem_offset).
  int64_t index(int32_t seq, int32_t t, int32_t h, int32_t d) const {
    const int64_t block = table[int64_t{seq} * max_blocks + t / c.block_size];
    const int64_t off = t % c.block_size;
    if (c.layout == KvLayout::kHND) {
      return ((block * c.num_kv_heads + h) * c.block_size + off) * c.head_dim + d;
    }
    return ((block * c.block_size + off) * c.num_kv_heads + h) * c.head_dim + d;
  }
  // Dequantized cache value.
  double kv(bool is_v, int32_t seq, int32_t t, int32_t h, int32_t d) const {
    const float raw =
        load_elem(is_v ? v_pool.data() : k_pool.data(), c.kv_dtype, index(seq, t, h, d));
    return fp8() ? double{raw} * (is_v ? v_scale : k_scale) : double{raw};
  }
  double qv(int64_t row, int32_t head, int32_t d) const {
    return load_elem(q.data(), c.q_dtype, (row * c.num_q_heads + head) * c.head_dim + d);
  }
  // Query row -> (sequence, causal limit, first attended token: its window start).
  void row_info(int64_t row, int32_t* seq, int32_t* limit, int32_t* first) const {
    if (!c.extend()) {
      *seq = static_cast<int32_t>(row);
      *limit = lens[row];
    } else {
      int32_t s = 0;
      while (qo_indptr[s + 1] <= row) ++s;
      *seq = s;
      *limit = lens[s] - c.new_tokens[s] + static_cast<int32_t>(row - qo_indptr[s]) + 1;
    }
    *first = *limit > 0 ? static_cast<int32_t>(first_attended(c.kind, c.window, *limit - 1)) : 0;
  }
};

inline AttentionFixture make_fixture(const AttentionCase& c) {
  AttentionFixture f;
  f.c = c;
  f.lens = c.lens;
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int32_t n = f.num_seqs();
  // Held entries of sequence s: from its first read token's block to ceil(len / bs).
  std::vector<int32_t> held_from(n);
  int32_t needed = 0;
  int32_t longest = 0;
  for (int32_t s = 0; s < n; ++s) {
    held_from[s] = c.first_read(s) / c.block_size;
    const int32_t used = num_blocks_for_tokens(c.lens[s], c.block_size);
    needed += used - held_from[s];
    longest = std::max(longest, used);
  }
  f.num_blocks = std::max(3 * needed, needed + 8);
  f.max_blocks = longest + 2;
  std::vector<int32_t> perm(f.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  // Rows: held entries from the permutation; padding entries name unused (NaN) blocks;
  // released entries (before the window) alternate between NaN blocks and kPaddingBlock.
  f.table.assign(static_cast<size_t>(n) * f.max_blocks, 0);
  int32_t next = 0;
  int32_t pad = 0;
  const int32_t unused = f.num_blocks - needed;
  for (int32_t s = 0; s < n; ++s) {
    const int32_t used = num_blocks_for_tokens(c.lens[s], c.block_size);
    for (int32_t e = 0; e < f.max_blocks; ++e) {
      int32_t id = perm[needed + (pad++ % unused)];
      if (e < held_from[s] && e % 2 == 1) id = kPaddingBlock;
      if (e >= held_from[s] && e < used) id = perm[next++];
      f.table[int64_t{s} * f.max_blocks + e] = id;
    }
  }
  if (f.fp8()) {
    f.k_scale = 0.01f;
    f.v_scale = 0.02f;
  }
  const int64_t pool = int64_t{f.num_blocks} * c.num_kv_heads * c.block_size * c.head_dim;
  // NaN everywhere first.
  f.k_pool = nan_pool(c.kv_dtype, pool);
  f.v_pool = f.k_pool;
  for (int32_t s = 0; s < n; ++s) {
    for (int32_t t = c.first_read(s); t < c.lens[s]; ++t) {
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        for (int32_t d = 0; d < c.head_dim; ++d) {
          const int64_t i = f.index(s, t, h, d);
          store_elem(f.k_pool.data(), c.kv_dtype, i, uni(rng) / f.k_scale);
          store_elem(f.v_pool.data(), c.kv_dtype, i, uni(rng) / f.v_scale);
        }
      }
    }
  }
  if (c.extend()) {
    f.qo_indptr.assign(n + 1, 0);
    for (int32_t s = 0; s < n; ++s) f.qo_indptr[s + 1] = f.qo_indptr[s] + c.new_tokens[s];
    f.num_q_rows = f.qo_indptr[n];
  } else {
    f.num_q_rows = n;
  }
  const int64_t q_elems = int64_t{f.num_q_rows} * c.num_q_heads * c.head_dim;
  f.q.assign(q_elems * bytes_per_element(c.q_dtype), 0);
  for (int64_t i = 0; i < q_elems; ++i) store_elem(f.q.data(), c.q_dtype, i, 2.0f * uni(rng));
  if (c.sinks) {
    // Around the scores' range, so each sink takes a noticeable share of its row.
    f.sinks.resize(c.num_q_heads);
    for (float& x : f.sinks) x = 1.0f + 1.5f * uni(rng);
  }
  return f;
}

struct Outputs {
  std::vector<double> out;  // [rows, num_q_heads, head_dim]
  std::vector<double> lse;  // [rows, num_q_heads]
};

// Dense copies of one sequence's dequantized K and V: [len][num_kv_heads][head_dim].
struct Gathered {
  std::vector<double> k, v;
};
inline Gathered gather(const AttentionFixture& f, int32_t seq) {
  const AttentionCase& c = f.c;
  Gathered g;
  const int64_t n = int64_t{f.lens[seq]} * c.num_kv_heads * c.head_dim;
  g.k.resize(n);
  g.v.resize(n);
  int64_t i = 0;
  for (int32_t t = 0; t < f.lens[seq]; ++t) {
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      for (int32_t d = 0; d < c.head_dim; ++d, ++i) {
        const bool held = t >= c.first_read(seq);  // before: released, never attended
        g.k[i] = held ? f.kv(false, seq, t, h, d) : NAN;
        g.v[i] = held ? f.kv(true, seq, t, h, d) : NAN;
      }
    }
  }
  return g;
}

// fp64 reference: gathered K/V, two-pass softmax over each row's window [first, limit),
// the sink (when given) in the denominator.
inline Outputs reference(const AttentionFixture& f) {
  const AttentionCase& c = f.c;
  const int32_t group = c.num_q_heads / c.num_kv_heads;
  const int32_t hd = c.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Outputs r;
  r.out.assign(int64_t{f.num_q_rows} * c.num_q_heads * hd, 0.0);
  r.lse.assign(int64_t{f.num_q_rows} * c.num_q_heads, -INFINITY);
  std::vector<double> scores, q(hd);
  int32_t gathered_seq = -1;
  Gathered g;
  for (int64_t row = 0; row < f.num_q_rows; ++row) {
    int32_t seq = 0;
    int32_t limit = 0;
    int32_t first = 0;
    f.row_info(row, &seq, &limit, &first);
    if (seq != gathered_seq) {
      g = gather(f, seq);
      gathered_seq = seq;
    }
    for (int32_t h = 0; h < c.num_q_heads; ++h) {
      const double sink = f.sinks.empty() ? -INFINITY : double{f.sinks[h]};
      if (limit == 0) {
        r.lse[row * c.num_q_heads + h] = sink;  // zeros; the sink alone in the denominator
        continue;
      }
      const int32_t kvh = h / group;
      for (int32_t d = 0; d < hd; ++d) q[d] = f.qv(row, h, d);
      scores.assign(limit, 0.0);
      double m = sink;
      for (int32_t t = first; t < limit; ++t) {
        const double* k = &g.k[(int64_t{t} * c.num_kv_heads + kvh) * hd];
        double s = 0.0;
        for (int32_t d = 0; d < hd; ++d) s += q[d] * k[d];
        scores[t] = s * scale;
        m = std::max(m, scores[t]);
      }
      double l = std::exp(sink - m);
      for (int32_t t = first; t < limit; ++t) l += std::exp(scores[t] - m);
      double* o = &r.out[(row * c.num_q_heads + h) * hd];
      for (int32_t t = first; t < limit; ++t) {
        const double p = std::exp(scores[t] - m) / l;
        const double* v = &g.v[(int64_t{t} * c.num_kv_heads + kvh) * hd];
        for (int32_t d = 0; d < hd; ++d) o[d] += p * v[d];
      }
      r.lse[row * c.num_q_heads + h] = m + std::log(l);
    }
  }
  return r;
}

// A naive bf16 implementation: scores rounded to bf16, probabilities rounded to bf16,
// fp32 sums, output rounded to bf16. The bf16 tolerance is twice its error.
inline std::vector<double> naive_bf16(const AttentionFixture& f) {
  const AttentionCase& c = f.c;
  const int32_t group = c.num_q_heads / c.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  auto bf = [](float x) { return to_float(from_float<BFloat16>(x)); };
  std::vector<double> out(int64_t{f.num_q_rows} * c.num_q_heads * c.head_dim, 0.0);
  std::vector<float> scores, acc(c.head_dim);
  int32_t gathered_seq = -1;
  Gathered g;
  for (int64_t row = 0; row < f.num_q_rows; ++row) {
    int32_t seq = 0;
    int32_t limit = 0;
    int32_t first = 0;
    f.row_info(row, &seq, &limit, &first);
    if (seq != gathered_seq) {
      g = gather(f, seq);
      gathered_seq = seq;
    }
    for (int32_t h = 0; h < c.num_q_heads; ++h) {
      const int32_t kvh = h / group;
      const float sink = f.sinks.empty() ? -INFINITY : f.sinks[h];
      scores.assign(limit, 0.0f);
      float m = sink;
      for (int32_t t = first; t < limit; ++t) {
        float s = 0.0f;
        for (int32_t d = 0; d < c.head_dim; ++d) {
          s += static_cast<float>(f.qv(row, h, d) *
                                  g.k[(int64_t{t} * c.num_kv_heads + kvh) * c.head_dim + d]);
        }
        scores[t] = bf(bf(s) * scale);
        m = std::max(m, scores[t]);
      }
      if (limit == 0) continue;
      float l = std::exp(sink - m);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int32_t t = first; t < limit; ++t) {
        const float p = bf(std::exp(scores[t] - m));
        l += p;
        for (int32_t d = 0; d < c.head_dim; ++d) {
          acc[d] +=
              p * static_cast<float>(g.v[(int64_t{t} * c.num_kv_heads + kvh) * c.head_dim + d]);
        }
      }
      for (int32_t d = 0; d < c.head_dim; ++d) {
        out[(row * c.num_q_heads + h) * c.head_dim + d] = bf(acc[d] / l);
      }
    }
  }
  return out;
}

// Kernel outputs as doubles, read from `bytes` of dtype `dtype`.
inline std::vector<double> to_doubles(const std::vector<uint8_t>& bytes, DType dtype) {
  const int64_t n = static_cast<int64_t>(bytes.size()) / bytes_per_element(dtype);
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = load_elem(bytes.data(), dtype, i);
  return out;
}

inline double max_abs_error(const std::vector<double>& a, const std::vector<double>& b) {
  double e = 0.0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(a[i] - b[i]));
  return e;
}

inline bool all_finite(const std::vector<double>& a) {
  return std::all_of(a.begin(), a.end(), [](double x) { return std::isfinite(x); });
}

// Absolute tolerance of dtype pairs other than bf16 (bf16 is relative to naive_bf16).
inline double tolerance(const AttentionCase& c) {
  if (c.kv_dtype == DType::kFloat8E4M3) return 1e-2;
  if (c.q_dtype == DType::kFloat16) return 1e-3;
  return 1e-5;
}

// Outputs of one kernel run, as doubles (out) and fp32 (lse).
struct Run {
  std::vector<double> out;
  std::vector<float> lse;
};

// Checks a run against the reference: no NaN/Inf, the dtype's tolerance, empty rows give
// zeros and lse -inf.
inline void check_run(const AttentionFixture& f, const Run& run, const Outputs& ref,
                      double naive_bf16_error) {
  const AttentionCase& c = f.c;
  INFO(c.name());
  REQUIRE(testing::all_finite(run.out));
  const double err = testing::max_abs_error(run.out, ref.out);
  if (c.q_dtype == DType::kBFloat16 && c.kv_dtype == DType::kBFloat16) {
    INFO("error " << err << ", naive bf16 error " << naive_bf16_error);
    CHECK(err <= 2.0 * naive_bf16_error);
  } else {
    INFO("error " << err << ", tolerance " << testing::tolerance(c));
    CHECK(err <= testing::tolerance(c));
  }
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      REQUIRE(std::isinf(run.lse[i]));
      REQUIRE(run.lse[i] < 0);
    } else {
      REQUIRE(std::isfinite(run.lse[i]));
      REQUIRE(std::abs(run.lse[i] - ref.lse[i]) <= 1e-4 * (1.0 + std::abs(ref.lse[i])));
    }
  }
}

inline double naive_error(const AttentionFixture& f, const Outputs& ref) {
  if (f.c.q_dtype != DType::kBFloat16 || f.c.kv_dtype != DType::kBFloat16) return 0.0;
  return testing::max_abs_error(testing::naive_bf16(f), ref.out);
}

// The paged cache and block table of a fixture where a backend reads them.
struct BackendCache {
  KvCacheView cache;
  BlockTableView table;
};
inline BackendCache place_cache(BackendMemory& mem, AttentionFixture& f) {
  BackendCache placed{f.view(), f.table_view()};
  placed.cache.k = mem.place(f.k_pool);
  placed.cache.v = mem.place(f.v_pool);
  placed.table.block_table = mem.place(f.table);
  placed.table.context_lens = mem.place(f.lens);
  return placed;
}

// Decode of `f` on `device` (by default unsplit), or extend for a case with new tokens
// (`options` and `total_context_len` are decode's). Outputs start as 0xff bytes and lse as
// 12345, so an element the kernel leaves unwritten shows.
inline Run run_attention(Device device, AttentionFixture& f,
                         const DecodeOptions& options = {.num_splits = 1},
                         int64_t total_context_len = 0) {
  const AttentionCase& c = f.c;
  BackendMemory mem(device);
  const auto [view, table] = place_cache(mem, f);
  const float* scales = f.fp8() ? mem.place(std::vector<float>{f.k_scale, f.v_scale}) : nullptr;
  const float* sinks = f.sinks.empty() ? nullptr : mem.place(f.sinks);
  uint8_t* out = mem.filled<uint8_t>(f.q.size(), 0xff);
  const size_t lse_count = static_cast<size_t>(f.num_q_rows) * c.num_q_heads;
  float* lse = mem.filled(lse_count, 12345.0f);
  absl::Status status;
  if (c.extend()) {
    status = paged_extend_attention(
        device, view, table,
        {.q = mem.place(f.q),
         .out = out,
         .maybe_lse = lse,
         .dtype = c.q_dtype,
         .num_q_heads = c.num_q_heads,
         .maybe_k_scale = scales,
         .maybe_v_scale = scales == nullptr ? nullptr : scales + 1,
         .qo_indptr = mem.place(f.qo_indptr),
         .max_query_len = *std::max_element(c.new_tokens.begin(), c.new_tokens.end()),
         .kind = c.kind,
         .window = c.window,
         .maybe_sinks = sinks});
  } else {
    status = paged_decode_attention(device, view, table,
                                    {.q = mem.place(f.q),
                                     .out = out,
                                     .maybe_lse = lse,
                                     .dtype = c.q_dtype,
                                     .num_q_heads = c.num_q_heads,
                                     .maybe_k_scale = scales,
                                     .maybe_v_scale = scales == nullptr ? nullptr : scales + 1,
                                     .max_context_len = f.max_len(),
                                     .total_context_len = total_context_len,
                                     .kind = c.kind,
                                     .window = c.window,
                                     .maybe_sinks = sinks},
                                    options);
  }
  INFO(status.ToString());
  REQUIRE(status.ok());
  return {to_doubles(mem.read(out, f.q.size()), c.q_dtype), mem.read(lse, lse_count)};
}

// Runs `c` on `device` with each split count (decode's; 0: the automatic plan) and checks
// the outputs against the fp64 reference; on CUDA also against the CPU reference run, within
// the dtype's tolerance (bf16: twice the naive bf16 error, at least 2e-3).
inline void check_attention(Device device, const AttentionCase& c,
                            const std::vector<int32_t>& splits, int64_t total_context_len = 0) {
  AttentionFixture f = make_fixture(c);
  const Outputs ref = reference(f);
  const double naive = naive_error(f, ref);
  for (int32_t s : splits) {
    INFO("num_splits " << s);
    const Run run = run_attention(device, f, {.num_splits = s}, total_context_len);
    check_run(f, run, ref, naive);
    if (device == Device::kCuda) {
      const Run cpu = run_attention(Device::kCpu, f, {.num_splits = s});
      INFO("CUDA vs CPU");
      const double tol = c.q_dtype == DType::kBFloat16 ? 2.0 * std::max(naive, 1e-3) : tolerance(c);
      CHECK(max_abs_error(run.out, cpu.out) <= tol);
    }
  }
}

// --- MLA ---------------------------------------------------------------------------------

// A paged latent cache [num_blocks][block_size][kv_lora_rank + rope] (one latent per token,
// num_kv_heads 1), absorbed queries, and the fp64 dense reference:
//   s_t = sm_scale * q . latent_t (all dims),  out = sum_t softmax(s)_t latent_t[0, rank).
struct MlaCase {
  int32_t kv_lora_rank = 512;
  int32_t rope_dim = 64;
  int32_t num_heads = 16;
  int32_t block_size = 64;
  DType q_dtype = DType::kBFloat16;
  DType kv_dtype = DType::kBFloat16;
  std::vector<int32_t> lens = {};
  uint64_t seed = 1;

  int32_t dim() const { return kv_lora_rank + rope_dim; }
  std::string name() const {
    std::string s = std::string("MLA ") + dtype_name(q_dtype) + "/" + dtype_name(kv_dtype) +
                    " rank=" + std::to_string(kv_lora_rank) + " rope=" + std::to_string(rope_dim) +
                    " heads=" + std::to_string(num_heads) + " bs=" + std::to_string(block_size) +
                    " lens=";
    for (size_t i = 0; i < lens.size() && i < 8; ++i) s += std::to_string(lens[i]) + ",";
    if (lens.size() > 8) s += "...(" + std::to_string(lens.size()) + ")";
    return s;
  }
};

struct MlaFixture {
  MlaCase c;
  int32_t num_blocks = 0;
  int32_t max_blocks = 0;
  std::vector<uint8_t> pool;  // the latents, kv dtype
  std::vector<int32_t> table, lens;
  std::vector<uint8_t> q;  // [num_seqs, num_heads, dim], q dtype
  float kv_scale = 1.0f;
  float sm_scale = 0.0f;

  int32_t num_seqs() const { return static_cast<int32_t>(lens.size()); }
  bool fp8() const { return c.kv_dtype == DType::kFloat8E4M3; }
  const float* kv_scale_ptr() const { return fp8() ? &kv_scale : nullptr; }
  int32_t max_len() const { return *std::max_element(lens.begin(), lens.end()); }
  KvCacheView view() {
    return make_kv_cache_view(pool.data(), nullptr, c.kv_dtype, num_blocks, 1, c.block_size,
                              c.dim());
  }
  BlockTableView table_view() const {
    return {table.data(), lens.data(), num_seqs(), max_blocks, c.block_size};
  }
  // Independent address math.
  int64_t index(int32_t seq, int32_t t, int32_t d) const {
    const int64_t block = table[int64_t{seq} * max_blocks + t / c.block_size];
    return (block * c.block_size + t % c.block_size) * c.dim() + d;
  }
  double latent(int32_t seq, int32_t t, int32_t d) const {
    const double raw = load_elem(pool.data(), c.kv_dtype, index(seq, t, d));
    return fp8() ? raw * kv_scale : raw;
  }
  double qv(int32_t seq, int32_t h, int32_t d) const {
    return load_elem(q.data(), c.q_dtype, (int64_t{seq} * c.num_heads + h) * c.dim() + d);
  }
};

inline MlaFixture make_mla_fixture(const MlaCase& c) {
  MlaFixture f;
  f.c = c;
  f.lens = c.lens;
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int32_t n = f.num_seqs();
  int32_t needed = 0;
  int32_t longest = 0;
  for (int32_t len : c.lens) {
    needed += num_blocks_for_tokens(len, c.block_size);
    longest = std::max(longest, num_blocks_for_tokens(len, c.block_size));
  }
  f.num_blocks = std::max(2 * needed, needed + 4);
  f.max_blocks = longest + 1;
  std::vector<int32_t> perm(f.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  f.table.assign(static_cast<size_t>(n) * f.max_blocks, 0);
  int32_t next = 0;
  int32_t pad = 0;
  for (int32_t s = 0; s < n; ++s) {
    const int32_t used = num_blocks_for_tokens(c.lens[s], c.block_size);
    for (int32_t e = 0; e < f.max_blocks; ++e) {
      f.table[int64_t{s} * f.max_blocks + e] =
          e < used ? perm[next++] : perm[needed + (pad++ % (f.num_blocks - needed))];
    }
  }
  if (f.fp8()) f.kv_scale = 0.01f;
  f.sm_scale = 1.0f / std::sqrt(static_cast<float>(c.dim() / 3));  // DeepSeek: 1 / sqrt(192)
  const int64_t elems = int64_t{f.num_blocks} * c.block_size * c.dim();
  f.pool = nan_pool(c.kv_dtype, elems);
  for (int32_t s = 0; s < n; ++s) {
    for (int32_t t = 0; t < c.lens[s]; ++t) {
      for (int32_t d = 0; d < c.dim(); ++d) {
        store_elem(f.pool.data(), c.kv_dtype, f.index(s, t, d), uni(rng) / f.kv_scale);
      }
    }
  }
  const int64_t q_elems = int64_t{n} * c.num_heads * c.dim();
  f.q.resize(q_elems * bytes_per_element(c.q_dtype));
  for (int64_t i = 0; i < q_elems; ++i) store_elem(f.q.data(), c.q_dtype, i, uni(rng));
  return f;
}

// fp64 dense reference, two-pass softmax; with `bf16_naive` the naive bf16 computation
// instead (scores and probabilities rounded to bf16, fp32 sums, output rounded), whose
// error sets the bf16 tolerance.
inline Outputs mla_reference(const MlaFixture& f, bool bf16_naive = false) {
  const MlaCase& c = f.c;
  const int32_t rank = c.kv_lora_rank;
  auto bf = [&](double x) {
    return bf16_naive ? double{to_float(from_float<BFloat16>(static_cast<float>(x)))} : x;
  };
  Outputs r;
  r.out.assign(int64_t{f.num_seqs()} * c.num_heads * rank, 0.0);
  r.lse.assign(int64_t{f.num_seqs()} * c.num_heads, -INFINITY);
  std::vector<double> lat, scores, qh(c.dim());
  for (int32_t s = 0; s < f.num_seqs(); ++s) {
    const int32_t len = f.lens[s];
    lat.resize(static_cast<size_t>(len) * c.dim());
    for (int32_t t = 0; t < len; ++t) {
      for (int32_t d = 0; d < c.dim(); ++d) lat[size_t(t) * c.dim() + d] = f.latent(s, t, d);
    }
    for (int32_t h = 0; h < c.num_heads && len > 0; ++h) {
      for (int32_t d = 0; d < c.dim(); ++d) qh[d] = f.qv(s, h, d);
      scores.assign(len, 0.0);
      double m = -INFINITY;
      for (int32_t t = 0; t < len; ++t) {
        double dot = 0.0;
        for (int32_t d = 0; d < c.dim(); ++d) dot += qh[d] * lat[size_t(t) * c.dim() + d];
        scores[t] = bf(bf(dot) * f.sm_scale);
        m = std::max(m, scores[t]);
      }
      double l = 0.0;
      double* o = &r.out[(int64_t{s} * c.num_heads + h) * rank];
      for (int32_t t = 0; t < len; ++t) {
        const double p = bf(std::exp(scores[t] - m));
        l += p;
        for (int32_t d = 0; d < rank; ++d) o[d] += p * lat[size_t(t) * c.dim() + d];
      }
      for (int32_t d = 0; d < rank; ++d) o[d] = bf(o[d] / l);
      r.lse[int64_t{s} * c.num_heads + h] = m + std::log(l);
    }
  }
  return r;
}

// Absolute tolerance of an MLA run (bf16: twice the naive bf16 error).
inline double mla_tolerance(const MlaFixture& f, const Outputs& ref) {
  if (f.c.kv_dtype == DType::kFloat8E4M3) return 1e-2;
  if (f.c.q_dtype == DType::kFloat16) return 1e-3;
  if (f.c.q_dtype == DType::kBFloat16) {
    return 2.0 * std::max(max_abs_error(mla_reference(f, /*bf16_naive=*/true).out, ref.out), 1e-4);
  }
  return 1e-5;
}

// Checks an MLA run: finite, within tolerance, lse within 1e-4 relative (-inf when empty).
inline void check_mla_run(const MlaFixture& f, const Run& run, const Outputs& ref, double tol) {
  INFO(f.c.name());
  REQUIRE(all_finite(run.out));
  const double err = max_abs_error(run.out, ref.out);
  INFO("error " << err << ", tolerance " << tol);
  CHECK(err <= tol);
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      REQUIRE((std::isinf(run.lse[i]) && run.lse[i] < 0));
    } else {
      REQUIRE(std::abs(run.lse[i] - ref.lse[i]) <= 1e-4 * (1.0 + std::abs(ref.lse[i])));
    }
  }
}

// The latent cache and block table of a fixture where a backend reads them.
inline BackendCache place_cache(BackendMemory& mem, MlaFixture& f) {
  BackendCache placed{f.view(), f.table_view()};
  placed.cache.k = mem.place(f.pool);
  placed.table.block_table = mem.place(f.table);
  placed.table.context_lens = mem.place(f.lens);
  return placed;
}

// The MLA arguments of `f` with the pointers left to the caller.
inline MlaDecodeArgs mla_args(const MlaFixture& f) {
  return {.dtype = f.c.q_dtype,
          .num_heads = f.c.num_heads,
          .kv_lora_rank = f.c.kv_lora_rank,
          .qk_rope_head_dim = f.c.rope_dim,
          .sm_scale = f.sm_scale,
          .max_context_len = f.max_len()};
}

// MLA decode of `f` on `device`: the status, and the outputs when it is OK (outputs start
// as 0xff bytes and lse as 12345).
inline absl::Status try_mla(Device device, MlaFixture& f, int32_t num_splits, Run* run) {
  const MlaCase& c = f.c;
  BackendMemory mem(device);
  const auto [view, table] = place_cache(mem, f);
  const size_t out_bytes = static_cast<size_t>(f.num_seqs()) * c.num_heads * c.kv_lora_rank *
                           bytes_per_element(c.q_dtype);
  const size_t lse_count = static_cast<size_t>(f.num_seqs()) * c.num_heads;
  MlaDecodeArgs args = mla_args(f);
  args.q = mem.place(f.q);
  args.out = mem.filled<uint8_t>(out_bytes, 0xff);
  args.maybe_lse = mem.filled(lse_count, 12345.0f);
  args.maybe_kv_scale = f.fp8() ? mem.place(std::vector<float>{f.kv_scale}) : nullptr;
  const absl::Status status =
      paged_mla_decode(device, view, table, args, {.num_splits = num_splits});
  if (status.ok()) {
    *run = {to_doubles(mem.read(static_cast<const uint8_t*>(args.out), out_bytes), c.q_dtype),
            mem.read(args.maybe_lse, lse_count)};
  }
  return status;
}

inline Run run_mla(Device device, MlaFixture& f, int32_t num_splits) {
  Run run;
  const absl::Status status = try_mla(device, f, num_splits, &run);
  INFO(status.ToString());
  REQUIRE(status.ok());
  return run;
}

// Runs `c` on `device` with each split count (0: the automatic plan) and checks the
// outputs against the fp64 dense reference; on CUDA also against the CPU reference run.
inline void check_mla(Device device, const MlaCase& c, const std::vector<int32_t>& splits) {
  MlaFixture f = make_mla_fixture(c);
  const Outputs ref = mla_reference(f);
  const double tol = mla_tolerance(f, ref);
  for (int32_t s : splits) {
    INFO("num_splits " << s);
    const Run run = run_mla(device, f, s);
    check_mla_run(f, run, ref, tol);
    if (device == Device::kCuda) {
      INFO("CUDA vs CPU");
      CHECK(max_abs_error(run.out, run_mla(Device::kCpu, f, s).out) <= tol);
    }
  }
}

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_ATTENTION_TEST_UTIL_H_
