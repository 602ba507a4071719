// Paged GQA attention (pagedkv/attention.h: write_kv, decode, extend) on each backend
// (support/backends.h): every BACKEND_TEST_CASE runs on the CPU reference, and on CUDA where
// a device is usable. Outputs are checked against dense references computed independently
// (gathered K/V with our own address math, fp64 accumulation, two-pass softmax), and CUDA's
// against the CPU run too. Block ids are a random permutation of a pool 3x the needed
// size; every unused slot, unused block and padding entry holds NaN, so any read past a
// context shows up. Windowed layer groups (sliding window, chunked local) and attention
// sinks are checked the same way, with the blocks before each window released (NaN or
// kPaddingBlock).
//
// Where a case runs more shapes on CUDA, they pick CUDA kernel instances and CTA shapes
// (dtype pairs, GQA groups, query tiles) or split plans (32K contexts); the CPU reference
// takes every shape through one template path, and a few keep the CPU suite fast. Plain
// TEST_CASEs check the host-side plan and bit-for-bit properties of the CPU reference;
// CUDA-only behaviour (caller workspaces, CUDA graphs) is in kernels_cuda_test.cc.
#include "pagedkv/attention.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention_test_util.h"
#include "pagedkv/attention_params.h"
#include "pagedkv/decode_plan.h"
#include "pagedkv/layer_group.h"
#include "support/backends.h"

