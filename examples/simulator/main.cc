// pagedkv-sim: replays LLM serving traces against contiguous reservation and pagedkv's
// paged allocator, and runs the LRU-versus-optimal eviction study. See --help.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "fmt/format.h"
#include "simulate.h"

namespace {

using pagedkv::sim::SimOptions;

constexpr const char* kUsage = R"(Usage: pagedkv-sim [options]

Replays traces in simulated time with an engine model and compares allocators:
contiguous-max (reserve max_model_len per request, first fit), contiguous-oracle
(reserve prompt + output), paged and paged+prefix (pagedkv's KvCacheManager) at each
block size. Runs the eviction study (LRU on BlockPool vs Belady) and the tier study
(device + host LRU tiers) on the Mooncake trace.

  --traces-dir DIR      shipped traces (default: $PAGEDKV_TRACES_DIR, else ../shared/traces
                        next to the source tree)
  --trace NAME|PATH     a trace to replay (repeatable; .csv Azure, .jsonl Mooncake,
                        "generated" the generator). Default: the three shipped traces.
  --synthetic           also replay the generated workload (shared system prompts,
                        parallel samples, beams; trace name "generated")
  --gen-requests N      generated workload: requests (default 2000)
  --gen-rate X          generated workload: Poisson arrivals per second (default 20)
  --gen-seed N          generated workload: random seed (default 1)
  --no-eviction         skip the eviction and tier studies
  --quick               first 400 requests of each trace (for tests)
  --max-requests N      first N requests of each trace
  --block-sizes LIST    paged block sizes (default 8,16,32)
  --budget-gib X        device KV budget for every trace (default per trace: Azure 8,
                        Mooncake 64, synthetic 8)
  --time-scale X        divide arrival times by X (default per trace: Azure code 16,
                        conv 8, others 1)
  --max-model-len N     context limit (default per trace: Azure 8192, Mooncake 131072)
  --preemption MODE     recompute (default) or swap
  --swap-gib X          host swap space for --preemption swap (default 4)
  --host-cache-gib X    host tier behind paged+prefix: evicted cached blocks are demoted
                        there and promoted on a hit (default 0: none)
  --host-link-gbps X    host tier promotion bandwidth in GB/s (default 55, PCIe 5.0 x16)
  --step-ms X           decode step time (default 20)
  --prefill-ms-per-1k X prefill time per 1,000 prompt tokens (default 50)
  --max-num-seqs N      running sequences at most (default 512)
  --out-dir DIR         where results.json and results-utilization.svg go (default out/sim)
  --no-progress         no progress line
)";

bool parse_double(absl::string_view s, double* out) { return absl::SimpleAtod(s, out); }

int fail(const std::string& message) {
  std::fprintf(stderr, "pagedkv-sim: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  SimOptions options;
  std::string out_dir = "out/sim";
  bool progress = isatty(STDERR_FILENO) != 0;
  bool quiet_progress = false;
  if (const char* dir = std::getenv("PAGEDKV_TRACES_DIR")) {
    options.traces_dir = dir;
  } else {
    options.traces_dir = std::string(PAGEDKV_SOURCE_DIR) + "/../shared/traces";
  }
  options.engine.measure_allocator_time = true;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= args.size()) return false;
      *out = args[++i];
      return true;
    };
    std::string v;
    double d;
    int64_t n;
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--traces-dir" && value(&v)) {
      options.traces_dir = v;
    } else if (a == "--trace" && value(&v)) {
      options.traces.push_back(v);
    } else if (a == "--synthetic") {
      options.synthetic = true;
    } else if (a == "--gen-requests" && value(&v) && absl::SimpleAtoi(v, &n) && n >= 0 &&
               n <= (1 << 30)) {
      options.synthetic_options.num_requests = static_cast<int32_t>(n);
    } else if (a == "--gen-rate" && value(&v) && parse_double(v, &d) && d > 0) {
      options.synthetic_options.rate_per_s = d;
    } else if (a == "--gen-seed" && value(&v) && absl::SimpleAtoi(v, &n)) {
      options.synthetic_options.seed = static_cast<uint64_t>(n);
    } else if (a == "--no-eviction") {
      options.eviction = false;
    } else if (a == "--quick") {
      options.quick = true;
    } else if (a == "--max-requests" && value(&v) && absl::SimpleAtoi(v, &n) && n > 0) {
      options.max_requests = n;
    } else if (a == "--block-sizes" && value(&v)) {
      options.block_sizes.clear();
      for (absl::string_view part : absl::StrSplit(v, ',')) {
        int32_t bs;
        if (!absl::SimpleAtoi(part, &bs) || bs <= 0) return fail("bad --block-sizes " + v);
        options.block_sizes.push_back(bs);
      }
    } else if (a == "--budget-gib" && value(&v) && parse_double(v, &d) && d > 0) {
      options.budget_gib = d;
    } else if (a == "--time-scale" && value(&v) && parse_double(v, &d) && d > 0) {
      options.time_scale = d;
    } else if (a == "--max-model-len" && value(&v) && absl::SimpleAtoi(v, &n) && n >= 2 &&
               n <= (1 << 30)) {
      options.max_model_len = static_cast<int32_t>(n);
    } else if (a == "--preemption" && value(&v) && (v == "recompute" || v == "swap")) {
      options.preemption_mode =
          v == "swap" ? pagedkv::PreemptionMode::kSwap : pagedkv::PreemptionMode::kRecompute;
    } else if (a == "--swap-gib" && value(&v) && parse_double(v, &d) && d >= 0) {
      options.host_swap_gib = d;
    } else if (a == "--host-cache-gib" && value(&v) && parse_double(v, &d) && d >= 0) {
      options.host_cache_gib = d;
    } else if (a == "--host-link-gbps" && value(&v) && parse_double(v, &d) && d > 0) {
      options.engine.host_link_bytes_per_s = d * 1e9;
    } else if (a == "--step-ms" && value(&v) && parse_double(v, &d) && d > 0) {
      options.engine.step_ms = d;
    } else if (a == "--prefill-ms-per-1k" && value(&v) && parse_double(v, &d) && d >= 0) {
      options.engine.prefill_ms_per_1k_tokens = d;
    } else if (a == "--max-num-seqs" && value(&v) && absl::SimpleAtoi(v, &n) && n > 0 &&
               n <= (1 << 30)) {
      options.engine.max_num_seqs = static_cast<int32_t>(n);
    } else if (a == "--out-dir" && value(&v)) {
      out_dir = v;
    } else if (a == "--no-progress") {
      quiet_progress = true;
    } else {
      return fail("bad argument '" + a + "' (or a missing/invalid value); see --help");
    }
  }
  if (options.traces.empty()) {
    options.traces = {"AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_conv.csv",
                      "synthetic_trace.jsonl"};
  }
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  if (!quiet_progress) {
    options.progress = [&](const std::string& trace, const std::string& allocator, int64_t steps,
                           int64_t done, int64_t total) {
      const auto now = std::chrono::steady_clock::now();
      if (done != total && now - last < std::chrono::milliseconds(250)) return;
      last = now;
      const double secs = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "%s[%6.1fs] %s %-18s step %8lld  requests %6lld/%lld%s",
                   progress ? "\r" : "", secs, trace.c_str(), allocator.c_str(),
                   static_cast<long long>(steps), static_cast<long long>(done),
                   static_cast<long long>(total), progress ? "   " : "\n");
      std::fflush(stderr);
    };
  }
  absl::StatusOr<pagedkv::sim::SimReport> report = pagedkv::sim::run_simulation(options);
  if (!quiet_progress && progress) std::fputc('\n', stderr);
  if (!report.ok()) return fail(std::string(report.status().ToString()));

  fmt::print("KV spec: {}\n\n", report->model);
  for (const pagedkv::sim::TraceRun& run : report->runs) {
    fmt::print("{}\n", pagedkv::sim::format_run_table(run));
  }
  if (!report->eviction.empty()) {
    fmt::print("Eviction study on {} (512-token blocks; block-level prefix hit rate):\n{}\n",
               report->eviction_trace, pagedkv::sim::format_eviction_table(report->eviction));
  }
  if (!report->tiers.empty()) {
    fmt::print(
        "Tier study on {} (device + host LRU tiers against one LRU pool of the same total):\n{}\n",
        report->eviction_trace, pagedkv::sim::format_tier_table(report->tiers, report->tier_costs));
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return fail("cannot create --out-dir " + out_dir + ": " + ec.message());
  const std::string json_path = out_dir + "/results.json";
  const std::string svg_path = out_dir + "/results-utilization.svg";
  if (absl::Status s = pagedkv::sim::write_text_file(json_path, pagedkv::sim::to_json(*report));
      !s.ok()) {
    return fail(std::string(s.ToString()));
  }
  if (absl::Status s = pagedkv::sim::write_text_file(svg_path, pagedkv::sim::to_svg(*report));
      !s.ok()) {
    return fail(std::string(s.ToString()));
  }
  fmt::print("wrote {} and {} ({:.1f}s)\n", json_path, svg_path,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}
