// File: bench/decode_kernel_bench.h
//
// The two halves of decode_kernel_bench: the measurement (decode_kernel_bench.cu, built
// by nvcc) and main() (decode_kernel_bench_main.cc, built by the host compiler: flags,
// the targets, the JSON file), so that Abseil flags stay out of CUDA code.
#ifndef PAGEDKV_BENCH_DECODE_KERNEL_BENCH_H_
#define PAGEDKV_BENCH_DECODE_KERNEL_BENCH_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace pagedkv::bench {

using Shape = std::tuple<int32_t, int32_t, int32_t>;  // batch, context, group (MLA: heads)

// The grids: GQA decode (full attention), windowed decode (sliding window, chunked local)
// and MLA decode.
struct DecodeBenchGrids {
  bool gqa = true;
  bool window = true;
  bool mla = true;
};

struct DecodeBenchConfig {
  int32_t runs = 100;                   // timed runs per configuration, >= 100 (median)
  double peak_gbps = 4800.0;            // HBM bandwidth that 100 % stands for
  std::map<Shape, double> sdpa_us;      // contiguous PyTorch SDPA baseline, microseconds
  std::map<Shape, double> sdpa_mla_us;  // the same for MLA: SDPA over the latent as MQA
  DecodeBenchGrids grids;
};

// One configuration's median time.
struct DecodeBenchResult {
  std::string kind;                           // "gqa", "sliding_window", "chunked_local" or "mla"
  int32_t batch, context, group, block_size;  // group: MLA's head count
  int32_t window;                             // windowed kinds: the window in tokens; else 0
  std::string kv;                             // KV dtype name
  int32_t num_splits;
  double us, bytes, pct;  // median microseconds, bytes moved, % of peak bandwidth
  bool graph;             // timed as a CUDA-graph launch (else direct calls)
  double sdpa_us;         // 0 when no baseline was given
  double full_us;         // windowed kinds: full attention over the window's tokens; else 0
};

struct DecodeBenchRun {
  std::string device;  // the device's name
  std::vector<DecodeBenchResult> results;
};

// Times every configuration of the chosen grids on the current CUDA device (one must be
// available), printing the device and each result as a table line as it goes.
DecodeBenchRun run_decode_kernel_bench(const DecodeBenchConfig& config);

}  // namespace pagedkv::bench

#endif  // PAGEDKV_BENCH_DECODE_KERNEL_BENCH_H_
