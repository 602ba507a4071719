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

using Shape = std::tuple<int32_t, int32_t, int32_t>;  // batch, context, group

struct DecodeBenchConfig {
  int32_t runs = 100;               // timed runs per configuration, >= 100 (median)
  double peak_gbps = 4800.0;        // HBM bandwidth that 100 % stands for
  std::map<Shape, double> sdpa_us;  // contiguous PyTorch SDPA baseline, microseconds
};

// One configuration's median time.
struct DecodeBenchResult {
  int32_t batch, context, group, block_size;
  std::string kv;  // KV dtype name
  int32_t num_splits;
  double us, bytes, pct;  // median microseconds, bytes moved, % of peak bandwidth
  bool graph;             // timed as a CUDA-graph launch (else direct calls)
  double sdpa_us;         // 0 when no baseline was given
};

struct DecodeBenchRun {
  std::string device;  // the device's name
  std::vector<DecodeBenchResult> results;
};

// Times every configuration on the current CUDA device (one must be available), printing
// the device and each result as a table line as it goes.
DecodeBenchRun run_decode_kernel_bench(const DecodeBenchConfig& config);

}  // namespace pagedkv::bench

#endif  // PAGEDKV_BENCH_DECODE_KERNEL_BENCH_H_
