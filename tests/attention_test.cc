// CPU paged attention (pagedkv/attention.h) against dense references computed
// independently: gathered K/V with our own address math, fp64 accumulation, two-pass
// softmax. Block ids are a random permutation of a pool 3x the needed size; every unused
// slot, unused block and padding entry holds NaN, so any read past a context shows up.
// Windowed layer groups (sliding window, chunked local) and attention sinks are checked the
// same way, with the blocks before each window released (NaN or kPaddingBlock).
#include "pagedkv/attention.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attention_test_util.h"
#include "pagedkv/attention_params.h"
#include "pagedkv/decode_plan.h"
#include "pagedkv/layer_group.h"

namespace pagedkv {
namespace {

using testing::AttentionCase;
using testing::AttentionFixture;
using testing::check_run;
using testing::naive_error;
using testing::Outputs;
using testing::Run;

Run run_decode_cpu(AttentionFixture& f, int32_t num_splits) {
  const AttentionCase& c = f.c;
  std::vector<uint8_t> out(f.q.size(), 0xff);
  std::vector<float> lse(int64_t{f.num_q_rows} * c.num_q_heads, 12345.0f);
  DecodeArgs args{.q = f.q.data(),
                  .out = out.data(),
                  .maybe_lse = lse.data(),
                  .dtype = c.q_dtype,
                  .num_q_heads = c.num_q_heads,
                  .maybe_k_scale = f.k_scale_ptr(),
                  .maybe_v_scale = f.v_scale_ptr(),
                  .kind = c.kind,
                  .window = c.window,
                  .maybe_sinks = f.sinks_ptr()};
  DecodeOptions options{.num_splits = num_splits};
  const absl::Status status =
      paged_decode_attention(Device::kCpu, f.view(), f.table_view(), args, options);
  INFO(status.ToString());
  REQUIRE(status.ok());
  return {testing::to_doubles(out, c.q_dtype), lse};
}

Run run_extend_cpu(AttentionFixture& f) {
  const AttentionCase& c = f.c;
  std::vector<uint8_t> out(f.q.size(), 0xff);
  std::vector<float> lse(int64_t{f.num_q_rows} * c.num_q_heads, 12345.0f);
  ExtendArgs args{.q = f.q.data(),
                  .out = out.data(),
                  .maybe_lse = lse.data(),
                  .dtype = c.q_dtype,
                  .num_q_heads = c.num_q_heads,
                  .maybe_k_scale = f.k_scale_ptr(),
                  .maybe_v_scale = f.v_scale_ptr(),
                  .qo_indptr = f.qo_indptr.data(),
                  .kind = c.kind,
                  .window = c.window,
                  .maybe_sinks = f.sinks_ptr()};
  const absl::Status status = paged_extend_attention(Device::kCpu, f.view(), f.table_view(), args);
  INFO(status.ToString());
  REQUIRE(status.ok());
  return {testing::to_doubles(out, c.q_dtype), lse};
}

void check_decode(const AttentionCase& c, std::initializer_list<int32_t> splits) {
  AttentionFixture f = testing::make_fixture(c);
  const Outputs ref = testing::reference(f);
  const double naive = naive_error(f, ref);
  for (int32_t s : splits) {
    INFO("num_splits " << s);
    check_run(f, run_decode_cpu(f, s), ref, naive);
  }
}

constexpr std::pair<int32_t, int32_t> kHeads[] = {{32, 32}, {32, 8}, {8, 1}, {40, 40}};

TEST_CASE("decode equals dense attention over head_dim x block_size x heads (fp32)",
          "[attention]") {
  uint64_t seed = 1;
  for (int32_t hd : {64, 128, 256}) {
    for (int32_t bs : {8, 16, 32}) {
      for (auto [hq, hkv] : kHeads) {
        AttentionCase c{.head_dim = hd, .block_size = bs, .num_q_heads = hq, .num_kv_heads = hkv};
        // Mixed lengths in one batch of 7, including an empty context.
        c.lens = {1, bs - 1, bs, bs + 1, 97, 0, 33};
        c.seed = seed++;
        check_decode(c, {1, 16});  // off; forced, 16 splits: many of them empty
      }
    }
  }
}

TEST_CASE("decode over 2048-token contexts, split off / forced / auto", "[attention]") {
  check_decode({.head_dim = 128,
                .block_size = 16,
                .num_q_heads = 32,
                .num_kv_heads = 8,
                .lens = {2048},
                .seed = 11},
               {1, 8, 0});
  check_decode({.head_dim = 64,
                .block_size = 32,
                .num_q_heads = 8,
                .num_kv_heads = 1,
                .lens = {2048, 1, 97, 31, 32, 33, 500},
                .seed = 12},
               {1, 5, 0});
}

TEST_CASE("decode over a batch of 37 with empty and mixed contexts", "[attention]") {
  std::mt19937 rng(37);
  AttentionCase c{.head_dim = 64, .block_size = 8, .num_q_heads = 8, .num_kv_heads = 1};
  for (int i = 0; i < 37; ++i) c.lens.push_back(i % 9 == 0 ? 0 : static_cast<int32_t>(rng() % 150));
  c.seed = 13;
  check_decode(c, {1, 4});
}

TEST_CASE("decode in fp16, bf16 and with fp8 KV matches the reference", "[attention]") {
  const std::pair<DType, DType> dtypes[] = {{DType::kFloat16, DType::kFloat16},
                                            {DType::kBFloat16, DType::kBFloat16},
                                            {DType::kFloat32, DType::kFloat8E4M3},
                                            {DType::kFloat16, DType::kFloat8E4M3},
                                            {DType::kBFloat16, DType::kFloat8E4M3}};
  uint64_t seed = 100;
  for (auto [q_dtype, kv_dtype] : dtypes) {
    const int32_t configs[][4] = {{64, 8, 32, 32}, {128, 16, 32, 8}, {256, 32, 8, 1}};
    for (const auto& cfg : configs) {
      AttentionCase c{.head_dim = cfg[0],
                      .block_size = cfg[1],
                      .num_q_heads = cfg[2],
                      .num_kv_heads = cfg[3],
                      .q_dtype = q_dtype,
                      .kv_dtype = kv_dtype};
      c.lens = {1, cfg[1] - 1, cfg[1], cfg[1] + 1, 97, 0, 33};
      c.seed = seed++;
      check_decode(c, {1, 3});
    }
    AttentionCase nhd{.head_dim = 128,
                      .block_size = 16,
                      .num_q_heads = 8,
                      .num_kv_heads = 2,
                      .q_dtype = q_dtype,
                      .kv_dtype = kv_dtype,
                      .layout = KvLayout::kNHD,
                      .lens = {17, 1, 64, 0},
                      .seed = seed++};
    check_decode(nhd, {1, 2});
  }
}

TEST_CASE("extend equals causal dense attention over the paged prefix", "[attention]") {
  const std::pair<DType, DType> dtypes[] = {{DType::kFloat32, DType::kFloat32},
                                            {DType::kBFloat16, DType::kBFloat16},
                                            {DType::kFloat16, DType::kFloat8E4M3}};
  uint64_t seed = 200;
  for (auto [q_dtype, kv_dtype] : dtypes) {
    for (int32_t hd : {64, 128, 256}) {
      AttentionCase c{.head_dim = hd,
                      .block_size = hd == 128 ? 8 : 16,
                      .num_q_heads = 8,
                      .num_kv_heads = 2,
                      .q_dtype = q_dtype,
                      .kv_dtype = kv_dtype};
      // Pure prefill, partial prefix hits, one-token steps and a long prompt (> 64 rows).
      c.lens = {5, 40, 97, 16, 1, 150};
      c.new_tokens = {5, 10, 1, 16, 1, 130};
      c.seed = seed++;
      AttentionFixture f = testing::make_fixture(c);
      const Outputs ref = testing::reference(f);
      check_run(f, run_extend_cpu(f), ref, naive_error(f, ref));
    }
  }
}

TEST_CASE("extend with one new token per sequence equals decode bit for bit", "[attention]") {
  AttentionCase c{.head_dim = 128,
                  .block_size = 16,
                  .num_q_heads = 32,
                  .num_kv_heads = 8,
                  .q_dtype = DType::kBFloat16,
                  .kv_dtype = DType::kBFloat16};
  c.lens = {1, 15, 16, 17, 300};
  c.new_tokens = {1, 1, 1, 1, 1};
  AttentionFixture f = testing::make_fixture(c);
  const Run extend = run_extend_cpu(f);
  const Run decode = run_decode_cpu(f, 1);
  CHECK(extend.out == decode.out);
  CHECK(extend.lse == decode.lse);
}

TEST_CASE("decode plan fills the machine's CTA slots by splitting per-sequence chunks",
          "[attention]") {
  // Batch 1 at 32K, 8 KV heads, 528 slots: 57 splits of 576 tokens (456 CTAs, 86%).
  DecodePlan plan = plan_decode({.num_seqs = 1,
                                 .num_kv_heads = 8,
                                 .max_context_len = 32768,
                                 .block_size = 16,
                                 .num_sms = 132,
                                 .ctas_per_sm = 4});
  CHECK(plan.num_splits == 57);
  CHECK(plan.tokens_per_split == 576);
  // 2048 CTAs already fill 97% of four waves of 528 slots: no split.
  plan = plan_decode({.num_seqs = 256,
                      .num_kv_heads = 8,
                      .max_context_len = 32768,
                      .block_size = 16,
                      .num_sms = 132,
                      .ctas_per_sm = 4});
  CHECK(plan.num_splits == 1);
  // 512 CTAs in 1320 slots: 5 splits give 2560 CTAs, 97% of two waves (no whole-multiple
  // rule: 2 splits would leave 22% of the slots idle).
  plan = plan_decode({.num_seqs = 64,
                      .num_kv_heads = 8,
                      .max_context_len = 8192,
                      .block_size = 16,
                      .num_sms = 132,
                      .ctas_per_sm = 10});
  CHECK(plan.num_splits == 5);
  CHECK(plan.tokens_per_split == 1664);
  // A skewed batch: one 32K sequence among 63 one-token ones splits like batch 1.
  plan = plan_decode({.num_seqs = 64,
                      .num_kv_heads = 8,
                      .max_context_len = 32768,
                      .total_context_len = 32768 + 63,
                      .block_size = 16,
                      .num_sms = 132,
                      .ctas_per_sm = 3});
  CHECK(plan.num_splits == 43);
  CHECK(plan.tokens_per_split == 768);
  plan = plan_decode({.num_seqs = 1,
                      .num_kv_heads = 8,
                      .max_context_len = 300,
                      .block_size = 16,
                      .num_sms = 132,
                      .ctas_per_sm = 4});
  CHECK(plan.num_splits == 1);  // 300 tokens: not worth a split of < 256 tokens
  plan = plan_decode({.num_seqs = 2,
                      .num_kv_heads = 1,
                      .max_context_len = 100,
                      .block_size = 16,
                      .requested_splits = 3});
  CHECK(plan.num_splits == 3);
  CHECK(plan.tokens_per_split == 48);  // 7 blocks over 3 splits -> 3 blocks each
  CHECK(decode_workspace_bytes(plan, 2, 4, 64) == 3 * 2 * 4 * 66 * 4);
  plan = plan_decode({.num_seqs = 2,
                      .num_kv_heads = 1,
                      .max_context_len = 0,
                      .block_size = 16,
                      .requested_splits = 0});
  CHECK(plan.num_splits == 1);
  // On the CPU (one slot) nothing is split.
  plan = plan_decode({.num_seqs = 1, .num_kv_heads = 1, .max_context_len = 65536});
  CHECK(plan.num_splits == 1);
}

// --- windowed layer groups and sinks ------------------------------------------------------

void check_extend(const AttentionCase& c) {
  AttentionFixture f = testing::make_fixture(c);
  const Outputs ref = testing::reference(f);
  check_run(f, run_extend_cpu(f), ref, naive_error(f, ref));
}

TEST_CASE("windowed decode equals dense attention over the window, blocks before it released",
          "[attention]") {
  uint64_t seed = 700;
  for (AttentionKind kind : {AttentionKind::kSlidingWindow, AttentionKind::kChunkedLocal}) {
    for (int32_t bs : {8, 16}) {
      // Smaller than a block, one block, several blocks and not block-aligned, beyond every
      // context.
      for (int32_t window : {bs / 2 + 1, bs, 3 * bs + 5, 5000}) {
        AttentionCase c{.head_dim = 64,
                        .block_size = bs,
                        .num_q_heads = 8,
                        .num_kv_heads = 2,
                        .lens = {0, 1, bs - 1, bs, bs + 1, 97, 300, 33},
                        .seed = seed++,
                        .kind = kind,
                        .window = window};
        check_decode(c, {1, 3, 16});  // a window start inside a split, and empty splits
      }
    }
  }
}

TEST_CASE("windowed decode in every dtype pair, both layouts, with and without sinks",
          "[attention]") {
  const std::pair<DType, DType> dtypes[] = {{DType::kFloat16, DType::kFloat16},
                                            {DType::kBFloat16, DType::kBFloat16},
                                            {DType::kBFloat16, DType::kFloat8E4M3}};
  uint64_t seed = 750;
  for (auto [q_dtype, kv_dtype] : dtypes) {
    for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD}) {
      for (bool sinks : {false, true}) {
        AttentionCase c{
            .head_dim = 128,
            .block_size = 16,
            .num_q_heads = 16,
            .num_kv_heads = 2,
            .q_dtype = q_dtype,
            .kv_dtype = kv_dtype,
            .layout = layout,
            .lens = {500, 7, 129, 0, 64},
            .seed = seed++,
            .kind = sinks ? AttentionKind::kSlidingWindow : AttentionKind::kChunkedLocal,
            .window = 100,
            .sinks = sinks};
        check_decode(c, {1, 4});
      }
    }
  }
}

