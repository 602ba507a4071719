// CUDA kernels against the CPU reference and the fp64 dense reference: decode (split off,
// forced, automatic), extend, windowed decode and extend (sliding window, chunked local),
// attention sinks, MLA decode, write_kv, and KvStorage copy / swap round trips on the
// device. Compiled whenever the library is built with CUDA; each test runs only when a
// device is usable and otherwise WARNs the reason and returns (Catch2 v2 has no SKIP).
#include <catch2/catch.hpp>
#include <string>

#include "pagedkv/device.h"
#include "support/skip.h"

#if PAGEDKV_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "attention_test_util.h"
#include "pagedkv/attention.h"
#include "pagedkv/kv_storage.h"
#endif

namespace pagedkv {
namespace {

// True when a CUDA device is usable; otherwise reports the skip.
bool have_gpu() {
  if (cuda_device_available()) return true;
  testing::report_skip(std::string("no usable CUDA device (") + cuda_unavailable_reason() + ")");
  return false;
}

#if !PAGEDKV_HAVE_CUDA

TEST_CASE("CUDA kernels match the CPU reference", "[gpu]") { have_gpu(); }

#else

using testing::AttentionCase;
using testing::AttentionFixture;
using testing::Outputs;
using testing::Run;

#define CUDA_REQUIRE(expr) REQUIRE((expr) == cudaSuccess)

// Device copy of a host vector, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    CUDA_REQUIRE(cudaMalloc(&ptr_, bytes == 0 ? 16 : bytes));
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    CUDA_REQUIRE(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  template <typename T>
  std::vector<T> read() const {
    std::vector<T> host(bytes_ / sizeof(T));
    CUDA_REQUIRE(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// The fixture's buffers on the device.
struct DeviceFixture {
  explicit DeviceFixture(const AttentionFixture& f)
      : k(f.k_pool),
        v(f.v_pool),
        table(f.table),
        lens(f.lens),
        q(f.q),
        indptr(f.qo_indptr.empty() ? std::vector<int32_t>{0} : f.qo_indptr),
        scales(std::vector<float>{f.k_scale, f.v_scale}),
        sinks(f.sinks.empty() ? std::vector<float>{0.0f} : f.sinks),
        has_sinks(!f.sinks.empty()) {}
  const float* sinks_ptr() const { return has_sinks ? sinks.get<float>() : nullptr; }
  // The fixture's cache and table views, pointing at these device copies.
  KvCacheView cache_view(AttentionFixture& f) const {
    KvCacheView view = f.view();
    view.k = k.get();
    view.v = v.get();
    return view;
  }
  BlockTableView table_view(const AttentionFixture& f) const {
    BlockTableView view = f.table_view();
    view.block_table = table.get<int32_t>();
    view.context_lens = lens.get<int32_t>();
    return view;
  }
  DeviceBuffer k, v, table, lens, q, indptr, scales, sinks;
  bool has_sinks;
};

Run run_cuda(AttentionFixture& f, int32_t num_splits, void* workspace = nullptr,
             int64_t workspace_bytes = 0, int64_t total_context_len = 0) {
  const AttentionCase& c = f.c;
  DeviceFixture d(f);
  DeviceBuffer out(f.q.size());
  DeviceBuffer lse(sizeof(float) * f.num_q_rows * c.num_q_heads);
  const KvCacheView view = d.cache_view(f);
  const BlockTableView table = d.table_view(f);
  const float* k_scale = f.fp8() ? d.scales.get<float>() : nullptr;
  const float* v_scale = f.fp8() ? d.scales.get<float>() + 1 : nullptr;
  absl::Status status;
  if (c.extend()) {
    int32_t longest = 0;
    for (int32_t n : c.new_tokens) longest = std::max(longest, n);
    status = paged_extend_attention(Device::kCuda, view, table,
                                    {.q = d.q.get(),
                                     .out = out.get(),
                                     .maybe_lse = lse.get<float>(),
                                     .dtype = c.q_dtype,
                                     .num_q_heads = c.num_q_heads,
                                     .maybe_k_scale = k_scale,
                                     .maybe_v_scale = v_scale,
                                     .qo_indptr = d.indptr.get<int32_t>(),
                                     .max_query_len = longest,
                                     .kind = c.kind,
                                     .window = c.window,
                                     .maybe_sinks = d.sinks_ptr()});
  } else {
    status = paged_decode_attention(Device::kCuda, view, table,
                                    {.q = d.q.get(),
                                     .out = out.get(),
                                     .maybe_lse = lse.get<float>(),
                                     .dtype = c.q_dtype,
                                     .num_q_heads = c.num_q_heads,
                                     .maybe_k_scale = k_scale,
                                     .maybe_v_scale = v_scale,
                                     .max_context_len = f.max_len(),
                                     .total_context_len = total_context_len,
                                     .kind = c.kind,
                                     .window = c.window,
                                     .maybe_sinks = d.sinks_ptr()},
                                    {.num_splits = num_splits,
                                     .maybe_workspace = workspace,
                                     .workspace_bytes = workspace_bytes});
  }
  INFO(status.ToString());
  REQUIRE(status.ok());
  CUDA_REQUIRE(cudaDeviceSynchronize());
  return {testing::to_doubles(out.read<uint8_t>(), c.q_dtype), lse.read<float>()};
}

Run run_cpu(AttentionFixture& f, int32_t num_splits) {
  const AttentionCase& c = f.c;
  std::vector<uint8_t> out(f.q.size());
  std::vector<float> lse(int64_t{f.num_q_rows} * c.num_q_heads);
  absl::Status status;
  if (c.extend()) {
    status = paged_extend_attention(Device::kCpu, f.view(), f.table_view(),
                                    {.q = f.q.data(),
                                     .out = out.data(),
                                     .maybe_lse = lse.data(),
                                     .dtype = c.q_dtype,
                                     .num_q_heads = c.num_q_heads,
                                     .maybe_k_scale = f.k_scale_ptr(),
                                     .maybe_v_scale = f.v_scale_ptr(),
                                     .qo_indptr = f.qo_indptr.data(),
                                     .kind = c.kind,
                                     .window = c.window,
                                     .maybe_sinks = f.sinks_ptr()});
  } else {
    status = paged_decode_attention(Device::kCpu, f.view(), f.table_view(),
                                    {.q = f.q.data(),
                                     .out = out.data(),
                                     .maybe_lse = lse.data(),
                                     .dtype = c.q_dtype,
                                     .num_q_heads = c.num_q_heads,
                                     .maybe_k_scale = f.k_scale_ptr(),
                                     .maybe_v_scale = f.v_scale_ptr(),
                                     .kind = c.kind,
                                     .window = c.window,
                                     .maybe_sinks = f.sinks_ptr()},
                                    {.num_splits = num_splits});
  }
  REQUIRE(status.ok());
  return {testing::to_doubles(out, c.q_dtype), lse};
}

// CUDA vs the fp64 reference (the CPU criteria) and vs the CPU reference run.
void check_cuda(const AttentionCase& c, const std::vector<int32_t>& splits,
                int64_t total_context_len = 0) {
  AttentionFixture f = testing::make_fixture(c);
  const Outputs ref = testing::reference(f);
  const double naive = testing::naive_error(f, ref);
  for (int32_t s : splits) {
    INFO(c.name() << " num_splits " << s);
    const Run gpu = run_cuda(f, s, nullptr, 0, total_context_len);
    testing::check_run(f, gpu, ref, naive);
    const Run cpu = run_cpu(f, s == 0 ? 1 : s);
    INFO("CUDA vs CPU");
    const double tol =
        c.q_dtype == DType::kBFloat16 ? 2.0 * std::max(naive, 1e-3) : testing::tolerance(c);
    CHECK(testing::max_abs_error(gpu.out, cpu.out) <= tol);
  }
}

constexpr std::pair<int32_t, int32_t> kHeads[] = {{32, 32}, {32, 8}, {8, 1}, {40, 40}};

TEST_CASE("CUDA decode matches the references over head_dim x block_size x heads (fp32)", "[gpu]") {
  if (!have_gpu()) return;
  uint64_t seed = 1;
  for (int32_t hd : {64, 128, 256}) {
    for (int32_t bs : {8, 16, 32}) {
      for (auto [hq, hkv] : kHeads) {
        AttentionCase c{.head_dim = hd, .block_size = bs, .num_q_heads = hq, .num_kv_heads = hkv};
        c.lens = {1, bs - 1, bs, bs + 1, 97, 0, 33};
        c.seed = seed++;
        check_cuda(c, {1, 16, 0});
      }
    }
  }
}

TEST_CASE("CUDA decode over long contexts and large batches, split off / forced / auto", "[gpu]") {
  if (!have_gpu()) return;
  check_cuda({.head_dim = 128,
              .block_size = 16,
              .num_q_heads = 32,
              .num_kv_heads = 8,
              .lens = {2048},
              .seed = 11},
             {1, 8, 0});
  check_cuda({.head_dim = 64,
              .block_size = 32,
              .num_q_heads = 8,
              .num_kv_heads = 1,
              .lens = {2048, 1, 97, 31, 32, 33, 500},
              .seed = 12},
             {1, 5, 0});
  AttentionCase c{.head_dim = 256,
                  .block_size = 8,
                  .num_q_heads = 8,
                  .num_kv_heads = 1,
                  .q_dtype = DType::kBFloat16,
                  .kv_dtype = DType::kBFloat16};
  std::mt19937 rng(37);
  for (int i = 0; i < 37; ++i) c.lens.push_back(i % 9 == 0 ? 0 : static_cast<int32_t>(rng() % 400));
  c.seed = 13;
  check_cuda(c, {1, 4, 0});
}

TEST_CASE("CUDA decode in fp16, bf16 and with fp8 KV matches the references", "[gpu]") {
  if (!have_gpu()) return;
  const std::pair<DType, DType> dtypes[] = {{DType::kFloat16, DType::kFloat16},
                                            {DType::kBFloat16, DType::kBFloat16},
                                            {DType::kFloat32, DType::kFloat8E4M3},
                                            {DType::kFloat16, DType::kFloat8E4M3},
                                            {DType::kBFloat16, DType::kFloat8E4M3}};
  uint64_t seed = 100;
  for (auto [q_dtype, kv_dtype] : dtypes) {
    for (int32_t hd : {64, 128, 256}) {
      for (int32_t bs : {8, 16, 32}) {
        for (auto [hq, hkv] : kHeads) {
          AttentionCase c{.head_dim = hd,
                          .block_size = bs,
                          .num_q_heads = hq,
                          .num_kv_heads = hkv,
                          .q_dtype = q_dtype,
                          .kv_dtype = kv_dtype};
          c.lens = {1, bs - 1, bs, bs + 1, 97, 0, 33};
          c.seed = seed++;
          check_cuda(c, {1, 3});
        }
      }
    }
    check_cuda({.head_dim = 128,
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

TEST_CASE("CUDA extend matches the causal dense reference", "[gpu]") {
  if (!have_gpu()) return;
  const std::pair<DType, DType> dtypes[] = {{DType::kFloat32, DType::kFloat32},
                                            {DType::kBFloat16, DType::kBFloat16},
                                            {DType::kFloat16, DType::kFloat8E4M3}};
  uint64_t seed = 200;
  for (auto [q_dtype, kv_dtype] : dtypes) {
    for (int32_t hd : {64, 128, 256}) {
      for (auto [hq, hkv] : {std::pair{8, 2}, std::pair{32, 32}, std::pair{8, 1}}) {
        AttentionCase c{.head_dim = hd,
                        .block_size = hd == 128 ? 8 : 16,
                        .num_q_heads = hq,
                        .num_kv_heads = hkv,
                        .q_dtype = q_dtype,
                        .kv_dtype = kv_dtype};
        c.lens = {5, 40, 97, 16, 1, 150};
        c.new_tokens = {5, 10, 1, 16, 1, 130};
        c.seed = seed++;
        check_cuda(c, {1});
      }
    }
  }
}

TEST_CASE("CUDA decode uses a caller workspace and refuses one too small", "[gpu]") {
  if (!have_gpu()) return;
  AttentionCase c{.head_dim = 128,
                  .block_size = 16,
                  .num_q_heads = 8,
                  .num_kv_heads = 2,
                  .q_dtype = DType::kBFloat16,
                  .kv_dtype = DType::kBFloat16,
                  .lens = {1000, 3, 0}};
  AttentionFixture f = testing::make_fixture(c);
  const DecodePlan plan{.num_splits = 6, .tokens_per_split = 176};
  const int64_t need = decode_workspace_bytes(plan, 3, 8, 128);
  DeviceBuffer workspace(need);
  const Run with = run_cuda(f, 6, workspace.get(), need);
  const Run without = run_cuda(f, 6);
  CHECK(with.out == without.out);
  DeviceFixture d(f);
  DeviceBuffer out(f.q.size());
  const KvCacheView view = d.cache_view(f);
  const BlockTableView table = d.table_view(f);
  const absl::Status s = paged_decode_attention(
      Device::kCuda, view, table,
      {.q = d.q.get(),
       .out = out.get(),
       .dtype = c.q_dtype,
       .num_q_heads = 8,
       .max_context_len = 1000},
      {.num_splits = 6, .maybe_workspace = workspace.get(), .workspace_bytes = need - 1});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("workspace of " + std::to_string(need - 1) + " bytes") !=
        std::string::npos);
}

TEST_CASE("CUDA decode replays from a CUDA graph with the same output", "[gpu]") {
  if (!have_gpu()) return;
  // The fixed grid (early exit for empty splits) and a caller workspace make the call
  // capturable; replays must equal a direct launch.
  AttentionCase c{.head_dim = 128,
                  .block_size = 16,
                  .num_q_heads = 32,
                  .num_kv_heads = 8,
                  .q_dtype = DType::kBFloat16,
                  .kv_dtype = DType::kFloat8E4M3,
                  .lens = {3000, 17, 0, 512}};
  AttentionFixture f = testing::make_fixture(c);
  const Run direct = run_cuda(f, 8);
  DeviceFixture d(f);
  DeviceBuffer out(f.q.size());
  const DecodePlan plan{.num_splits = 8};
  const int64_t need = decode_workspace_bytes(plan, 4, 32, 128);
  DeviceBuffer workspace(need);
  const KvCacheView view = d.cache_view(f);
  const BlockTableView table = d.table_view(f);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status s = paged_decode_attention(
      Device::kCuda, view, table,
      {.q = d.q.get(),
       .out = out.get(),
       .dtype = c.q_dtype,
       .num_q_heads = 32,
       .maybe_k_scale = d.scales.get<float>(),
       .maybe_v_scale = d.scales.get<float>() + 1,
       .max_context_len = 3000},
      {.num_splits = 8, .maybe_workspace = workspace.get(), .workspace_bytes = need}, stream);
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  REQUIRE(s.ok());
  cudaGraphExec_t exec;
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(testing::to_doubles(out.read<uint8_t>(), c.q_dtype) == direct.out);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE("CUDA decode serves every GQA group on tensor cores (1-16, and wide groups)", "[gpu]") {
  if (!have_gpu()) return;
  // Groups up to 16 take one 16-row CTA tile; 17-64 the 64-row shape; 71 two row chunks.
  const std::pair<DType, DType> dtypes[] = {{DType::kBFloat16, DType::kBFloat16},
                                            {DType::kFloat16, DType::kFloat8E4M3},
                                            {DType::kFloat32, DType::kFloat32}};
  uint64_t seed = 300;
  for (auto [q_dtype, kv_dtype] : dtypes) {
    for (int32_t group :
         {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 24, 32, 64, 71}) {
      for (int32_t hd : {64, 128, 256}) {
        AttentionCase c{.head_dim = hd,
                        .block_size = 16,
                        .num_q_heads = 2 * group,
                        .num_kv_heads = 2,
                        .q_dtype = q_dtype,
                        .kv_dtype = kv_dtype};
        c.lens = {1, 15, 16, 17, 300, 0, 1000};
        c.seed = seed++;
        check_cuda(c, {1, 0});
      }
    }
  }
}

TEST_CASE("CUDA decode with every forced split count of a sequence", "[gpu]") {
  if (!have_gpu()) return;
  // 1024 tokens in blocks of 16 = 64 blocks: split counts 1..64 give splits of 1..64 blocks,
  // and counts past 64 (200, 1000) leave most splits empty.
  AttentionCase c{.head_dim = 128,
                  .block_size = 16,
                  .num_q_heads = 16,
                  .num_kv_heads = 2,
                  .q_dtype = DType::kBFloat16,
                  .kv_dtype = DType::kBFloat16,
                  .lens = {1024, 1, 700, 0, 64},
                  .seed = 400};
  std::vector<int32_t> splits;
  for (int32_t s = 1; s <= 64; ++s) splits.push_back(s);
  splits.push_back(200);
  splits.push_back(1000);
  check_cuda(c, splits);
}

TEST_CASE("CUDA decode of skewed batches mixing 1-token and 32K sequences", "[gpu]") {
  if (!have_gpu()) return;
  for (auto [q_dtype, kv_dtype] : {std::pair{DType::kBFloat16, DType::kBFloat16},
                                   std::pair{DType::kBFloat16, DType::kFloat8E4M3}}) {
    AttentionCase c{.head_dim = 128,
                    .block_size = 16,
                    .num_q_heads = 32,
                    .num_kv_heads = 8,
                    .q_dtype = q_dtype,
                    .kv_dtype = kv_dtype,
                    .lens = {1, 32768, 1, 1, 7, 1, 32768, 1},
                    .seed = 500};
    int64_t total = 0;
    for (int32_t len : c.lens) total += len;
    check_cuda(c, {0}, total);  // automatic plan with the batch's real total
    check_cuda(c, {0, 1});      // without the hint: split as if uniform, and not at all
  }
}

TEST_CASE("CUDA decode refuses to grow the library workspace during graph capture", "[gpu]") {
  if (!have_gpu()) return;
  AttentionCase c{.head_dim = 128,
                  .block_size = 16,
                  .num_q_heads = 32,
                  .num_kv_heads = 8,
                  .q_dtype = DType::kBFloat16,
                  .kv_dtype = DType::kBFloat16};
  c.lens.assign(32, 2048);
  AttentionFixture f = testing::make_fixture(c);
  DeviceFixture d(f);
  DeviceBuffer out(f.q.size());
  const KvCacheView view = d.cache_view(f);
  const BlockTableView table = d.table_view(f);
  const DecodeArgs args{.q = d.q.get(),
                        .out = out.get(),
                        .dtype = c.q_dtype,
                        .num_q_heads = 32,
                        .max_context_len = 2048};
  const int32_t splits = 128;  // 128 x 32 x 32 x 130 x 4 bytes = 68 MB of partials
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status s =
      paged_decode_attention(Device::kCuda, view, table, args, {.num_splits = splits}, stream);
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(s.message().find("capturing") != std::string::npos);
  cudaGraphDestroy(graph);
  // Outside a capture the same call grows the workspace and runs; a later capture reuses it.
  REQUIRE(paged_decode_attention(Device::kCuda, view, table, args, {.num_splits = splits}, stream)
              .ok());
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status again =
      paged_decode_attention(Device::kCuda, view, table, args, {.num_splits = splits}, stream);
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  CHECK(again.ok());
  cudaGraphDestroy(graph);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
}

// --- windowed layer groups and sinks ------------------------------------------------------

TEST_CASE("CUDA windowed decode matches the references (sliding, chunked, sinks)", "[gpu]") {
  if (!have_gpu()) return;
  const std::pair<DType, DType> dtypes[] = {{DType::kBFloat16, DType::kBFloat16},
                                            {DType::kBFloat16, DType::kFloat8E4M3},
                                            {DType::kFloat16, DType::kFloat8E4M3},
                                            {DType::kFloat32, DType::kFloat32}};
  uint64_t seed = 1000;
  for (auto [q_dtype, kv_dtype] : dtypes) {
    for (AttentionKind kind : {AttentionKind::kSlidingWindow, AttentionKind::kChunkedLocal}) {
      for (int32_t bs : {8, 16}) {
        // Smaller than a block, a block, several blocks and not aligned, beyond the context.
        for (int32_t window : {bs / 2 + 1, bs, 3 * bs + 5, 5000}) {
          for (auto [hq, hkv] : {std::pair{32, 8}, std::pair{8, 1}, std::pair{40, 2}}) {
            AttentionCase c{.head_dim = 128,
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
            check_cuda(c, {1, 3, 16, 0});  // window starts inside splits, empty splits
          }
        }
      }
    }
  }
}

TEST_CASE("CUDA windowed decode over every head_dim, layout and a long skewed batch", "[gpu]") {
  if (!have_gpu()) return;
  uint64_t seed = 1100;
  for (int32_t hd : {64, 128, 256}) {
    for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD}) {
      for (AttentionKind kind : {AttentionKind::kSlidingWindow, AttentionKind::kChunkedLocal}) {
        check_cuda({.head_dim = hd,
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
  // One 32K sequence among short ones with a 4K sliding window: the plan splits the window.
  AttentionCase c{.head_dim = 128,
                  .block_size = 16,
                  .num_q_heads = 32,
                  .num_kv_heads = 8,
                  .q_dtype = DType::kBFloat16,
                  .kv_dtype = DType::kFloat8E4M3,
                  .lens = {1, 32768, 7, 4097},
                  .seed = 1150,
                  .kind = AttentionKind::kSlidingWindow,
                  .window = 4096};
  int64_t total = 0;
  for (int32_t len : c.lens) total += len;
  check_cuda(c, {0}, total);
}

TEST_CASE("CUDA windowed extend matches the references (chunk boundaries in the query tile)",
          "[gpu]") {
  if (!have_gpu()) return;
  const std::pair<DType, DType> dtypes[] = {{DType::kFloat32, DType::kFloat32},
                                            {DType::kBFloat16, DType::kBFloat16},
                                            {DType::kFloat16, DType::kFloat8E4M3}};
  uint64_t seed = 1200;
  for (auto [q_dtype, kv_dtype] : dtypes) {
    for (AttentionKind kind : {AttentionKind::kSlidingWindow, AttentionKind::kChunkedLocal}) {
      for (int32_t window : {5, 16, 24, 100, 1000}) {
        for (auto [hq, hkv] : {std::pair{8, 2}, std::pair{32, 32}, std::pair{8, 1}}) {
          check_cuda({.head_dim = 128,
                      .block_size = 16,
                      .num_q_heads = hq,
                      .num_kv_heads = hkv,
                      .q_dtype = q_dtype,
                      .kv_dtype = kv_dtype,
                      .lens = {40, 97, 150, 16, 1, 300},
                      .new_tokens = {40, 30, 130, 5, 1, 70},
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

TEST_CASE("CUDA sinks join the softmax in decode (split or not) and extend", "[gpu]") {
  if (!have_gpu()) return;
  uint64_t seed = 1300;
  for (auto [q_dtype, kv_dtype] : {std::pair{DType::kBFloat16, DType::kBFloat16},
                                   std::pair{DType::kFloat16, DType::kFloat8E4M3},
                                   std::pair{DType::kFloat32, DType::kFloat32}}) {
    for (int32_t hd : {64, 128, 256}) {
      AttentionCase c{.head_dim = hd,
                      .block_size = 16,
                      .num_q_heads = 64,
                      .num_kv_heads = 8,
                      .q_dtype = q_dtype,
                      .kv_dtype = kv_dtype,
                      .lens = {1, 15, 16, 17, 300, 0, 1000},
                      .seed = seed++,
                      .sinks = true};
      check_cuda(c, {1, 4, 0});
      c.new_tokens = {1, 15, 3, 17, 70, 0, 100};
      check_cuda(c, {1});
    }
  }
}

// --- MLA ---------------------------------------------------------------------------------

using testing::MlaCase;
using testing::MlaFixture;

Run run_mla(MlaFixture& f, Device device, int32_t num_splits) {
  const MlaCase& c = f.c;
  const int64_t out_bytes =
      int64_t{f.num_seqs()} * c.num_heads * c.kv_lora_rank * bytes_per_element(c.q_dtype);
  const int64_t lse_count = int64_t{f.num_seqs()} * c.num_heads;
  MlaDecodeArgs args{.dtype = c.q_dtype,
                     .num_heads = c.num_heads,
                     .kv_lora_rank = c.kv_lora_rank,
                     .qk_rope_head_dim = c.rope_dim,
                     .sm_scale = f.sm_scale,
                     .max_context_len = f.max_len()};
  if (device == Device::kCpu) {
    std::vector<uint8_t> out(out_bytes);
    std::vector<float> lse(lse_count);
    args.q = f.q.data();
    args.out = out.data();
    args.maybe_lse = lse.data();
    args.maybe_kv_scale = f.kv_scale_ptr();
    const absl::Status status = paged_mla_decode(Device::kCpu, f.view(), f.table_view(), args,
                                                 {.num_splits = num_splits == 0 ? 1 : num_splits});
    INFO(status.ToString());
    REQUIRE(status.ok());
    return {testing::to_doubles(out, c.q_dtype), lse};
  }
  DeviceBuffer pool(f.pool), table(f.table), lens(f.lens), q(f.q),
      scale(std::vector<float>{f.kv_scale});
  DeviceBuffer out(out_bytes), lse(sizeof(float) * lse_count);
  KvCacheView view = f.view();
  view.k = pool.get();
  BlockTableView tv = f.table_view();
  tv.block_table = table.get<int32_t>();
  tv.context_lens = lens.get<int32_t>();
  args.q = q.get();
  args.out = out.get();
  args.maybe_lse = lse.get<float>();
  args.maybe_kv_scale = f.fp8() ? scale.get<float>() : nullptr;
  const absl::Status status =
      paged_mla_decode(Device::kCuda, view, tv, args, {.num_splits = num_splits});
  INFO(status.ToString());
  REQUIRE(status.ok());
  CUDA_REQUIRE(cudaDeviceSynchronize());
  return {testing::to_doubles(out.read<uint8_t>(), c.q_dtype), lse.read<float>()};
}

// CUDA MLA vs the fp64 reference and vs the CPU reference run.
void check_cuda_mla(const MlaCase& c, const std::vector<int32_t>& splits) {
  MlaFixture f = testing::make_mla_fixture(c);
  const Outputs ref = testing::mla_reference(f);
  const double tol = testing::mla_tolerance(f, ref);
  for (int32_t s : splits) {
    INFO(c.name() << " num_splits " << s);
    const Run gpu = run_mla(f, Device::kCuda, s);
    testing::check_mla_run(f, gpu, ref, tol);
    const Run cpu = run_mla(f, Device::kCpu, s);
    INFO("CUDA vs CPU");
    CHECK(testing::max_abs_error(gpu.out, cpu.out) <= tol);
  }
}

TEST_CASE("CUDA MLA decode matches the references over heads x dtypes x block sizes", "[gpu]") {
  if (!have_gpu()) return;
  const std::pair<DType, DType> dtypes[] = {{DType::kBFloat16, DType::kBFloat16},
                                            {DType::kBFloat16, DType::kFloat8E4M3},
                                            {DType::kFloat16, DType::kFloat16},
                                            {DType::kFloat16, DType::kFloat8E4M3}};
  uint64_t seed = 1400;
  for (auto [q_dtype, kv_dtype] : dtypes) {
    // Every head count tensor parallelism leaves of 128, and padded ones (8, 40, 96).
    for (int32_t heads : {16, 32, 64, 128, 8, 40, 96}) {
      for (int32_t bs : {16, 64}) {
        check_cuda_mla({.num_heads = heads,
                        .block_size = bs,
                        .q_dtype = q_dtype,
                        .kv_dtype = kv_dtype,
                        .lens = {1, bs - 1, bs, bs + 1, 31, 33, 500, 0},
                        .seed = seed++},
                       {1, 5, 0});
      }
    }
  }
}

TEST_CASE("CUDA MLA decode over long and skewed contexts, every forced split count", "[gpu]") {
  if (!have_gpu()) return;
  check_cuda_mla({.num_heads = 128,
                  .block_size = 64,
                  .q_dtype = DType::kBFloat16,
                  .kv_dtype = DType::kFloat8E4M3,
                  .lens = {1, 16384, 3, 8000},
                  .seed = 1500},
                 {0, 1});
  std::vector<int32_t> splits;
  for (int32_t s = 1; s <= 20; ++s) splits.push_back(s);
  splits.push_back(200);
  check_cuda_mla({.num_heads = 16,
                  .block_size = 16,
                  .q_dtype = DType::kBFloat16,
                  .kv_dtype = DType::kBFloat16,
                  .lens = {1024, 1, 700, 0},
                  .seed = 1501},
                 splits);
}

TEST_CASE("CUDA MLA decode refuses latent dims other than 512 + 64 and fp32 q", "[gpu]") {
  if (!have_gpu()) return;
  MlaFixture f = testing::make_mla_fixture(
      {.kv_lora_rank = 32, .rope_dim = 16, .num_heads = 16, .block_size = 16, .lens = {20}});
  DeviceBuffer pool(f.pool), table(f.table), lens(f.lens), q(f.q), out(size_t{16} * 32 * 2);
  KvCacheView view = f.view();
  view.k = pool.get();
  BlockTableView tv = f.table_view();
  tv.block_table = table.get<int32_t>();
  tv.context_lens = lens.get<int32_t>();
  MlaDecodeArgs args{.q = q.get(),
                     .out = out.get(),
                     .dtype = DType::kBFloat16,
                     .num_heads = 16,
                     .kv_lora_rank = 32,
                     .qk_rope_head_dim = 16,
                     .sm_scale = 0.1f,
                     .max_context_len = 20};
  absl::Status s = paged_mla_decode(Device::kCuda, view, tv, args);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("CUDA supports kv_lora_rank 512 + qk_rope_head_dim 64") !=
        std::string::npos);
  MlaFixture g = testing::make_mla_fixture(
      {.num_heads = 16, .q_dtype = DType::kFloat32, .kv_dtype = DType::kFloat32, .lens = {20}});
  DeviceBuffer pool32(g.pool), table32(g.table), lens32(g.lens), q32(g.q),
      out32(size_t{16} * 512 * 4);
  view = g.view();
  view.k = pool32.get();
  tv = g.table_view();
  tv.block_table = table32.get<int32_t>();
  tv.context_lens = lens32.get<int32_t>();
  args = {.q = q32.get(),
          .out = out32.get(),
          .dtype = DType::kFloat32,
          .num_heads = 16,
          .kv_lora_rank = 512,
          .qk_rope_head_dim = 64,
          .sm_scale = 0.1f,
          .max_context_len = 20};
  s = paged_mla_decode(Device::kCuda, view, tv, args);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("CUDA needs q/out in fp16 or bf16") != std::string::npos);
}

TEST_CASE("CUDA kernels over every variant on small shapes (the compute-sanitizer set)",
          "[gpu][sanitize]") {
  if (!have_gpu()) return;
  // Each q/KV dtype pair and head_dim, 16- and 64-row CTA shapes (groups 3, 24), a row
  // chunk past the last (group 71), decode with and without splits, and extend.
  const std::pair<DType, DType> dtypes[] = {
      {DType::kFloat32, DType::kFloat32},    {DType::kFloat16, DType::kFloat16},
      {DType::kBFloat16, DType::kBFloat16},  {DType::kFloat32, DType::kFloat8E4M3},
      {DType::kFloat16, DType::kFloat8E4M3}, {DType::kBFloat16, DType::kFloat8E4M3}};
  uint64_t seed = 600;
  for (auto [q_dtype, kv_dtype] : dtypes) {
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
        check_cuda(c, {1, 3});
        c.new_tokens = {6, 0, 9};
        check_cuda(c, {1});
      }
    }
  }
}

TEST_CASE("CUDA windowed, sink and MLA variants on small shapes (the compute-sanitizer set)",
          "[gpu][sanitize]") {
  if (!have_gpu()) return;
  // The windowed kernel of each dtype pair and head_dim in both CTA shapes, decode split
  // and not and extend, with sinks; then every MLA variant (16, 32, 64 heads per CTA; each
  // dtype pair) split and not.
  const std::pair<DType, DType> dtypes[] = {
      {DType::kFloat32, DType::kFloat32},    {DType::kFloat16, DType::kFloat16},
      {DType::kBFloat16, DType::kBFloat16},  {DType::kFloat32, DType::kFloat8E4M3},
      {DType::kFloat16, DType::kFloat8E4M3}, {DType::kBFloat16, DType::kFloat8E4M3}};
  uint64_t seed = 1600;
  for (auto [q_dtype, kv_dtype] : dtypes) {
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
        check_cuda(c, {1, 3});
        c.new_tokens = {70, 0, 9};
        check_cuda(c, {1});
      }
    }
  }
  for (auto [q_dtype, kv_dtype] : {std::pair{DType::kBFloat16, DType::kBFloat16},
                                   std::pair{DType::kBFloat16, DType::kFloat8E4M3},
                                   std::pair{DType::kFloat16, DType::kFloat16},
                                   std::pair{DType::kFloat16, DType::kFloat8E4M3}}) {
    for (int32_t heads : {16, 32, 128}) {
      check_cuda_mla({.num_heads = heads,
                      .block_size = 16,
                      .q_dtype = q_dtype,
                      .kv_dtype = kv_dtype,
                      .lens = {70, 0, 9},
                      .seed = seed++},
                     {1, 3});
    }
  }
}

TEST_CASE("CUDA storage is sized from a fraction of free device memory", "[gpu]") {
  if (!have_gpu()) return;
  const KvCacheSpec spec{.num_layers = 32,
                         .num_kv_heads = 8,
                         .head_dim = 128,
                         .dtype = DType::kBFloat16,
                         .block_size = 16};
  absl::StatusOr<int64_t> budget = KvStorage::free_memory_budget(Device::kCuda, 0.01);
  REQUIRE(budget.ok());
  REQUIRE(*budget >= spec.bytes_per_block());
  absl::StatusOr<KvStorage> storage =
      KvStorage::create_for_budget(spec, *budget, {.device = Device::kCuda});
  REQUIRE(storage.ok());
  CHECK(storage->num_blocks() == *spec.num_blocks_for_budget(*budget));
  CHECK(storage->bytes() <= *budget);
}

TEST_CASE("CUDA write_kv writes the same bytes as the CPU (K and V, or K only: MLA)", "[gpu]") {
  if (!have_gpu()) return;
  for (DType cache : {DType::kFloat32, DType::kBFloat16, DType::kFloat8E4M3}) {
    for (auto [layout, k_only] :
         {std::pair{KvLayout::kHND, false}, std::pair{KvLayout::kNHD, false},
          std::pair{KvLayout::kNHD, true}}) {
      const int32_t blocks = 5, hkv = 2, bs = 16, hd = 128, n = 37;
      const int64_t pool_bytes = int64_t{blocks} * hkv * bs * hd * bytes_per_element(cache);
      std::vector<uint8_t> k_pool(pool_bytes, 0x11), v_pool(pool_bytes, 0x22);
      std::vector<float> k(n * hkv * hd), v(k.size());
      std::mt19937 rng(9);
      for (float& x : k) x = static_cast<float>(rng() % 2000) / 100.0f - 10.0f;
      for (float& x : v) x = static_cast<float>(rng() % 2000) / 100.0f - 10.0f;
      std::vector<int64_t> slots(n);
      for (int32_t i = 0; i < n; ++i) slots[i] = i % 7 == 3 ? -1 : (i * 13) % (blocks * bs);
      const std::vector<float> scales = {0.05f, 0.1f};
      const bool fp8 = cache == DType::kFloat8E4M3;
      KvCacheView cpu_view = make_kv_cache_view(k_pool.data(), k_only ? nullptr : v_pool.data(),
                                                cache, blocks, hkv, bs, hd, layout);
      DeviceBuffer dk(k_pool), dv(v_pool), dks(k), dvs(v), dslots(slots), dscales(scales);
      REQUIRE(write_kv(Device::kCpu, cpu_view,
                       {.k = k.data(),
                        .v = k_only ? nullptr : v.data(),
                        .src_dtype = DType::kFloat32,
                        .slot_mapping = slots.data(),
                        .num_tokens = n,
                        .maybe_k_scale = fp8 ? &scales[0] : nullptr,
                        .maybe_v_scale = fp8 ? &scales[1] : nullptr})
                  .ok());
      KvCacheView gpu_view = make_kv_cache_view(dk.get(), k_only ? nullptr : dv.get(), cache,
                                                blocks, hkv, bs, hd, layout);
      REQUIRE(write_kv(Device::kCuda, gpu_view,
                       {.k = dks.get(),
                        .v = k_only ? nullptr : dvs.get(),
                        .src_dtype = DType::kFloat32,
                        .slot_mapping = dslots.get<int64_t>(),
                        .num_tokens = n,
                        .maybe_k_scale = fp8 ? dscales.get<float>() : nullptr,
                        .maybe_v_scale = fp8 ? dscales.get<float>() + 1 : nullptr})
                  .ok());
      CHECK(dk.read<uint8_t>() == k_pool);
      CHECK(dv.read<uint8_t>() == v_pool);
    }
  }
}

TEST_CASE("CUDA storage: copy-on-write, swap and tier round trips preserve bytes exactly",
          "[gpu]") {
  if (!have_gpu()) return;
  const KvCacheSpec spec{.num_layers = 3,
                         .num_kv_heads = 2,
                         .head_dim = 64,
                         .dtype = DType::kBFloat16,
                         .block_size = 8};
  for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD}) {
    absl::StatusOr<KvStorage> gpu = KvStorage::create(
        spec, 10, {.device = Device::kCuda, .layout = layout, .num_host_blocks = 6});
    absl::StatusOr<KvStorage> cpu = KvStorage::create(
        spec, 10, {.device = Device::kCpu, .layout = layout, .num_host_blocks = 6});
    REQUIRE(gpu.ok());
    REQUIRE(cpu.ok());
    // Same random bytes in both: the CPU storage is the expected result.
    std::mt19937 rng(21);
    const int64_t pool = pool_elements(cpu->view(0)) * 2;
    for (int32_t layer = 0; layer < 3; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        std::vector<uint8_t> bytes(pool);
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
        const KvCacheView cv = cpu->view(layer), gv = gpu->view(layer);
        std::memcpy(kv == 0 ? cv.k : cv.v, bytes.data(), pool);
        CUDA_REQUIRE(cudaMemcpy(kv == 0 ? gv.k : gv.v, bytes.data(), pool, cudaMemcpyHostToDevice));
      }
    }
    auto device_bytes = [&](const KvStorage& s) {
      std::vector<uint8_t> all(s.bytes());
      CUDA_REQUIRE(cudaMemcpy(all.data(), s.view(0).k, all.size(), cudaMemcpyDeviceToHost));
      return all;
    };
    auto host_bytes = [&](const KvStorage& s) {
      const char* base = static_cast<const char*>(s.view(0).k);
      return std::vector<uint8_t>(base, base + s.bytes());
    };
    auto host_bytes_of = [&](const KvStorage& s) {  // the host pool: pinned, host-readable
      const char* base = static_cast<const char*>(s.host_view(0).k);
      return std::vector<uint8_t>(base, base + s.host_bytes());
    };
    const std::vector<uint8_t> original = host_bytes(*cpu);
    const std::vector<BlockCopy> cow = {{1, 4, 3}, {2, 5, 8}, {7, 6, 1}};
    REQUIRE(cpu->copy_blocks(cow).ok());
    REQUIRE(gpu->copy_blocks(cow).ok());
    REQUIRE(gpu->synchronize().ok());
    CHECK(device_bytes(*gpu) == host_bytes(*cpu));
    CHECK(host_bytes(*cpu) != original);

    const std::vector<uint8_t> before_swap = host_bytes(*cpu);
    const std::vector<BlockCopy> out = {{3, 0, 8}, {9, 5, 8}, {4, 2, 8}};
    const std::vector<BlockCopy> clobber = {{0, 3, 8}, {1, 9, 8}, {2, 4, 8}};
    const std::vector<BlockCopy> in = {{0, 3, 8}, {5, 9, 8}, {2, 4, 8}};
    REQUIRE(gpu->swap_out(out).ok());
    REQUIRE(gpu->copy_blocks(clobber).ok());
    REQUIRE(gpu->synchronize().ok());
    CHECK(device_bytes(*gpu) != before_swap);
    REQUIRE(gpu->swap_in(in).ok());
    REQUIRE(gpu->synchronize().ok());
    CHECK(device_bytes(*gpu) == before_swap);

    // The host tier: demote two cached blocks, reuse their device blocks, promote back.
    const std::vector<BlockCopy> demote = {{6, 1, 8}, {8, 3, 8}};
    const std::vector<BlockCopy> reuse = {{0, 6, 8}, {1, 8, 8}};
    const std::vector<BlockCopy> promote = {{1, 6, 8}, {3, 8, 8}};
    REQUIRE(gpu->demote(demote).ok());
    REQUIRE(gpu->copy_blocks(reuse).ok());
    REQUIRE(gpu->synchronize().ok());
    CHECK(device_bytes(*gpu) != before_swap);
    REQUIRE(gpu->promote(promote).ok());
    REQUIRE(gpu->synchronize().ok());
    CHECK(device_bytes(*gpu) == before_swap);

    // An exchange trades device and host blocks; a second one trades them back.
    const std::vector<uint8_t> host_before = host_bytes_of(*gpu);
    const std::vector<BlockCopy> exchange = {{2, 4, 8}, {7, 0, 8}};
    REQUIRE(gpu->exchange(exchange).ok());
    REQUIRE(gpu->synchronize().ok());
    CHECK(device_bytes(*gpu) != before_swap);
    REQUIRE(gpu->exchange(exchange).ok());
    REQUIRE(gpu->synchronize().ok());
    CHECK(device_bytes(*gpu) == before_swap);
    CHECK(host_bytes_of(*gpu) == host_before);
  }
}

TEST_CASE("CUDA state storage: restore, fork and swap copies of state slots match the CPU",
          "[gpu]") {
  if (!have_gpu()) return;
  // 3 layers of 48 fp32 conv + 16 fp32 recurrent elements: 256 bytes a layer's slot.
  const StateShape shape{.num_layers = 3,
                         .conv_elements = 48,
                         .recurrent_elements = 16,
                         .conv_dtype = DType::kFloat32,
                         .recurrent_dtype = DType::kFloat32};
  absl::StatusOr<KvStorage> gpu =
      KvStorage::create_state(shape, 8, {.device = Device::kCuda, .num_host_blocks = 3});
  absl::StatusOr<KvStorage> cpu =
      KvStorage::create_state(shape, 8, {.device = Device::kCpu, .num_host_blocks = 3});
  REQUIRE(gpu.ok());
  REQUIRE(cpu.ok());
  std::mt19937 rng(5);
  std::vector<uint8_t> bytes(cpu->bytes());
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  std::memcpy(cpu->state(0, 0), bytes.data(), bytes.size());
  CUDA_REQUIRE(cudaMemcpy(gpu->state(0, 0), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  auto device_bytes = [&](const KvStorage& s) {
    std::vector<uint8_t> all(s.bytes());
    CUDA_REQUIRE(cudaMemcpy(all.data(), s.state(0, 0), all.size(), cudaMemcpyDeviceToHost));
    return all;
  };
  auto cpu_bytes = [&](const KvStorage& s) {
    return std::vector<uint8_t>(s.state(0, 0), s.state(0, 0) + s.bytes());
  };
  // Two steps as the manager issues them: swap a slot out, restore a checkpoint and fork
  // a slot; then swap it back in over another.
  StepOps step;
  step.swap_out = {{.src = 6, .dst = 1, .num_tokens = 16}, {.src = 2, .dst = 0, .num_tokens = 16}};
  step.copy_state = {{.src = 3, .dst = 6, .num_tokens = 16},
                     {.src = 0, .dst = 5, .num_tokens = 16}};
  StepOps back;
  back.swap_in = {{.src = 1, .dst = 7, .num_tokens = 16}, {.src = 0, .dst = 4, .num_tokens = 16}};
  for (const StepOps* ops : {&step, &back}) {
    REQUIRE(cpu->run_step_ops(*ops).ok());
    REQUIRE(gpu->run_step_ops(*ops).ok());
    REQUIRE(gpu->synchronize().ok());
    CHECK(device_bytes(*gpu) == cpu_bytes(*cpu));
  }
  CHECK(cpu_bytes(*cpu) != bytes);
}

#endif  // PAGEDKV_HAVE_CUDA

}  // namespace
}  // namespace pagedkv
