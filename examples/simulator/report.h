// File: examples/simulator/report.h
//
// The simulator's outputs: a text table for the terminal, a JSON file with every figure
// and series, and one SVG chart (utilization and concurrency over time, one line per
// allocator, one row of panels per trace) that opens in any browser.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_REPORT_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cluster.h"
#include "engine.h"
#include "eviction.h"
#include "hybrid.h"
#include "state_study.h"
#include "trace.h"

namespace pagedkv::sim {

// One trace replayed against every allocator.
struct TraceRun {
  std::string trace;
  int64_t requests = 0;
  ClampStats clamp;
  double time_scale = 1;      // arrivals divided by this
  int64_t budget_tokens = 0;  // KV slots of the device budget
  double budget_gib = 0;
  int32_t max_model_len = 0;
  double host_cache_gib = 0;  // host tier behind paged+prefix (0: none)
  std::vector<EngineResult> results;
};

struct SimReport {
  std::string model;  // KV spec in words
  int64_t bytes_per_token = 0;
  bool quick = false;
  std::vector<TraceRun> runs;
  std::string eviction_trace;  // empty: no eviction study
  std::vector<EvictionRow> eviction;
  std::vector<TierRow> tiers;  // the tier study on the same trace
  TierCostModel tier_costs;
  std::vector<HybridUtilRun> hybrid_util;  // the hybrid-model study (hybrid.h)
  std::vector<HybridHitStudy> hybrid_hits;
  std::vector<StateStudy> state_hits;   // the state-layer study (state_study.h)
  std::vector<ClusterResult> clusters;  // cluster mode (cluster.h): one per trace
};

// 1234567 -> "1,234,567".
std::string commas(int64_t n);

// The engine results of one trace as an aligned text table.
std::string format_run_table(const TraceRun& run);

// The eviction study as a text table (hit rates and the gap to the optimum).
std::string format_eviction_table(const std::vector<EvictionRow>& rows);

// The tier study as a text table (hit rate by tier, the single-pool LRU of the same
// total, bytes promoted and demoted per second of trace, blocks dropped), then promotion
// against recompute per block at each link of `costs`.
std::string format_tier_table(const std::vector<TierRow>& rows, const TierCostModel& costs);

// The eviction-policy study (LRU, the adaptive policy, Belady, ghost hits) and the host
// tier's admission rule, as text tables.
std::string format_policy_table(const std::vector<PolicyRow>& rows);
std::string format_admission_table(const AdmissionRow& row);

std::string to_json(const SimReport& report);

// An SVG of utilization (left) and concurrency (right) over simulated time.
std::string to_svg(const SimReport& report);

// Writes `text` to `path`. Errors: Internal naming the path.
[[nodiscard]] absl::Status write_text_file(const std::string& path, const std::string& text);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_REPORT_H_