TEST_CASE(
    "windowed extend: chunk boundaries inside the new tokens, windows below and above "
    "the query tile",
    "[attention]") {
  uint64_t seed = 800;
  for (AttentionKind kind : {AttentionKind::kSlidingWindow, AttentionKind::kChunkedLocal}) {
    for (int32_t window : {5, 16, 24, 100, 1000}) {
      for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        AttentionCase c{.head_dim = 64,
                        .block_size = 16,
                        .num_q_heads = 8,
                        .num_kv_heads = 2,
                        .q_dtype = dtype,
                        .kv_dtype = dtype,
                        // Pure prefill, a prefill chunk after cached tokens crossing chunk
                        // boundaries, one-token steps and a long prompt (> 64 rows).
                        .lens = {40, 97, 150, 16, 1, 300},
                        .new_tokens = {40, 30, 130, 5, 1, 70},
                        .seed = seed++,
                        .kind = kind,
                        .window = window};
        check_extend(c);
      }
    }
  }
}

TEST_CASE("windowed extend with one new token per sequence equals windowed decode bit for bit",
          "[attention]") {
  for (AttentionKind kind : {AttentionKind::kSlidingWindow, AttentionKind::kChunkedLocal}) {
    AttentionCase c{.head_dim = 128,
                    .block_size = 16,
                    .num_q_heads = 32,
                    .num_kv_heads = 8,
                    .q_dtype = DType::kBFloat16,
                    .kv_dtype = DType::kBFloat16,
                    .lens = {1, 15, 16, 17, 300},
                    .new_tokens = {1, 1, 1, 1, 1},
                    .kind = kind,
                    .window = 40,
                    .sinks = true};
    AttentionFixture f = testing::make_fixture(c);
    const Run extend = run_extend_cpu(f);
    const Run decode = run_decode_cpu(f, 1);
    CHECK(extend.out == decode.out);
    CHECK(extend.lse == decode.lse);
  }
}

