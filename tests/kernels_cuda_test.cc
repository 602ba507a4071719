// CUDA-only behaviour of the kernels: a caller workspace, CUDA graph capture and replay.
// The cases every backend runs (write_kv, decode, extend, windows, sinks, MLA, argument
// errors, each checked against the fp64 and CPU references) are in attention_test.cc and
// attention_mla_test.cc; these need CUDA streams and graphs, so they are compiled only
// with CUDA and report themselves skipped without a device.
#include <catch2/catch.hpp>

#if PAGEDKV_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "pagedkv/attention.h"
#include "support/backends.h"

namespace pagedkv {
namespace {

using testing::AttentionCase;
using testing::AttentionFixture;
using testing::BackendMemory;
using testing::Run;
using testing::run_attention;

#define CUDA_REQUIRE(expr) REQUIRE((expr) == cudaSuccess)

TEST_CASE("CUDA decode uses a caller workspace and refuses one too small", "[gpu]") {
  if (!testing::cuda_usable()) return;
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
  BackendMemory mem(Device::kCuda);
  uint8_t* workspace = mem.filled<uint8_t>(need, 0);
  const Run with = run_attention(
      Device::kCuda, f, {.num_splits = 6, .maybe_workspace = workspace, .workspace_bytes = need});
  const Run without = run_attention(Device::kCuda, f, {.num_splits = 6});
  CHECK(with.out == without.out);
  const auto [cache, table] = testing::place_cache(mem, f);
  const absl::Status s = paged_decode_attention(
      Device::kCuda, cache, table,
      {.q = mem.place(f.q),
       .out = mem.filled<uint8_t>(f.q.size(), 0),
       .dtype = c.q_dtype,
       .num_q_heads = 8,
       .max_context_len = 1000},
      {.num_splits = 6, .maybe_workspace = workspace, .workspace_bytes = need - 1});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("workspace of " + std::to_string(need - 1) + " bytes") !=
        std::string::npos);
}

TEST_CASE("CUDA decode replays from a CUDA graph with the same output", "[gpu]") {
  if (!testing::cuda_usable()) return;
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
  const Run direct = run_attention(Device::kCuda, f, {.num_splits = 8});
  BackendMemory mem(Device::kCuda);
  const auto [cache, table] = testing::place_cache(mem, f);
  uint8_t* out = mem.filled<uint8_t>(f.q.size(), 0);
  const float* scales = mem.place(std::vector<float>{f.k_scale, f.v_scale});
  const DecodePlan plan{.num_splits = 8};
  const int64_t need = decode_workspace_bytes(plan, 4, 32, 128);
  uint8_t* workspace = mem.filled<uint8_t>(need, 0);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status s = paged_decode_attention(
      Device::kCuda, cache, table,
      {.q = mem.place(f.q),
       .out = out,
       .dtype = c.q_dtype,
       .num_q_heads = 32,
       .maybe_k_scale = scales,
       .maybe_v_scale = scales + 1,
       .max_context_len = 3000},
      {.num_splits = 8, .maybe_workspace = workspace, .workspace_bytes = need}, stream);
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  REQUIRE(s.ok());
  cudaGraphExec_t exec;
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(testing::to_doubles(mem.read(out, f.q.size()), c.q_dtype) == direct.out);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE("CUDA decode refuses to grow the library workspace during graph capture", "[gpu]") {
  if (!testing::cuda_usable()) return;
  AttentionCase c{.head_dim = 128,
                  .block_size = 16,
                  .num_q_heads = 32,
                  .num_kv_heads = 8,
                  .q_dtype = DType::kBFloat16,
                  .kv_dtype = DType::kBFloat16};
  c.lens.assign(32, 2048);
  AttentionFixture f = testing::make_fixture(c);
  BackendMemory mem(Device::kCuda);
  const auto [cache, table] = testing::place_cache(mem, f);
  const DecodeArgs args{.q = mem.place(f.q),
                        .out = mem.filled<uint8_t>(f.q.size(), 0),
                        .dtype = c.q_dtype,
                        .num_q_heads = 32,
                        .max_context_len = 2048};
  const int32_t splits = 128;  // 128 x 32 x 32 x 130 x 4 bytes = 68 MB of partials
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status s =
      paged_decode_attention(Device::kCuda, cache, table, args, {.num_splits = splits}, stream);
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(s.message().find("capturing") != std::string::npos);
  cudaGraphDestroy(graph);
  // Outside a capture the same call grows the workspace and runs; a later capture reuses it.
  REQUIRE(paged_decode_attention(Device::kCuda, cache, table, args, {.num_splits = splits}, stream)
              .ok());
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status again =
      paged_decode_attention(Device::kCuda, cache, table, args, {.num_splits = splits}, stream);
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  CHECK(again.ok());
  cudaGraphDestroy(graph);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace pagedkv

#endif  // PAGEDKV_HAVE_CUDA
