// CUDA paged decode attention benchmark: microseconds, bytes moved (q + k + v + o) and
// percentage of peak HBM bandwidth for batch {1, 16, 64, 256} x context {512, 2K, 8K,
// 32K} x GQA group {1, 4, 8} x KV {bf16, fp8 e4m3} (q/out bf16, 8 KV heads, head_dim 128,
// block_size 16, split-K planned automatically), then block sizes 8 and 32 at batch 64 x
// 8K. Beside every figure: PyTorch SDPA on contiguous bf16 KV of the same shape, when a
// file of its timings is given (bench/sdpa_contiguous.py writes one), and the time ratio.
//
// Method: cold L2 (each run reads a different set of blocks: the runs rotate over enough
// disjoint block tables to cover 3x the L2 size), no reused blocks (every sequence's
// blocks are distinct, a random permutation of the pool), each run timed with CUDA events
// around one CUDA-graph launch of the call (no host overhead inside the interval), median
// of at least 100 runs after warm-up.
//
// This file is the measurement; main(), its flags (--json, --runs, --peak_gbps, --sdpa;
// see --help), the targets and the JSON file are in decode_kernel_bench_main.cc.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "decode_kernel_bench.h"
#include "pagedkv/attention.h"
#include "pagedkv/decode_plan.h"
#include "pagedkv/numeric.h"

namespace pagedkv::bench {
namespace {

using pagedkv::DType;

constexpr int32_t kHeadDim = 128;
constexpr int32_t kNumKvHeads = 8;

#define CHECK_CUDA(expr)                                                 \
  do {                                                                   \
    const cudaError_t err_ = (expr);                                     \
    if (err_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(err_));                            \
      std::exit(1);                                                      \
    }                                                                    \
  } while (false)

// Bytes in [0, 0x3f]: finite whether read as bf16 pairs or as fp8 e4m3.
__global__ void fill_kernel(uint8_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = static_cast<uint8_t>(x & 0x3fu);
  }
}

void fill(void* p, int64_t bytes, uint32_t seed) {
  fill_kernel<<<1024, 256>>>(static_cast<uint8_t*>(p), bytes, seed);
  CHECK_CUDA(cudaGetLastError());
}

}  // namespace