TEST_CASE("a window at least as long as the context equals full attention bit for bit",
          "[attention]") {
  AttentionCase c{.head_dim = 64,
                  .block_size = 16,
                  .num_q_heads = 8,
                  .num_kv_heads = 2,
                  .lens = {1, 100, 257, 33},
                  .seed = 900};
  AttentionFixture full = testing::make_fixture(c);
  const Run expected = run_decode_cpu(full, 1);
  for (AttentionKind kind : {AttentionKind::kSlidingWindow, AttentionKind::kChunkedLocal}) {
    c.kind = kind;
    c.window = 257;
    AttentionFixture windowed = testing::make_fixture(c);
    CHECK(run_decode_cpu(windowed, 1).out == expected.out);
  }
}

TEST_CASE("sinks join the softmax denominator in decode (split or not) and extend", "[attention]") {
  uint64_t seed = 950;
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    AttentionCase c{.head_dim = 64,
                    .block_size = 8,
                    .num_q_heads = 8,
                    .num_kv_heads = 1,
                    .q_dtype = dtype,
                    .kv_dtype = dtype,
                    .lens = {1, 7, 8, 9, 97, 0, 500},
                    .seed = seed++,
                    .sinks = true};
    check_decode(c, {1, 3, 16});
    c.new_tokens = {1, 7, 3, 9, 50, 0, 70};
    check_extend(c);
  }
  // An empty context with a sink: zeros, and the log-sum-exp is the sink itself.
  AttentionCase c{.head_dim = 64,
                  .block_size = 8,
                  .num_q_heads = 2,
                  .num_kv_heads = 1,
                  .lens = {0},
                  .seed = 960,
                  .sinks = true};
  AttentionFixture f = testing::make_fixture(c);
  const Run run = run_decode_cpu(f, 1);
  CHECK(std::all_of(run.out.begin(), run.out.end(), [](double x) { return x == 0.0; }));
  CHECK(run.lse[0] == f.sinks[0]);
  CHECK(run.lse[1] == f.sinks[1]);
}