namespace pagedkv {
namespace {

using testing::AttentionCase;
using testing::AttentionFixture;
using testing::BackendMemory;
using testing::check_attention;
using testing::Run;
using testing::run_attention;

constexpr std::pair<int32_t, int32_t> kHeads[] = {{32, 32}, {32, 8}, {8, 1}, {40, 40}};

// Dtype pairs (q, KV) beyond fp32.
constexpr std::pair<DType, DType> kLowPrecision[] = {{DType::kFloat16, DType::kFloat16},
                                                     {DType::kBFloat16, DType::kBFloat16},
                                                     {DType::kFloat32, DType::kFloat8E4M3},
                                                     {DType::kFloat16, DType::kFloat8E4M3},
                                                     {DType::kBFloat16, DType::kFloat8E4M3}};

// Every dtype pair the kernels take.
constexpr std::pair<DType, DType> kAllDtypes[] = {
    {DType::kFloat32, DType::kFloat32},    {DType::kFloat16, DType::kFloat16},
    {DType::kBFloat16, DType::kBFloat16},  {DType::kFloat32, DType::kFloat8E4M3},
    {DType::kFloat16, DType::kFloat8E4M3}, {DType::kBFloat16, DType::kFloat8E4M3}};

// The same fixture run as decode: one query per sequence, its last token.
AttentionFixture as_decode(AttentionFixture f) {
  f.c.new_tokens.clear();
  return f;
}

// --- decode and extend ------------------------------------------------------------------

BACKEND_TEST_CASE("decode equals dense attention over head_dim x block_size x heads (fp32)",
                  "[attention]") {
  uint64_t seed = 1;
  for (int32_t hd : {64, 128, 256}) {
    for (int32_t bs : {8, 16, 32}) {
      for (auto [hq, hkv] : kHeads) {
        AttentionCase c{.head_dim = hd, .block_size = bs, .num_q_heads = hq, .num_kv_heads = hkv};
        // Mixed lengths in one batch of 7, including an empty context.
        c.lens = {1, bs - 1, bs, bs + 1, 97, 0, 33};
        c.seed = seed++;
        check_attention(device, c, {1, 16, 0});  // off; forced 16 (many empty); automatic
      }
    }
  }
}

BACKEND_TEST_CASE("decode over 2048-token contexts, split off / forced / auto", "[attention]") {
  check_attention(device,
                  {.head_dim = 128,
                   .block_size = 16,
                   .num_q_heads = 32,
                   .num_kv_heads = 8,
                   .lens = {2048},
                   .seed = 11},
                  {1, 8, 0});
  check_attention(device,
                  {.head_dim = 64,
                   .block_size = 32,
                   .num_q_heads = 8,
                   .num_kv_heads = 1,
                   .lens = {2048, 1, 97, 31, 32, 33, 500},
                   .seed = 12},
                  {1, 5, 0});
}

BACKEND_TEST_CASE("decode over a batch of 37 with empty and mixed contexts", "[attention]") {
  for (auto [dtype, hd, longest] :
       {std::tuple{DType::kFloat32, 64, 150}, std::tuple{DType::kBFloat16, 256, 400}}) {
    AttentionCase c{.head_dim = hd,
                    .block_size = 8,
                    .num_q_heads = 8,
                    .num_kv_heads = 1,
                    .q_dtype = dtype,
                    .kv_dtype = dtype,
                    .seed = 13};
    std::mt19937 rng(37);
    for (int i = 0; i < 37; ++i) {
      c.lens.push_back(i % 9 == 0 ? 0 : static_cast<int32_t>(rng() % longest));
    }
    check_attention(device, c, {1, 4, 0});
  }
}

BACKEND_TEST_CASE("decode in fp16, bf16 and with fp8 KV matches the reference", "[attention]") {
  uint64_t seed = 100;
  for (auto [q_dtype, kv_dtype] : kLowPrecision) {
    for (int32_t hd : {64, 128, 256}) {
      for (int32_t bs : {8, 16, 32}) {
        for (auto [hq, hkv] : kHeads) {
          // CUDA: every kernel instance of the pair at every block size and head count; the
          // CPU: three corners.
          const bool corner = (hd == 64 && bs == 8 && hq == 32 && hkv == 32) ||
                              (hd == 128 && bs == 16 && hq == 32 && hkv == 8) ||
                              (hd == 256 && bs == 32 && hq == 8 && hkv == 1);
          if (device == Device::kCpu && !corner) continue;
          AttentionCase c{.head_dim = hd,
                          .block_size = bs,
                          .num_q_heads = hq,
                          .num_kv_heads = hkv,
                          .q_dtype = q_dtype,
                          .kv_dtype = kv_dtype};
          c.lens = {1, bs - 1, bs, bs + 1, 97, 0, 33};
          c.seed = seed++;
          check_attention(device, c, {1, 3});
        }
      }
    }
    check_attention(device,
                    {.head_dim = 128,
                     .block_size = 16,
                     .num_q_heads = 8,
                     .num_kv_heads = 2,
                     .q_dtype = q_dtype,
                     .kv_dtype = kv_dtype,
                     .layout = KvLayout::kNHD,
                     .lens = {17, 1, 64, 0, 700},
                     .seed = seed++},
                    {1, 2, 0});
  }
}

BACKEND_TEST_CASE("extend equals causal dense attention over the paged prefix", "[attention]") {
  const std::pair<DType, DType> dtypes[] = {{DType::kFloat32, DType::kFloat32},
                                            {DType::kBFloat16, DType::kBFloat16},
                                            {DType::kFloat16, DType::kFloat8E4M3}};
  // CUDA: groups of 4, 1 and 8, whose query tiles differ; the CPU: groups of 4.
  const std::vector<std::pair<int32_t, int32_t>> heads =
      device == Device::kCuda ? std::vector<std::pair<int32_t, int32_t>>{{8, 2}, {32, 32}, {8, 1}}
                              : std::vector<std::pair<int32_t, int32_t>>{{8, 2}};
  uint64_t seed = 200;
  for (auto [q_dtype, kv_dtype] : dtypes) {
    for (int32_t hd : {64, 128, 256}) {
      for (auto [hq, hkv] : heads) {
        AttentionCase c{.head_dim = hd,
                        .block_size = hd == 128 ? 8 : 16,
                        .num_q_heads = hq,
                        .num_kv_heads = hkv,
                        .q_dtype = q_dtype,
                        .kv_dtype = kv_dtype};
        // Pure prefill, partial prefix hits, one-token steps and a long prompt (> 64 rows).
        c.lens = {5, 40, 97, 16, 1, 150};
        c.new_tokens = {5, 10, 1, 16, 1, 130};
        c.seed = seed++;
        check_attention(device, c, {1});
      }
    }
  }
}

BACKEND_TEST_CASE("decode serves every GQA group (1-16 in one row tile, wide groups)",
                  "[attention]") {
  // On CUDA groups up to 16 take one 16-row CTA tile, 17-64 the 64-row shape, 71 two row
  // chunks: every group and head_dim. The CPU: one group of each shape, head_dim 64.
  const std::vector<int32_t> groups =
      device == Device::kCuda ? std::vector<int32_t>{1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                                                     12, 13, 14, 15, 16, 17, 24, 32, 64, 71}
                              : std::vector<int32_t>{5, 24, 71};
  const std::vector<int32_t> head_dims =
      device == Device::kCuda ? std::vector<int32_t>{64, 128, 256} : std::vector<int32_t>{64};
  const std::pair<DType, DType> dtypes[] = {{DType::kBFloat16, DType::kBFloat16},
                                            {DType::kFloat16, DType::kFloat8E4M3},
                                            {DType::kFloat32, DType::kFloat32}};
  uint64_t seed = 300;
  for (auto [q_dtype, kv_dtype] : dtypes) {
    for (int32_t group : groups) {
      for (int32_t hd : head_dims) {
        AttentionCase c{.head_dim = hd,
                        .block_size = 16,
                        .num_q_heads = 2 * group,
                        .num_kv_heads = 2,
                        .q_dtype = q_dtype,
                        .kv_dtype = kv_dtype};
        c.lens = {1, 15, 16, 17, 300, 0, 1000};
        c.seed = seed++;
        check_attention(device, c, {1, 0});
      }
    }
  }
}

BACKEND_TEST_CASE("decode with every forced split count of a sequence", "[attention]") {
  // 1024 tokens in blocks of 16 = 64 blocks: split counts 1..64 give splits of 1..64 blocks,
  // and counts past 64 (200, 1000) leave most splits empty.
  std::vector<int32_t> splits;
  for (int32_t s = 1; s <= 64; ++s) splits.push_back(s);
  splits.push_back(200);
  splits.push_back(1000);
  check_attention(device,
                  {.head_dim = 128,
                   .block_size = 16,
                   .num_q_heads = 16,
                   .num_kv_heads = 2,
                   .q_dtype = DType::kBFloat16,
                   .kv_dtype = DType::kBFloat16,
                   .lens = {1024, 1, 700, 0, 64},
                   .seed = 400},
                  splits);
}

BACKEND_TEST_CASE("decode of skewed batches mixing 1-token and long sequences", "[attention]") {
  // CUDA's automatic plan splits the long sequences (32K, as served) by the batch's real
  // total, and as if uniform without it. The CPU never splits: 1K sequences give it the
  // same batch shape.
  const int32_t long_len = device == Device::kCuda ? 32768 : 1024;
  for (auto [q_dtype, kv_dtype] : {std::pair{DType::kBFloat16, DType::kBFloat16},
                                   std::pair{DType::kBFloat16, DType::kFloat8E4M3}}) {
    AttentionCase c{.head_dim = 128,
                    .block_size = 16,
                    .num_q_heads = 32,
                    .num_kv_heads = 8,
                    .q_dtype = q_dtype,
                    .kv_dtype = kv_dtype,
                    .lens = {1, long_len, 1, 1, 7, 1, long_len, 1},
                    .seed = 500};
    int64_t total = 0;
    for (int32_t len : c.lens) total += len;
    check_attention(device, c, {0}, total);  // automatic plan with the batch's real total
    check_attention(device, c, {0, 1});      // without the hint, and not split
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
  const Run extend = run_attention(Device::kCpu, f);
  AttentionFixture decode_fixture = as_decode(f);
  const Run decode = run_attention(Device::kCpu, decode_fixture);
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

BACKEND_TEST_CASE(
    "windowed decode equals dense attention over the window, blocks before it released",
    "[attention]") {
  // CUDA also: each dtype pair with groups 4, 8 and 20 (both CTA shapes), sinks in every
  // other case.
  const std::pair<DType, DType> cuda_dtypes[] = {{DType::kBFloat16, DType::kBFloat16},
                                                 {DType::kBFloat16, DType::kFloat8E4M3},
                                                 {DType::kFloat16, DType::kFloat8E4M3},
                                                 {DType::kFloat32, DType::kFloat32}};
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
        check_attention(device, c, {1, 3, 16, 0});  // window starts inside splits, empty ones
        if (device != Device::kCuda) continue;
        for (auto [q_dtype, kv_dtype] : cuda_dtypes) {
          for (auto [hq, hkv] : {std::pair{32, 8}, std::pair{8, 1}, std::pair{40, 2}}) {
            c = {.head_dim = 128,
                 .block_size = bs,
                 .num_q_heads = hq,
                 .num_kv_heads = hkv,
                 .q_dtype = q_dtype,
                 .kv_dtype = kv_dtype,
                 .lens = {1, bs - 1, bs, bs + 1, 97, 0, 700, 33},
                 .seed = seed++,
                 .kind = kind,
                 .window = window,
                 .sinks = seed % 2 == 0};
            check_attention(device, c, {1, 3, 16, 0});
          }
        }
      }
    }
  }
}

BACKEND_TEST_CASE(
    "windowed decode in every head_dim, dtype pair and layout, with and without sinks",
    "[attention]") {
  const std::pair<DType, DType> dtypes[] = {{DType::kFloat16, DType::kFloat16},
                                            {DType::kBFloat16, DType::kBFloat16},
                                            {DType::kBFloat16, DType::kFloat8E4M3}};
  uint64_t seed = 750;
  for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD}) {
    for (auto [q_dtype, kv_dtype] : dtypes) {
      for (bool sinks : {false, true}) {
        check_attention(
            device,
            {.head_dim = 128,
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
             .sinks = sinks},
            {1, 4});
      }
    }
    for (int32_t hd : {64, 128, 256}) {
      for (AttentionKind kind : {AttentionKind::kSlidingWindow, AttentionKind::kChunkedLocal}) {
        check_attention(device,
                        {.head_dim = hd,
                         .block_size = 16,
                         .num_q_heads = 16,
                         .num_kv_heads = 2,
                         .q_dtype = DType::kBFloat16,
                         .kv_dtype = DType::kBFloat16,
                         .layout = layout,
                         .lens = {4000, 1, 129, 0, 1025},
                         .seed = seed++,
                         .kind = kind,
                         .window = 1000,
                         .sinks = true},
                        {1, 5, 0});
      }
    }
  }
}

