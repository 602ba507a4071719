// CUDA-only behaviour of the kernels: a caller workspace, CUDA graph capture and replay;
// and KvStorage copies on the device against the CPU storage.
// The cases every backend runs (write_kv, decode, extend, windows, sinks, MLA, argument
// errors, each checked against the fp64 and CPU references) are in attention_test.cc and
// attention_mla_test.cc; these need CUDA streams and graphs, so they are compiled only
// with CUDA and report themselves skipped without a device.
#include <catch2/catch.hpp>

#if PAGEDKV_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "pagedkv/attention.h"
#include "pagedkv/kv_storage.h"
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

TEST_CASE("CUDA storage is sized from a fraction of free device memory", "[gpu]") {
  if (!testing::cuda_usable()) return;
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

TEST_CASE("CUDA storage: copy-on-write, swap and tier round trips preserve bytes exactly",
          "[gpu]") {
  if (!testing::cuda_usable()) return;
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
  if (!testing::cuda_usable()) return;
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

}  // namespace
}  // namespace pagedkv

#endif  // PAGEDKV_HAVE_CUDA