TEST_CASE("decode work items read exactly the window, in block-aligned splits", "[attention]") {
  // describe_work() is what both kernels read: every item inside [window start, len), the
  // items of a sequence disjoint and covering it, split boundaries on blocks, and
  // decode_live_splits() counting the splits up to the last non-empty one.
  for (AttentionKind kind :
       {AttentionKind::kFull, AttentionKind::kSlidingWindow, AttentionKind::kChunkedLocal}) {
    for (int32_t window : {1, 5, 16, 40, 1000}) {
      for (int32_t len : {0, 1, 15, 16, 17, 100, 1024, 3001}) {
        for (auto [splits, tokens] : {std::pair{1, 0}, std::pair{4, 64}, std::pair{100, 16}}) {
          AttentionParams p;
          p.kv.block_size = 16;
          p.table.context_lens = &len;
          p.table.num_seqs = 1;
          p.kind = kind;
          p.window = window;
          p.num_splits = splits;
          p.tokens_per_split = tokens;
          const int32_t first =
              len > 0 ? static_cast<int32_t>(first_attended(kind, window, len - 1)) : 0;
          for (int32_t pos = 0; pos < len; pos += 7) {  // the kernels' 32-bit first_attended
            REQUIRE(window_first(p, pos) == first_attended(kind, window, pos));
          }
          INFO(attention_kind_name(kind)
               << " window " << window << " len " << len << " splits " << splits);
          int32_t covered = first;
          int32_t last_live = 0;
          for (int32_t z = 0; z < splits; ++z) {
            const WorkItem w = describe_work(p, 0, z);
            if (w.begin >= w.end) continue;
            CHECK(w.begin == covered);
            CHECK(w.end <= len);
            if (z > 0) CHECK(w.begin % 16 == 0);
            covered = w.end;
            last_live = z;
          }
          CHECK(covered == std::max(len, first));
          if (len > 0) CHECK(decode_live_splits(p, len) == last_live + 1);
        }
      }
    }
  }
}