BACKEND_TEST_CASE("windowed decode of a skewed batch splits the window, not the context",
                  "[attention]") {
  // One long sequence among short ones with a 4K sliding window: CUDA's automatic plan
  // splits the window of its 32K context. The CPU never splits: a 6K context gives it the
  // same released blocks before the window.
  const int32_t long_len = device == Device::kCuda ? 32768 : 6144;
  AttentionCase c{.head_dim = 128,
                  .block_size = 16,
                  .num_q_heads = 32,
                  .num_kv_heads = 8,
                  .q_dtype = DType::kBFloat16,
                  .kv_dtype = DType::kFloat8E4M3,
                  .lens = {1, long_len, 7, 4097},
                  .seed = 1150,
                  .kind = AttentionKind::kSlidingWindow,
                  .window = 4096};
  int64_t total = 0;
  for (int32_t len : c.lens) total += len;
  check_attention(device, c, {0}, total);
}

BACKEND_TEST_CASE(
    "windowed extend: chunk boundaries inside the new tokens, windows below and above "
    "the query tile",
    "[attention]") {
  // CUDA also: head_dim 128 in fp32, bf16 and fp16 with fp8 KV, with groups of 4, 1 and 8
  // (their query tiles differ), sinks with the 24-token window.
  const std::pair<DType, DType> cuda_dtypes[] = {{DType::kFloat32, DType::kFloat32},
                                                 {DType::kBFloat16, DType::kBFloat16},
                                                 {DType::kFloat16, DType::kFloat8E4M3}};
  // Pure prefill, a prefill chunk after cached tokens crossing chunk boundaries, one-token
  // steps and a long prompt (> 64 rows).
  const std::vector<int32_t> lens = {40, 97, 150, 16, 1, 300};
  const std::vector<int32_t> new_tokens = {40, 30, 130, 5, 1, 70};
  uint64_t seed = 800;
  for (AttentionKind kind : {AttentionKind::kSlidingWindow, AttentionKind::kChunkedLocal}) {
    for (int32_t window : {5, 16, 24, 100, 1000}) {
      for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        check_attention(device,
                        {.head_dim = 64,
                         .block_size = 16,
                         .num_q_heads = 8,
                         .num_kv_heads = 2,
                         .q_dtype = dtype,
                         .kv_dtype = dtype,
                         .lens = lens,
                         .new_tokens = new_tokens,
                         .seed = seed++,
                         .kind = kind,
                         .window = window},
                        {1});
      }
      if (device != Device::kCuda) continue;
      for (auto [q_dtype, kv_dtype] : cuda_dtypes) {
        for (auto [hq, hkv] : {std::pair{8, 2}, std::pair{32, 32}, std::pair{8, 1}}) {
          check_attention(device,
                          {.head_dim = 128,
                           .block_size = 16,
                           .num_q_heads = hq,
                           .num_kv_heads = hkv,
                           .q_dtype = q_dtype,
                           .kv_dtype = kv_dtype,
                           .lens = lens,
                           .new_tokens = new_tokens,
                           .seed = seed++,
                           .kind = kind,
                           .window = window,
                           .sinks = window == 24},
                          {1});
        }
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
    const Run extend = run_attention(Device::kCpu, f);
    AttentionFixture decode_fixture = as_decode(f);
    const Run decode = run_attention(Device::kCpu, decode_fixture);
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
  const Run expected = run_attention(Device::kCpu, full);
  for (AttentionKind kind : {AttentionKind::kSlidingWindow, AttentionKind::kChunkedLocal}) {
    c.kind = kind;
    c.window = 257;
    AttentionFixture windowed = testing::make_fixture(c);
    CHECK(run_attention(Device::kCpu, windowed).out == expected.out);
  }
}

BACKEND_TEST_CASE("sinks join the softmax denominator in decode (split or not) and extend",
                  "[attention]") {
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
    check_attention(device, c, {1, 3, 16});
    c.new_tokens = {1, 7, 3, 9, 50, 0, 70};
    check_attention(device, c, {1});
  }
  // CUDA also: every head_dim with 64 query heads in groups of 8, and fp8 KV.
  for (auto [q_dtype, kv_dtype] : {std::pair{DType::kBFloat16, DType::kBFloat16},
                                   std::pair{DType::kFloat16, DType::kFloat8E4M3},
                                   std::pair{DType::kFloat32, DType::kFloat32}}) {
    for (int32_t hd : {64, 128, 256}) {
      if (device != Device::kCuda) continue;
      AttentionCase c{.head_dim = hd,
                      .block_size = 16,
                      .num_q_heads = 64,
                      .num_kv_heads = 8,
                      .q_dtype = q_dtype,
                      .kv_dtype = kv_dtype,
                      .lens = {1, 15, 16, 17, 300, 0, 1000},
                      .seed = seed++,
                      .sinks = true};
      check_attention(device, c, {1, 4, 0});
      c.new_tokens = {1, 15, 3, 17, 70, 0, 100};
      check_attention(device, c, {1});
    }
  }
  // An empty context with a sink: zeros, and the log-sum-exp is the sink itself (on the
  // CPU exactly; CUDA computes it in base 2, within the lse tolerance).
  AttentionCase c{.head_dim = 64,
                  .block_size = 8,
                  .num_q_heads = 2,
                  .num_kv_heads = 1,
                  .lens = {0},
                  .seed = 960,
                  .sinks = true};
  AttentionFixture f = testing::make_fixture(c);
  const Run run = run_attention(device, f);
  CHECK(std::all_of(run.out.begin(), run.out.end(), [](double x) { return x == 0.0; }));
  for (int32_t h = 0; h < 2; ++h) {
    if (device == Device::kCpu) {
      CHECK(run.lse[h] == f.sinks[h]);
    } else {
      CHECK(std::abs(run.lse[h] - f.sinks[h]) <= 1e-4 * (1.0 + std::abs(f.sinks[h])));
    }
  }
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

// --- every kernel variant on small shapes -------------------------------------------------

// Small enough for compute-sanitizer (scripts/gpu-run.sh runs these under memcheck,
// racecheck and initcheck on a GPU).
BACKEND_TEST_CASE("every kernel variant on small shapes (the compute-sanitizer set)",
                  "[attention][sanitize]") {
  // Each q/KV dtype pair and head_dim, 16- and 64-row CTA shapes (groups 3, 24), a row
  // chunk past the last (group 71), decode with and without splits, and extend.
  uint64_t seed = 600;
  for (auto [q_dtype, kv_dtype] : kAllDtypes) {
    for (int32_t hd : {64, 128, 256}) {
      for (int32_t group : {3, 24, 71}) {
        AttentionCase c{.head_dim = hd,
                        .block_size = 8,
                        .num_q_heads = group,
                        .num_kv_heads = 1,
                        .q_dtype = q_dtype,
                        .kv_dtype = kv_dtype,
                        .lens = {70, 0, 9},
                        .seed = seed++};
        check_attention(device, c, {1, 3});
        c.new_tokens = {6, 0, 9};
        check_attention(device, c, {1});
      }
    }
  }
}

BACKEND_TEST_CASE("windowed and sink variants on small shapes (the compute-sanitizer set)",
                  "[attention][sanitize]") {
  // The windowed kernel of each dtype pair and head_dim in both CTA shapes, decode split and
  // not and extend, with sinks.
  uint64_t seed = 1600;
  for (auto [q_dtype, kv_dtype] : kAllDtypes) {
    for (int32_t hd : {64, 128, 256}) {
      for (int32_t group : {3, 24}) {
        AttentionCase c{
            .head_dim = hd,
            .block_size = 8,
            .num_q_heads = group,
            .num_kv_heads = 1,
            .q_dtype = q_dtype,
            .kv_dtype = kv_dtype,
            .lens = {150, 0, 9},
            .seed = seed++,
            .kind = group == 3 ? AttentionKind::kSlidingWindow : AttentionKind::kChunkedLocal,
            .window = 20,
            .sinks = true};
        check_attention(device, c, {1, 3});
        c.new_tokens = {70, 0, 9};
        check_attention(device, c, {1});
      }
    }
  }
}

// --- write_kv ---------------------------------------------------------------------------

BACKEND_TEST_CASE("write_kv scatters tokens into their slots, converting, and skips negative slots",
                  "[attention]") {
  const int32_t blocks = 5, hkv = 2, bs = 16, hd = 128, n = 37;
  // Slots: distinct, the first and the last of the pool among them, every 7th token -1.
  std::vector<int64_t> slots(n);
  for (int32_t i = 0; i < n; ++i) slots[i] = i % 7 == 3 ? -1 : (i * 13) % (blocks * bs);
  slots[n - 1] = blocks * bs - 1;
  // fp8: V's scale saturates values above 4.48 to +-448.
  const std::vector<float> scales = {0.05f, 0.01f};
  for (DType src_dtype : {DType::kFloat32, DType::kBFloat16}) {
    std::mt19937 rng(9);
    std::vector<uint8_t> k(size_t{n} * hkv * hd * bytes_per_element(src_dtype)), v(k.size());
    for (int64_t i = 0; i < int64_t{n} * hkv * hd; ++i) {
      testing::store_elem(k.data(), src_dtype, i, static_cast<float>(rng() % 2000) / 100 - 10);
      testing::store_elem(v.data(), src_dtype, i, static_cast<float>(rng() % 2000) / 100 - 10);
    }
    for (DType cache : {DType::kFloat32, DType::kBFloat16, DType::kFloat8E4M3}) {
      for (auto [layout, k_only] :
           {std::pair{KvLayout::kHND, false}, std::pair{KvLayout::kNHD, false},
            std::pair{KvLayout::kNHD, true}}) {
        INFO(dtype_name(src_dtype)
             << " into " << dtype_name(cache) << (layout == KvLayout::kHND ? " HND" : " NHD")
             << (k_only ? ", K only (MLA)" : ""));
        const bool fp8 = cache == DType::kFloat8E4M3;
        const int64_t pool_bytes = int64_t{blocks} * hkv * bs * hd * bytes_per_element(cache);
        std::vector<uint8_t> k_pool(pool_bytes, 0x11), v_pool(pool_bytes, 0x22);
        // Expected pools: each written element converted (fp8: divided by the scale and
        // saturated) at its slot's address; everything else keeps its fill.
        std::vector<uint8_t> k_expect = k_pool, v_expect = v_pool;
        const KvCacheView host_view =
            make_kv_cache_view(nullptr, nullptr, cache, blocks, hkv, bs, hd, layout);
        int saturated = 0;
        for (int32_t i = 0; i < n; ++i) {
          if (slots[i] < 0) continue;
          for (int32_t h = 0; h < hkv; ++h) {
            for (int32_t d = 0; d < hd; ++d) {
              const int64_t src = (int64_t{i} * hkv + h) * hd + d;
              const int64_t at = slot_offset(host_view, slots[i], h) + d;
              const float k_x = testing::load_elem(k.data(), src_dtype, src);
              const float v_x = testing::load_elem(v.data(), src_dtype, src);
              testing::store_elem(k_expect.data(), cache, at, fp8 ? k_x * (1.0f / scales[0]) : k_x);
              if (k_only) continue;
              testing::store_elem(v_expect.data(), cache, at, fp8 ? v_x * (1.0f / scales[1]) : v_x);
              saturated += fp8 && std::abs(testing::load_elem(v_expect.data(), cache, at)) == 448;
            }
          }
        }
        if (fp8 && !k_only) CHECK(saturated > 0);
        BackendMemory mem(device);
        uint8_t* v_pool_at = mem.place(v_pool);  // left alone when K only
        const KvCacheView view = make_kv_cache_view(mem.place(k_pool), k_only ? nullptr : v_pool_at,
                                                    cache, blocks, hkv, bs, hd, layout);
        const float* scale = fp8 ? mem.place(scales) : nullptr;
        const absl::Status status =
            write_kv(device, view,
                     {.k = mem.place(k),
                      .v = k_only ? nullptr : mem.place(v),
                      .src_dtype = src_dtype,
                      .slot_mapping = mem.place(slots),
                      .num_tokens = n,
                      .maybe_k_scale = scale,
                      .maybe_v_scale = scale == nullptr ? nullptr : scale + 1});
        INFO(status.ToString());
        REQUIRE(status.ok());
        CHECK(mem.read(static_cast<const uint8_t*>(view.k), k_pool.size()) == k_expect);
        CHECK(mem.read(v_pool_at, v_pool.size()) == v_expect);
      }
    }
  }
}

// --- errors ----------------------------------------------------------------------------

BACKEND_TEST_CASE("invalid arguments are refused with the value and the limit", "[attention]") {
  AttentionCase c{
      .head_dim = 64, .block_size = 8, .num_q_heads = 4, .num_kv_heads = 2, .lens = {9, 3}};
  AttentionFixture f = testing::make_fixture(c);
  BackendMemory mem(device);
  const auto [cache, table] = testing::place_cache(mem, f);
  const DecodeArgs args{.q = mem.place(f.q),
                        .out = mem.filled<uint8_t>(f.q.size(), 0),
                        .dtype = DType::kFloat32,
                        .num_q_heads = 4,
                        .max_context_len = 9};
  auto expect = [&](const absl::Status& s, const std::string& fragment) {
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(fragment) != std::string::npos);
  };

  const KvCacheView hd96 =
      make_kv_cache_view(cache.k, cache.v, cache.dtype, cache.num_blocks, 2, 8, 96);
  expect(paged_decode_attention(device, hd96, table, args), "head_dim 96");

  DecodeArgs bad_heads = args;
  bad_heads.num_q_heads = 3;
  expect(paged_decode_attention(device, cache, table, bad_heads),
         "num_q_heads 3 must be a positive multiple of num_kv_heads 2");

  DecodeArgs bad_dtype = args;
  bad_dtype.dtype = DType::kFloat16;
  expect(paged_decode_attention(device, cache, table, bad_dtype),
         "cache dtype fp32 must be the q dtype (fp16) or fp8_e4m3");

  DecodeArgs no_window = args;
  no_window.kind = AttentionKind::kSlidingWindow;
  expect(paged_decode_attention(device, cache, table, no_window),
         "window 0 of a sliding_window group must be > 0 tokens");
  DecodeArgs bad_kind = args;
  bad_kind.kind = static_cast<AttentionKind>(7);
  expect(paged_decode_attention(device, cache, table, bad_kind),
         "attention kind 7 is not full (0), sliding_window (1) or chunked_local (2)");

  if (device == Device::kCuda) {
    // CUDA cannot read the lengths it plans and sizes the grid by: the caller passes them.
    DecodeArgs no_max = args;
    no_max.max_context_len = 0;
    expect(paged_decode_attention(device, cache, table, no_max, {.num_splits = 2}),
           "max_context_len is 0; CUDA needs it to plan split-K");
    const std::vector<int32_t> indptr = {0, 1, 2};
    expect(paged_extend_attention(device, cache, table,
                                  {.q = args.q,
                                   .out = args.out,
                                   .dtype = DType::kFloat32,
                                   .num_q_heads = 4,
                                   .qo_indptr = mem.place(indptr)}),
           "max_query_len is 0; CUDA needs it to size the grid");
    return;
  }

  // The CPU checks what it reads on the host: table entries, lengths, query offsets, sinks
  // and slots (on CUDA they are the caller's contract).
  std::vector<int32_t> bad_table = f.table;
  bad_table[1] = f.num_blocks;  // entry 1 of sequence 0 is read (9 tokens = 2 blocks)
  BlockTableView tv = table;
  tv.block_table = bad_table.data();
  expect(paged_decode_attention(device, cache, tv, args),
         "sequence 0: block table entry 1 is " + std::to_string(f.num_blocks));

  const std::vector<int32_t> lens = {9, 1000};
  tv = table;
  tv.context_lens = lens.data();
  expect(paged_decode_attention(device, cache, tv, args),
         "sequence 1: context length 1000 outside [0, max_blocks");

  const int64_t slot = int64_t{f.num_blocks} * 8;
  expect(write_kv(device, cache,
                  {.k = f.q.data(), .v = f.q.data(), .slot_mapping = &slot, .num_tokens = 1}),
         "token 0: slot " + std::to_string(slot) + " is at or beyond num_blocks");

  const std::vector<int32_t> indptr = {0, 10, 11};  // 10 new tokens but a context of 9
  expect(paged_extend_attention(device, cache, table,
                                {.q = args.q,
                                 .out = args.out,
                                 .dtype = DType::kFloat32,
                                 .num_q_heads = 4,
                                 .qo_indptr = indptr.data()}),
         "sequence 0: 10 new tokens, must be in [0, context length 9]");

  const std::vector<float> sinks = {0.5f, NAN, 1.0f, 2.0f};
  DecodeArgs bad_sink = args;
  bad_sink.maybe_sinks = sinks.data();
  expect(paged_decode_attention(device, cache, table, bad_sink), "sink logit of head 1 is nan");

  // Entries before a window are never read, so they are not checked either; entries in it
  // are.
  bad_table = f.table;
  bad_table[0] = -7;  // sequence 0 (9 tokens): its window of 1 token starts in entry 1
  tv = table;
  tv.block_table = bad_table.data();
  DecodeArgs windowed = args;
  windowed.kind = AttentionKind::kSlidingWindow;
  windowed.window = 1;
  CHECK(paged_decode_attention(device, cache, tv, windowed).ok());
  windowed.window = 2;  // tokens 7 and 8: entries 0 and 1
  expect(paged_decode_attention(device, cache, tv, windowed),
         "sequence 0: block table entry 0 is -7");

  // And without a device the CUDA backend refuses every call.
  if (!cuda_device_available()) {
    const absl::Status s = paged_decode_attention(Device::kCuda, cache, table, args);
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(s.message().find("no usable CUDA device") != std::string::npos);
  }
}

}  // namespace
}  // namespace pagedkv
