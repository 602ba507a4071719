// CUDA paged decode attention benchmark: microseconds, bytes moved and percentage of peak
// HBM bandwidth for three grids:
//   gqa     batch {1, 16, 64, 256} x context {512, 2K, 8K, 32K} x GQA group {1, 4, 8} x KV
//           {bf16, fp8 e4m3} (q/out bf16, 8 KV heads, head_dim 128, block_size 16, split-K
//           planned automatically), then block sizes 8 and 32 at batch 64 x 8K; bytes are
//           q + k + v + o;
//   window  sliding windows of 1024 and 4096 tokens and chunked local attention of 8192
//           (group 8, bf16) at batch {1, 16, 64} x context {8K, 32K}; bytes are what the
//           window reads, and beside each figure the time of full attention over as many
//           tokens (the claim: the cost follows the window, not the context);
//   mla     DeepSeek-V2/V3 MLA decode (latent 512 + 64, bf16 q) at batch {1, 16, 64, 128}
//           x context {2K, 8K, 32K} x heads {16, 32, 64, 128} x latent {bf16, fp8} in
//           blocks of 64 (FlashMLA's), then blocks of 16 at batch 64 x 8K; bytes are the
//           latents + q + o.
// Beside every gqa and mla figure: PyTorch SDPA on contiguous bf16 KV of the same shape
// (for MLA: SDPA over the latent as a single-KV-head MQA of head dim 576, value 512), when
// a file of its timings is given (bench/sdpa_contiguous.py writes them), and the ratio.
//
// Method: cold L2 (each run reads a different set of blocks: the runs rotate over enough
// disjoint block tables to cover 3x the L2 size), no reused blocks (every sequence's
// blocks are distinct, a random permutation of the pool), each run timed with CUDA events
// around one CUDA-graph launch of the call (no host overhead inside the interval), median
// of at least 100 runs after warm-up.
//
// This file is the measurement; main(), its flags (--json, --runs, --peak_gbps, --sdpa,
// --sdpa_mla, --grids; see --help), the targets and the JSON file are in
// decode_kernel_bench_main.cc.
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
#include "pagedkv/block_table.h"
#include "pagedkv/decode_plan.h"
#include "pagedkv/layer_group.h"
#include "pagedkv/numeric.h"

namespace pagedkv::bench {
namespace {

using pagedkv::AttentionKind;
using pagedkv::DType;

constexpr int32_t kHeadDim = 128;
constexpr int32_t kNumKvHeads = 8;
constexpr int32_t kMlaDim = 576;  // DeepSeek-V2/V3 latent: kv_lora_rank 512 + rope 64
constexpr int32_t kMlaRank = 512;

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
  // for 3x L2 of rotation, whichever is larger. MLA's latents (at most 4.8 GB) use the K
  // pool.
  const int64_t largest = int64_t{256} * 32768 * kNumKvHeads * kHeadDim * 2;  // per pool
  const int64_t pool_bytes = std::max<int64_t>(largest, int64_t{3} * l2_bytes);
  void* k_pool = nullptr;
  void* v_pool = nullptr;
  CHECK_CUDA(cudaMalloc(&k_pool, pool_bytes));
  CHECK_CUDA(cudaMalloc(&v_pool, pool_bytes));
  fill(k_pool, pool_bytes, 1);
  fill(v_pool, pool_bytes, 2);
  const int64_t max_q =
      std::max<int64_t>(int64_t{256} * kNumKvHeads * 8 * kHeadDim, int64_t{128} * 128 * kMlaDim);
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