TEST_CASE("the split plan of a windowed group covers the window, not the context", "[attention]") {
  std::vector<int32_t> lens = {32768};
  std::vector<int32_t> table(2048, 0);
  const KvCacheView view = make_kv_cache_view(nullptr, nullptr, DType::kFloat32, 0, 8, 16, 128);
  const BlockTableView tv{table.data(), lens.data(), 1, 2048, 16};
  DecodeArgs args{.num_q_heads = 8, .max_context_len = 32768};
  // Forced 4 splits of a 32K context: 8192 tokens each; of a 1000-token window: the window
  // plus a block's worth of rounding, 1015 tokens -> 64 blocks -> 16 blocks per split.
  CHECK(plan_decode_for(Device::kCpu, view, tv, args, {.num_splits = 4}).tokens_per_split == 8192);
  args.kind = AttentionKind::kSlidingWindow;
  args.window = 1000;
  CHECK(plan_decode_for(Device::kCpu, view, tv, args, {.num_splits = 4}).tokens_per_split == 256);
  args.kind = AttentionKind::kChunkedLocal;
  args.window = 8192;
  CHECK(plan_decode_for(Device::kCpu, view, tv, args, {.num_splits = 4}).tokens_per_split == 2064);
}

// --- write_kv ---------------------------------------------------------------------------