DecodeBenchRun run_decode_kernel_bench(const DecodeBenchConfig& config) {
  const int32_t runs = config.runs;
  const double peak_gbps = config.peak_gbps;
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  int l2_bytes = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  std::printf("device: %s, %d SMs, L2 %d MiB, peak %.0f GB/s\n", prop.name,
              prop.multiProcessorCount, l2_bytes >> 20, peak_gbps);

  const std::vector<int32_t> batches = {1, 16, 64, 256};
  const std::vector<int32_t> contexts = {512, 2048, 8192, 32768};
  const std::vector<int32_t> groups = {1, 4, 8};
  const std::vector<DType> kv_dtypes = {DType::kBFloat16, DType::kFloat8E4M3};

  // One K and one V pool sized for the largest configuration (bf16, batch 256 x 32K), or
  // for 3x L2 of rotation, whichever is larger.
  const int64_t largest = int64_t{256} * 32768 * kNumKvHeads * kHeadDim * 2;  // per pool
  const int64_t pool_bytes = std::max<int64_t>(largest, int64_t{3} * l2_bytes);
  void* k_pool = nullptr;
  void* v_pool = nullptr;
  CHECK_CUDA(cudaMalloc(&k_pool, pool_bytes));
  CHECK_CUDA(cudaMalloc(&v_pool, pool_bytes));
  fill(k_pool, pool_bytes, 1);
  fill(v_pool, pool_bytes, 2);
  const int32_t max_q = 256 * kNumKvHeads * 8 * kHeadDim;
  void* q = nullptr;
  void* out = nullptr;
  CHECK_CUDA(cudaMalloc(&q, sizeof(uint16_t) * max_q));
  CHECK_CUDA(cudaMalloc(&out, sizeof(uint16_t) * max_q));
  fill(q, sizeof(uint16_t) * max_q, 3);
  const float scales[2] = {0.05f, 0.05f};
  float* d_scales = nullptr;
  CHECK_CUDA(cudaMalloc(&d_scales, sizeof(scales)));
  CHECK_CUDA(cudaMemcpy(d_scales, scales, sizeof(scales), cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::mt19937 rng(7);
  DecodeBenchRun run{.device = prop.name, .results = {}};

  std::printf("%-5s %-7s %-5s %-5s %-3s %-6s %10s %12s %7s %10s %7s\n", "batch", "context", "group",
              "kv", "bs", "splits", "us", "MB moved", "% peak", "SDPA us", "ratio");
  // Times one (KV dtype, block size, batch, context) for every group.
  auto measure = [&](DType kv_dtype, int32_t block_size, int32_t batch, int32_t context,
                     const std::vector<int32_t>& group_list) {
    const int64_t elem = pagedkv::bytes_per_element(kv_dtype);
    const int64_t block_bytes = int64_t{kNumKvHeads} * block_size * kHeadDim * elem;
    const int32_t pool_blocks = static_cast<int32_t>(pool_bytes / block_bytes);
    const pagedkv::KvCacheView view = pagedkv::make_kv_cache_view(
        k_pool, v_pool, kv_dtype, pool_blocks, kNumKvHeads, block_size, kHeadDim);
    const int32_t blocks_per_seq = context / block_size;
    const int64_t kv_bytes = int64_t{batch} * context * kNumKvHeads * kHeadDim * elem * 2;
    const int64_t needed = int64_t{batch} * blocks_per_seq;
    const int32_t rotations = static_cast<int32_t>(std::clamp<int64_t>(
        std::min<int64_t>((int64_t{3} * l2_bytes + kv_bytes - 1) / kv_bytes, pool_blocks / needed),
        1, 64));
    // Disjoint random block sets, one table per rotation.
    std::vector<int32_t> ids(pool_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> tables(ids.begin(), ids.begin() + needed * rotations);
    std::vector<int32_t> lens(batch, context);
    int32_t* d_tables = nullptr;
    int32_t* d_lens = nullptr;
    CHECK_CUDA(cudaMalloc(&d_tables, sizeof(int32_t) * tables.size()));
    CHECK_CUDA(cudaMalloc(&d_lens, sizeof(int32_t) * batch));
    CHECK_CUDA(cudaMemcpy(d_tables, tables.data(), sizeof(int32_t) * tables.size(),
                          cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_lens, lens.data(), sizeof(int32_t) * batch, cudaMemcpyHostToDevice));
    for (int32_t group : group_list) {
      const int32_t hq = kNumKvHeads * group;
      const bool fp8 = kv_dtype == DType::kFloat8E4M3;
      pagedkv::DecodeArgs args{.q = q,
                               .out = out,
                               .dtype = DType::kBFloat16,
                               .num_q_heads = hq,
                               .maybe_k_scale = fp8 ? d_scales : nullptr,
                               .maybe_v_scale = fp8 ? d_scales + 1 : nullptr,
                               .max_context_len = context,
                               .total_context_len = int64_t{batch} * context};
      pagedkv::BlockTableView table{d_tables, d_lens, batch, blocks_per_seq, block_size};
      const pagedkv::DecodePlan plan =
          pagedkv::plan_decode_for(pagedkv::Device::kCuda, view, table, args);
      const int64_t ws_bytes = pagedkv::decode_workspace_bytes(plan, batch, hq, kHeadDim);
      void* workspace = nullptr;
      if (ws_bytes > 0) CHECK_CUDA(cudaMalloc(&workspace, ws_bytes));
      const pagedkv::DecodeOptions options{
          .num_splits = plan.num_splits, .maybe_workspace = workspace, .workspace_bytes = ws_bytes};
      // One graph per rotation; fall back to direct calls if capture is refused.
      std::vector<cudaGraphExec_t> graphs;
      bool use_graph = true;
      for (int32_t r = 0; r < rotations && use_graph; ++r) {
        table.block_table = d_tables + int64_t{r} * needed;
        cudaGraph_t graph;
        if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
          use_graph = false;
          break;
        }
        const absl::Status st = pagedkv::paged_decode_attention(pagedkv::Device::kCuda, view, table,
                                                                args, options, stream);
        const cudaError_t end = cudaStreamEndCapture(stream, &graph);
        cudaGraphExec_t exec;
        if (!st.ok() || end != cudaSuccess ||
            cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
          cudaGetLastError();
          use_graph = false;
          break;
        }
        cudaGraphDestroy(graph);
        graphs.push_back(exec);
      }
      auto launch = [&](int32_t r) {
        if (use_graph) {
          CHECK_CUDA(cudaGraphLaunch(graphs[r], stream));
          return;
        }
        table.block_table = d_tables + int64_t{r} * needed;
        const absl::Status st = pagedkv::paged_decode_attention(pagedkv::Device::kCuda, view, table,
                                                                args, options, stream);
        if (!st.ok()) {
          std::fprintf(stderr, "%s\n", st.ToString().c_str());
          std::exit(1);
        }
      };
      for (int i = 0; i < 5; ++i) launch(i % rotations);
      std::vector<float> times;
      for (int i = 0; i < runs; ++i) {
        CHECK_CUDA(cudaEventRecord(start, stream));
        launch(i % rotations);
        CHECK_CUDA(cudaEventRecord(stop, stream));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
      }
      std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
      const double us = 1000.0 * times[times.size() / 2];
      const double bytes = static_cast<double>(kv_bytes) + 2.0 * batch * hq * kHeadDim * 2;
      const double pct = 100.0 * bytes / (us * 1e-6) / (peak_gbps * 1e9);
      const auto base = config.sdpa_us.find({batch, context, group});
      const double sdpa_us = base == config.sdpa_us.end() ? 0.0 : base->second;
      run.results.push_back({batch, context, group, block_size, pagedkv::dtype_name(kv_dtype),
                             plan.num_splits, us, bytes, pct, use_graph, sdpa_us});
      char ratio[48] = "-";
      if (sdpa_us > 0) std::snprintf(ratio, sizeof(ratio), "%10.2f %6.2fx", sdpa_us, us / sdpa_us);
      std::printf("%-5d %-7d %-5d %-5s %-3d %-6d %10.2f %12.2f %6.1f%% %s%s\n", batch, context,
                  group, fp8 ? "fp8" : "bf16", block_size, plan.num_splits, us, bytes / 1e6, pct,
                  ratio, use_graph ? "" : " (direct launch)");
      std::fflush(stdout);
      for (cudaGraphExec_t g : graphs) cudaGraphExecDestroy(g);
      if (workspace != nullptr) CHECK_CUDA(cudaFree(workspace));
    }
    CHECK_CUDA(cudaFree(d_tables));
    CHECK_CUDA(cudaFree(d_lens));
  };
  for (DType kv_dtype : kv_dtypes) {
    for (int32_t batch : batches) {
      for (int32_t context : contexts) measure(kv_dtype, 16, batch, context, groups);
    }
  }
  for (int32_t block_size : {8, 32}) measure(DType::kBFloat16, block_size, 64, 8192, groups);

  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  CHECK_CUDA(cudaStreamDestroy(stream));
  for (void* p : {k_pool, v_pool, q, out, static_cast<void*>(d_scales)}) CHECK_CUDA(cudaFree(p));
  return run;
}

}  // namespace pagedkv::bench