  // Block tables of `rotations` disjoint random block sets on the device: per rotation,
  // `batch` rows of `max_blocks` entries of which the first `released` are kPaddingBlock
  // (a windowed group's blocks before the window) and the rest distinct pool blocks.
  struct Tables {
    int32_t* device = nullptr;
    int32_t* lens = nullptr;
    int64_t stride = 0;  // entries between rotations
    int32_t rotations = 1;
  };
  auto make_tables = [&](int32_t pool_blocks, int32_t batch, int32_t context, int32_t block_size,
                         int32_t released, int64_t bytes_per_run) {
    Tables t;
    const int32_t max_blocks = context / block_size;
    const int64_t needed = int64_t{batch} * (max_blocks - released);
    t.rotations = static_cast<int32_t>(std::clamp<int64_t>(
        std::min<int64_t>((int64_t{3} * l2_bytes + bytes_per_run - 1) / bytes_per_run,
                          pool_blocks / needed),
        1, 64));
    std::vector<int32_t> ids(pool_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    t.stride = int64_t{batch} * max_blocks;
    std::vector<int32_t> tables(t.stride * t.rotations, pagedkv::kPaddingBlock);
    int64_t next = 0;
    for (int64_t row = 0; row < int64_t{batch} * t.rotations; ++row) {
      for (int32_t e = released; e < max_blocks; ++e) tables[row * max_blocks + e] = ids[next++];
    }
    const std::vector<int32_t> lens(batch, context);
    CHECK_CUDA(cudaMalloc(&t.device, sizeof(int32_t) * tables.size()));
    CHECK_CUDA(cudaMalloc(&t.lens, sizeof(int32_t) * batch));
    CHECK_CUDA(cudaMemcpy(t.device, tables.data(), sizeof(int32_t) * tables.size(),
                          cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(t.lens, lens.data(), sizeof(int32_t) * batch, cudaMemcpyHostToDevice));
    return t;
  };
  auto free_tables = [](Tables& t) {
    CHECK_CUDA(cudaFree(t.device));
    CHECK_CUDA(cudaFree(t.lens));
  };

  // Median microseconds of `call(table, stream)` (returning absl::Status) over the
  // rotations of `tables`: one CUDA graph per rotation, direct calls if capture is refused.
  struct Timing {
    double us;
    bool graph;
  };
  auto time_call = [&](pagedkv::BlockTableView table, const Tables& tables, auto&& call) {
    std::vector<cudaGraphExec_t> graphs;
    bool use_graph = true;
    for (int32_t r = 0; r < tables.rotations && use_graph; ++r) {
      table.block_table = tables.device + r * tables.stride;
      cudaGraph_t graph;
      if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        use_graph = false;
        break;
      }
      const absl::Status st = call(table, stream);
      const cudaError_t end = cudaStreamEndCapture(stream, &graph);
      cudaGraphExec_t exec;
      if (!st.ok() || end != cudaSuccess || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
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
      table.block_table = tables.device + r * tables.stride;
      const absl::Status st = call(table, stream);
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        std::exit(1);
      }
    };
    for (int i = 0; i < 5; ++i) launch(i % tables.rotations);
    std::vector<float> times;
    for (int i = 0; i < runs; ++i) {
      CHECK_CUDA(cudaEventRecord(start, stream));
      launch(i % tables.rotations);
      CHECK_CUDA(cudaEventRecord(stop, stream));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      times.push_back(ms);
    }
    for (cudaGraphExec_t g : graphs) cudaGraphExecDestroy(g);
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    return Timing{1000.0 * times[times.size() / 2], use_graph};
  };

  std::printf("%-14s %-5s %-7s %-5s %-5s %-3s %-6s %10s %12s %7s %10s %7s\n", "kind", "batch",
              "context", "group", "kv", "bs", "splits", "us", "MB moved", "% peak", "base us",
              "ratio");
  auto report = [&](const DecodeBenchResult& r) {
    run.results.push_back(r);
    const double base = r.full_us > 0 ? r.full_us : r.sdpa_us;
    char ratio[48] = "-";
    if (base > 0) std::snprintf(ratio, sizeof(ratio), "%10.2f %6.2fx", base, r.us / base);
    std::string kind = r.kind;
    // append, not "/" + s: GCC 12 at -O3 gives a false -Wrestrict error on operator+.
    if (r.window > 0) kind.append("/").append(std::to_string(r.window));
    std::printf("%-14s %-5d %-7d %-5d %-5s %-3d %-6d %10.2f %12.2f %6.1f%% %s%s\n", kind.c_str(),
                r.batch, r.context, r.group, r.kv == "fp8_e4m3" ? "fp8" : r.kv.c_str(),
                r.block_size, r.num_splits, r.us, r.bytes / 1e6, r.pct, ratio,
                r.graph ? "" : " (direct launch)");
    std::fflush(stdout);
  };
  auto pct_of = [&](double bytes, double us) {
    return 100.0 * bytes / (us * 1e-6) / (peak_gbps * 1e9);
  };

  // GQA decode of one (kind, window, KV dtype, block size, batch, context) for every group;
  // returns the median of each group.
  auto measure = [&](AttentionKind kind, int32_t window, DType kv_dtype, int32_t block_size,
                     int32_t batch, int32_t context, const std::vector<int32_t>& group_list,
                     bool record, double full_us) {
    const int64_t elem = pagedkv::bytes_per_element(kv_dtype);
    const int64_t block_bytes = int64_t{kNumKvHeads} * block_size * kHeadDim * elem;
    const int32_t pool_blocks = static_cast<int32_t>(pool_bytes / block_bytes);
    const pagedkv::KvCacheView view = pagedkv::make_kv_cache_view(
        k_pool, v_pool, kv_dtype, pool_blocks, kNumKvHeads, block_size, kHeadDim);
    // The window of the last token: what a windowed call reads.
    const int32_t first =
        static_cast<int32_t>(pagedkv::first_attended(kind, window, int64_t{context} - 1));
    const int32_t released = first / block_size;
    const int64_t kv_bytes = int64_t{batch} * (context - first) * kNumKvHeads * kHeadDim * elem * 2;
    Tables tables = make_tables(pool_blocks, batch, context, block_size, released, kv_bytes);
    std::vector<double> times;
    for (int32_t group : group_list) {
      const int32_t hq = kNumKvHeads * group;
      const bool fp8 = kv_dtype == DType::kFloat8E4M3;
      const pagedkv::DecodeArgs args{.q = q,
                                     .out = out,
                                     .dtype = DType::kBFloat16,
                                     .num_q_heads = hq,
                                     .maybe_k_scale = fp8 ? d_scales : nullptr,
                                     .maybe_v_scale = fp8 ? d_scales + 1 : nullptr,
                                     .max_context_len = context,
                                     .total_context_len = int64_t{batch} * context,
                                     .kind = kind,
                                     .window = window};
      const pagedkv::BlockTableView table{tables.device, tables.lens, batch, context / block_size,
                                          block_size};
      const pagedkv::DecodePlan plan =
          pagedkv::plan_decode_for(pagedkv::Device::kCuda, view, table, args);
      const int64_t ws_bytes = pagedkv::decode_workspace_bytes(plan, batch, hq, kHeadDim);
      void* workspace = nullptr;
      if (ws_bytes > 0) CHECK_CUDA(cudaMalloc(&workspace, ws_bytes));
      const pagedkv::DecodeOptions options{
          .num_splits = plan.num_splits, .maybe_workspace = workspace, .workspace_bytes = ws_bytes};
      const Timing t =
          time_call(table, tables, [&](const pagedkv::BlockTableView& tv, cudaStream_t s) {
            return pagedkv::paged_decode_attention(pagedkv::Device::kCuda, view, tv, args, options,
                                                   s);
          });
      if (workspace != nullptr) CHECK_CUDA(cudaFree(workspace));
      times.push_back(t.us);
      if (!record) continue;
      const double bytes = static_cast<double>(kv_bytes) + 2.0 * batch * hq * kHeadDim * 2;
      const auto base = config.sdpa_us.find({batch, context, group});
      const bool full = kind == AttentionKind::kFull;
      report({.kind = full ? "gqa" : pagedkv::attention_kind_name(kind),
              .batch = batch,
              .context = context,
              .group = group,
              .block_size = block_size,
              .window = full ? 0 : window,
              .kv = pagedkv::dtype_name(kv_dtype),
              .num_splits = plan.num_splits,
              .us = t.us,
              .bytes = bytes,
              .pct = pct_of(bytes, t.us),
              .graph = t.graph,
              .sdpa_us = full && base != config.sdpa_us.end() ? base->second : 0.0,
              .full_us = full_us});
    }
    free_tables(tables);
    return times;
  };

  // MLA decode of one (latent dtype, block size, batch, context) for every head count.
  auto measure_mla = [&](DType kv_dtype, int32_t block_size, int32_t batch, int32_t context,
                         const std::vector<int32_t>& head_list) {
    const int64_t elem = pagedkv::bytes_per_element(kv_dtype);
    const int64_t block_bytes = int64_t{block_size} * kMlaDim * elem;
    const int32_t pool_blocks = static_cast<int32_t>(pool_bytes / block_bytes);
    const pagedkv::KvCacheView view =
        pagedkv::make_kv_cache_view(k_pool, nullptr, kv_dtype, pool_blocks, 1, block_size, kMlaDim);
    const int64_t kv_bytes = int64_t{batch} * context * kMlaDim * elem;
    Tables tables = make_tables(pool_blocks, batch, context, block_size, 0, kv_bytes);
    for (int32_t heads : head_list) {
      const bool fp8 = kv_dtype == DType::kFloat8E4M3;
      const pagedkv::MlaDecodeArgs args{.q = q,
                                        .out = out,
                                        .dtype = DType::kBFloat16,
                                        .num_heads = heads,
                                        .kv_lora_rank = kMlaRank,
                                        .qk_rope_head_dim = kMlaDim - kMlaRank,
                                        .sm_scale = 0.07216878f,  // 1 / sqrt(192)
                                        .maybe_kv_scale = fp8 ? d_scales : nullptr,
                                        .max_context_len = context,
                                        .total_context_len = int64_t{batch} * context};
      const pagedkv::BlockTableView table{tables.device, tables.lens, batch, context / block_size,
                                          block_size};
      const pagedkv::DecodePlan plan =
          pagedkv::plan_mla_decode_for(pagedkv::Device::kCuda, view, table, args);
      const int64_t ws_bytes = pagedkv::decode_workspace_bytes(plan, batch, heads, kMlaRank);
      void* workspace = nullptr;
      if (ws_bytes > 0) CHECK_CUDA(cudaMalloc(&workspace, ws_bytes));
      const pagedkv::DecodeOptions options{
          .num_splits = plan.num_splits, .maybe_workspace = workspace, .workspace_bytes = ws_bytes};
      const Timing t =
          time_call(table, tables, [&](const pagedkv::BlockTableView& tv, cudaStream_t s) {
            return pagedkv::paged_mla_decode(pagedkv::Device::kCuda, view, tv, args, options, s);
          });
      if (workspace != nullptr) CHECK_CUDA(cudaFree(workspace));
      const double bytes =
          static_cast<double>(kv_bytes) + 2.0 * batch * heads * (kMlaDim + kMlaRank);
      const auto base = config.sdpa_mla_us.find({batch, context, heads});
      report({.kind = "mla",
              .batch = batch,
              .context = context,
              .group = heads,
              .block_size = block_size,
              .window = 0,
              .kv = pagedkv::dtype_name(kv_dtype),
              .num_splits = plan.num_splits,
              .us = t.us,
              .bytes = bytes,
              .pct = pct_of(bytes, t.us),
              .graph = t.graph,
              .sdpa_us = base != config.sdpa_mla_us.end() ? base->second : 0.0,
              .full_us = 0.0});
    }
    free_tables(tables);
  };

  if (config.grids.gqa) {
    for (DType kv_dtype : kv_dtypes) {
      for (int32_t batch : batches) {
        for (int32_t context : contexts) {
          measure(AttentionKind::kFull, 0, kv_dtype, 16, batch, context, groups, true, 0.0);
        }
      }
    }
    for (int32_t block_size : {8, 32}) {
      measure(AttentionKind::kFull, 0, DType::kBFloat16, block_size, 64, 8192, groups, true, 0.0);
    }
  }
  if (config.grids.window) {
    const std::pair<AttentionKind, int32_t> windows[] = {{AttentionKind::kSlidingWindow, 1024},
                                                         {AttentionKind::kSlidingWindow, 4096},
                                                         {AttentionKind::kChunkedLocal, 8192}};
    for (auto [kind, window] : windows) {
      for (int32_t batch : {1, 16, 64}) {
        for (int32_t context : {8192, 32768}) {
          // Full attention over as many tokens as the window reads, for the ratio.
          const int32_t read = context - static_cast<int32_t>(pagedkv::first_attended(
                                             kind, window, int64_t{context} - 1));
          const double full_us = measure(AttentionKind::kFull, 0, DType::kBFloat16, 16, batch, read,
                                         {8}, false, 0.0)[0];
          measure(kind, window, DType::kBFloat16, 16, batch, context, {8}, true, full_us);
        }
      }
    }
  }
  if (config.grids.mla) {
    for (DType kv_dtype : kv_dtypes) {
      for (int32_t batch : {1, 16, 64, 128}) {
        for (int32_t context : {2048, 8192, 32768}) {
          measure_mla(kv_dtype, 64, batch, context, {16, 32, 64, 128});
        }
      }
    }
    measure_mla(DType::kBFloat16, 16, 64, 8192, {16, 128});
  }

  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  CHECK_CUDA(cudaStreamDestroy(stream));
  for (void* p : {k_pool, v_pool, q, out, static_cast<void*>(d_scales)}) CHECK_CUDA(cudaFree(p));
  return run;
}

}  // namespace pagedkv::bench