TEST_CASE("write_kv scatters tokens into their slots and skips negative slots", "[attention]") {
  for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD}) {
    const int32_t num_blocks = 6, hkv = 2, bs = 4, hd = 64;
    std::vector<float> k_pool(num_blocks * hkv * bs * hd, -7.0f), v_pool(k_pool);
    KvCacheView view = make_kv_cache_view(k_pool.data(), v_pool.data(), DType::kFloat32, num_blocks,
                                          hkv, bs, hd, layout);
    const std::vector<int64_t> slots = {5, 23, -1, 0};
    std::vector<float> k(slots.size() * hkv * hd), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<float>(i);
      v[i] = -static_cast<float>(i);
    }
    REQUIRE(write_kv(Device::kCpu, view,
                     {.k = k.data(),
                      .v = v.data(),
                      .src_dtype = DType::kFloat32,
                      .slot_mapping = slots.data(),
                      .num_tokens = 4})
                .ok());
    int written = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
      for (int32_t h = 0; h < hkv; ++h) {
        for (int32_t d = 0; d < hd; ++d) {
          const float expect_k = k[(i * hkv + h) * hd + d];
          if (slots[i] < 0) continue;
          const int64_t at = slot_offset(view, slots[i], h) + d;
          CHECK(k_pool[at] == expect_k);
          CHECK(v_pool[at] == -expect_k);
          ++written;
        }
      }
    }
    CHECK(written == 3 * hkv * hd);
    CHECK(std::count(k_pool.begin(), k_pool.end(), -7.0f) ==
          static_cast<long>(k_pool.size()) - written);
  }
}

TEST_CASE("write_kv quantizes into an fp8 cache with the scale", "[attention]") {
  const int32_t hd = 64;
  std::vector<uint8_t> k_pool(2 * 8 * hd), v_pool(k_pool.size());
  KvCacheView view =
      make_kv_cache_view(k_pool.data(), v_pool.data(), DType::kFloat8E4M3, 2, 1, 8, hd);
  std::vector<BFloat16> k(hd), v(hd);
  for (int32_t d = 0; d < hd; ++d) {
    k[d] = from_float<BFloat16>(0.01f * d - 0.3f);
    v[d] = from_float<BFloat16>(100.0f * d);  // saturates above 448 * scale
  }
  const int64_t slot = 11;
  const float k_scale = 0.005f, v_scale = 2.0f;
  REQUIRE(write_kv(Device::kCpu, view,
                   {.k = k.data(),
                    .v = v.data(),
                    .src_dtype = DType::kBFloat16,
                    .slot_mapping = &slot,
                    .num_tokens = 1,
                    .maybe_k_scale = &k_scale,
                    .maybe_v_scale = &v_scale})
              .ok());
  for (int32_t d = 0; d < hd; ++d) {
    const int64_t at = slot_offset(view, slot, 0) + d;
    CHECK(k_pool[at] == from_float<Fp8E4M3>(to_float(k[d]) * (1.0f / k_scale)).bits);
    CHECK(v_pool[at] == from_float<Fp8E4M3>(to_float(v[d]) * (1.0f / v_scale)).bits);
  }
  CHECK(to_float(Fp8E4M3{v_pool[slot_offset(view, slot, 0) + hd - 1]}) == 448.0f);
}

// --- errors ----------------------------------------------------------------------------

TEST_CASE("invalid arguments are refused with the value and the limit", "[attention]") {
  AttentionCase c{
      .head_dim = 64, .block_size = 8, .num_q_heads = 4, .num_kv_heads = 2, .lens = {9, 3}};
  AttentionFixture f = testing::make_fixture(c);
  std::vector<uint8_t> out(f.q.size());
  DecodeArgs args{.q = f.q.data(), .out = out.data(), .dtype = DType::kFloat32, .num_q_heads = 4};
  auto expect = [&](const absl::Status& s, const std::string& fragment) {
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(fragment) != std::string::npos);
  };

  KvCacheView view = f.view();
  view.head_dim = 96;
  view = make_kv_cache_view(view.k, view.v, view.dtype, view.num_blocks, 2, 8, 96);
  expect(paged_decode_attention(Device::kCpu, view, f.table_view(), args), "head_dim 96");

  DecodeArgs bad_heads = args;
  bad_heads.num_q_heads = 3;
  expect(paged_decode_attention(Device::kCpu, f.view(), f.table_view(), bad_heads),
         "num_q_heads 3 must be a positive multiple of num_kv_heads 2");

  DecodeArgs bad_dtype = args;
  bad_dtype.dtype = DType::kFloat16;
  expect(paged_decode_attention(Device::kCpu, f.view(), f.table_view(), bad_dtype),
         "cache dtype fp32 must be the q dtype (fp16) or fp8_e4m3");

  std::vector<int32_t> table = f.table;
  table[1] = f.num_blocks;  // entry 1 of sequence 0 is read (9 tokens = 2 blocks)
  BlockTableView tv = f.table_view();
  tv.block_table = table.data();
  expect(paged_decode_attention(Device::kCpu, f.view(), tv, args),
         "sequence 0: block table entry 1 is " + std::to_string(f.num_blocks));

  std::vector<int32_t> lens = {9, 1000};
  tv = f.table_view();
  tv.context_lens = lens.data();
  expect(paged_decode_attention(Device::kCpu, f.view(), tv, args),
         "sequence 1: context length 1000 outside [0, max_blocks");

  const int64_t slot = int64_t{f.num_blocks} * 8;
  expect(write_kv(Device::kCpu, f.view(),
                  {.k = f.q.data(), .v = f.q.data(), .slot_mapping = &slot, .num_tokens = 1}),
         "token 0: slot " + std::to_string(slot) + " is at or beyond num_blocks");

  std::vector<int32_t> indptr = {0, 10, 11};  // 10 new tokens but a context of 9
  ExtendArgs ext{.q = f.q.data(),
                 .out = out.data(),
                 .dtype = DType::kFloat32,
                 .num_q_heads = 4,
                 .qo_indptr = indptr.data()};
  expect(paged_extend_attention(Device::kCpu, f.view(), f.table_view(), ext),
         "sequence 0: 10 new tokens, must be in [0, context length 9]");

  DecodeArgs no_window = args;
  no_window.kind = AttentionKind::kSlidingWindow;
  expect(paged_decode_attention(Device::kCpu, f.view(), f.table_view(), no_window),
         "window 0 of a sliding_window group must be > 0 tokens");
  DecodeArgs bad_kind = args;
  bad_kind.kind = static_cast<AttentionKind>(7);
  expect(paged_decode_attention(Device::kCpu, f.view(), f.table_view(), bad_kind),
         "attention kind 7 is not full (0), sliding_window (1) or chunked_local (2)");
  const std::vector<float> sinks = {0.5f, NAN, 1.0f, 2.0f};
  DecodeArgs bad_sink = args;
  bad_sink.maybe_sinks = sinks.data();
  expect(paged_decode_attention(Device::kCpu, f.view(), f.table_view(), bad_sink),
         "sink logit of head 1 is nan");

  // Entries before a window are never read, so they are not checked either; entries in it
  // are.
  table = f.table;
  table[0] = -7;  // sequence 0 (9 tokens): its window of 1 token starts in entry 1
  tv = f.table_view();
  tv.block_table = table.data();
  DecodeArgs windowed = args;
  windowed.kind = AttentionKind::kSlidingWindow;
  windowed.window = 1;
  CHECK(paged_decode_attention(Device::kCpu, f.view(), tv, windowed).ok());
  windowed.window = 2;  // tokens 7 and 8: entries 0 and 1
  expect(paged_decode_attention(Device::kCpu, f.view(), tv, windowed),
         "sequence 0: block table entry 0 is -7");

  if (!cuda_device_available()) {
    const absl::Status s = paged_decode_attention(Device::kCuda, f.view(), f.table_view(), args);
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(s.message().find("no usable CUDA device") != std::string::npos);
  }
}

}  // namespace
}  // namespace pagedkv
