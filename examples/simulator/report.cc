#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace pagedkv::sim {

std::string commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

namespace {

using OrderedJson = nlohmann::ordered_json;  // members in the order they are set

// `x` to 6 significant digits, as the report has always printed its figures: nlohmann
// prints the shortest text that reads back as the double, so the file keeps 6 digits, not
// 17. NaN and infinities are not JSON: null.
OrderedJson figure(double x) {
  if (!std::isfinite(x)) return nullptr;
  return std::strtod(fmt::format("{:.6g}", x).c_str(), nullptr);
}

// `x` to `decimals` decimals (the series: time to 10 ms, utilization to 1e-4).
double to_decimals(double x, int decimals) {
  return std::strtod(fmt::format("{:.{}f}", x, decimals).c_str(), nullptr);
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

constexpr const char* kColors[] = {"#d62728", "#ff7f0e", "#1f77b4", "#17becf", "#2ca02c",
                                   "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"};

// A "nice" upper bound for an axis.
double nice_max(double x) {
  if (x <= 0) return 1;
  const double p = std::pow(10, std::floor(std::log10(x)));
  for (double m : {1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0}) {
    if (m * p >= x) return m * p;
  }
  return 10 * p;
}

}  // namespace

std::string format_run_table(const TraceRun& run) {
  std::string out = fmt::format(
      "{}: {} requests, arrivals / {:g}, KV budget {:.2f} GiB = {} token slots, max_model_len "
      "{} ({} prompts truncated, {} outputs clamped)\n",
      run.trace, run.requests, run.time_scale, run.budget_gib, run.budget_tokens, run.max_model_len,
      run.clamp.prompts_truncated, run.clamp.outputs_clamped);
  out += fmt::format("{:<19} {:>6} {:>6} {:>6} {:>7} {:>8} {:>8} {:>7} {:>8} {:>8} {:>9} {:>9}\n",
                     "allocator", "util", "mem", "peak", "mean", "req/s", "latency", "preempt",
                     "prefix", "evict", "ns/step", "done");
  for (const EngineResult& r : run.results) {
    out += fmt::format(
        "{:<19} {:>6.3f} {:>6.3f} {:>6} {:>7.1f} {:>8.3f} {:>7.1f}s {:>7} {:>8.3f} {:>8} {:>9.0f} "
        "{:>9}\n",
        r.allocator, r.mean_utilization, r.mean_memory_use, r.peak_concurrency, r.mean_concurrency,
        r.throughput_rps, r.mean_latency_s, r.preemptions, r.prefix_hit_rate(), r.evictions,
        r.allocator_ns_per_step, fmt::format("{}/{}", r.completed, r.requests));
  }
  if (run.host_cache_gib > 0) {
    out += fmt::format("host tier {:.2f} GiB behind paged+prefix:\n", run.host_cache_gib);
    for (const EngineResult& r : run.results) {
      if (r.blocks_demoted == 0 && r.prefix_host_hit_tokens == 0) continue;
      out += fmt::format(
          "{:<19} prefix hit {:.3f} (host {:.3f}), {} blocks promoted, {} demoted, {} dropped, "
          "{:.1f}s promoting\n",
          r.allocator, r.prefix_hit_rate(),
          r.prefix_query_tokens == 0 ? 0.0
                                     : static_cast<double>(r.prefix_host_hit_tokens) /
                                           static_cast<double>(r.prefix_query_tokens),
          r.blocks_promoted, r.blocks_demoted, r.host_evictions, r.promote_time_s);
    }
  }
  return out;
}

std::string format_eviction_table(const std::vector<EvictionRow>& rows) {
  std::string out = fmt::format("{:>12} {:>10} {:>10} {:>8} {:>10} {:>10}\n", "pool blocks", "LRU",
                                "Belady", "gap", "LRU evict", "MIN evict");
  for (const EvictionRow& row : rows) {
    const std::string size =
        row.infinite ? fmt::format("inf ({})", row.capacity) : fmt::format("{}", row.capacity);
    out +=
        fmt::format("{:>12} {:>10.4f} {:>10.4f} {:>8.4f} {:>10} {:>10}\n", size, row.lru.hit_rate(),
                    row.belady.hit_rate(), row.belady.hit_rate() - row.lru.hit_rate(),
                    row.lru.evictions, row.belady.evictions);
  }
  return out;
}

std::string format_tier_table(const std::vector<TierRow>& rows, const TierCostModel& costs) {
  constexpr double kGB = 1e9;
  std::string out =
      fmt::format("{:>7} {:>7} {:>6} {:>8} {:>8} {:>8} {:>10} {:>8} {:>11} {:>11} {:>9}\n",
                  "device", "host", "retain", "dev hit", "host hit", "combined", "LRU(D+H)", "diff",
                  "promo GB/s", "demo GB/s", "dropped");
  for (const TierRow& row : rows) {
    const TieredReplayResult& t = row.tiered;
    out += fmt::format(
        "{:>7} {:>7} {:>6} {:>8.4f} {:>8.4f} {:>8.4f} {:>10.4f} {:>8.4f} {:>11.3f} {:>11.3f} "
        "{:>9}\n",
        t.size.device_blocks, t.size.host_blocks, t.size.retained_head_blocks, t.device_hit_rate(),
        t.host_hit_rate(), t.hit_rate(), row.single.hit_rate(),
        t.hit_rate() - row.single.hit_rate(), costs.bytes_per_s(t.promotions) / kGB,
        costs.bytes_per_s(t.demotions) / kGB, t.dropped);
  }
  out += fmt::format(
      "Per {}-token block ({:.1f} MiB of KV): recompute {:.2f} ms at {:.0f} prefill tokens/s",
      costs.block_tokens, static_cast<double>(costs.block_bytes) / (1 << 20),
      1e3 * costs.recompute_s(), costs.prefill_tokens_per_s);
  for (const TierCostModel::Link& link : costs.links) {
    out += fmt::format("; promote over {} ({:.0f} GB/s) {:.3f} ms ({:.1f}x faster)", link.name,
                       link.bytes_per_s / kGB, 1e3 * costs.copy_s(link),
                       costs.recompute_s() / costs.copy_s(link));
  }
  return out + "\n";
}

std::string format_policy_table(const std::vector<PolicyRow>& rows) {
  std::string out =
      fmt::format("{:>11} {:>8} {:>8} {:>8} {:>10} {:>11} {:>9} {:>9}\n", "pool blocks", "LRU",
                  "adaptive", "Belady", "x LRU", "gap closed", "B1 hits", "B2 hits");
  for (const PolicyRow& row : rows) {
    const double lru = row.lru.hit_rate();
    out += fmt::format("{:>11} {:>8.4f} {:>8.4f} {:>8.4f} {:>10.3f} {:>11.3f} {:>9} {:>9}\n",
                       row.capacity, lru, row.adaptive.hit_rate(), row.belady.hit_rate(),
                       lru > 0 ? row.adaptive.hit_rate() / lru : 0.0, row.gap_closed(),
                       row.adaptive.recent_ghost_hits, row.adaptive.frequent_ghost_hits);
  }
  return out;
}

std::string format_admission_table(const AdmissionRow& row) {
  std::string out = fmt::format("{:>14} {:>8} {:>8} {:>8} {:>9} {:>12} {:>9} {:>10}\n",
                                "host admission", "dev hit", "host hit", "combined", "demoted",
                                "not admitted", "promoted", "host drops");
  for (auto [name, t] : {std::pair{"kAll", &row.all}, std::pair{"kReused", &row.reused}}) {
    out += fmt::format("{:>14} {:>8.4f} {:>8.4f} {:>8.4f} {:>9} {:>12} {:>9} {:>10}\n", name,
                       t->device_hit_rate(), t->host_hit_rate(), t->hit_rate(), t->demotions,
                       t->not_admitted, t->promotions, t->dropped);
  }
  const double all = row.all.hit_rate();
  out += fmt::format("demotions saved {:.1f} %; combined hit rate {:+.2f} % of demote-all's\n",
                     100 * row.demotions_saved(),
                     all > 0 ? 100 * (row.reused.hit_rate() - all) / all : 0.0);
  return out;
}

namespace {

// One allocator's figures and its series over time.
OrderedJson allocator_json(const EngineResult& r) {
  OrderedJson time_s = OrderedJson::array(), utilization = OrderedJson::array(),
              concurrency = OrderedJson::array();
  for (const SeriesPoint& p : r.series) {
    time_s.push_back(to_decimals(p.time_s, 2));
    utilization.push_back(to_decimals(p.utilization, 4));
    concurrency.push_back(p.concurrency);
  }
  return {
      {"name", r.allocator},
      {"requests", r.requests},
      {"completed", r.completed},
      {"rejected", r.rejected},
      {"steps", r.steps},
      {"sim_time_s", figure(r.sim_time_s)},
      {"mean_utilization", figure(r.mean_utilization)},
      {"mean_memory_use", figure(r.mean_memory_use)},
      {"mean_reserved", figure(r.mean_reserved)},
      {"peak_concurrency", r.peak_concurrency},
      {"mean_concurrency", figure(r.mean_concurrency)},
      {"throughput_rps", figure(r.throughput_rps)},
      {"mean_latency_s", figure(r.mean_latency_s)},
      {"preemptions", r.preemptions},
      {"preemptions_swap", r.preemptions_swap},
      {"prefix_query_tokens", r.prefix_query_tokens},
      {"prefix_hit_tokens", r.prefix_hit_tokens},
      {"prefix_hit_rate", figure(r.prefix_hit_rate())},
      {"evictions", r.evictions},
      {"cow_copies", r.cow_copies},
      {"generated_tokens", r.generated_tokens},
      {"prefix_host_hit_tokens", r.prefix_host_hit_tokens},
      {"blocks_promoted", r.blocks_promoted},
      {"blocks_demoted", r.blocks_demoted},
      {"host_evictions", r.host_evictions},
      {"promote_time_s", figure(r.promote_time_s)},
      {"allocator_ns_per_step", figure(r.allocator_ns_per_step)},
      {"series", {{"time_s", time_s}, {"utilization", utilization}, {"concurrency", concurrency}}}};
}

OrderedJson run_json(const TraceRun& run) {
  OrderedJson allocators = OrderedJson::array();
  for (const EngineResult& r : run.results) allocators.push_back(allocator_json(r));
  return {{"trace", run.trace},
          {"requests", run.requests},
          {"time_scale", figure(run.time_scale)},
          {"budget_tokens", run.budget_tokens},
          {"budget_gib", figure(run.budget_gib)},
          {"max_model_len", run.max_model_len},
          {"host_cache_gib", figure(run.host_cache_gib)},
          {"prompts_truncated", run.clamp.prompts_truncated},
          {"outputs_clamped", run.clamp.outputs_clamped},
          {"allocators", allocators}};
}

OrderedJson eviction_json(const SimReport& report) {
  OrderedJson rows = OrderedJson::array();
  for (const EvictionRow& row : report.eviction) {
    rows.push_back({{"capacity", row.capacity},
                    {"infinite", row.infinite},
                    {"total_blocks", row.lru.total_blocks},
                    {"lru_hit_blocks", row.lru.hit_blocks},
                    {"lru_hit_rate", figure(row.lru.hit_rate())},
                    {"lru_evictions", row.lru.evictions},
                    {"belady_hit_blocks", row.belady.hit_blocks},
                    {"belady_hit_rate", figure(row.belady.hit_rate())},
                    {"belady_evictions", row.belady.evictions}});
  }
  return {{"trace", report.eviction_trace}, {"block_tokens", 512}, {"rows", rows}};
}

OrderedJson tiers_json(const SimReport& report) {
  const TierCostModel& c = report.tier_costs;
  OrderedJson links = OrderedJson::array();
  for (const TierCostModel::Link& link : c.links) {
    links.push_back({{"name", link.name},
                     {"bytes_per_s", figure(link.bytes_per_s)},
                     {"promote_ms", figure(1e3 * c.copy_s(link))}});
  }
  OrderedJson rows = OrderedJson::array();
  for (const TierRow& row : report.tiers) {
    const TieredReplayResult& t = row.tiered;
    rows.push_back({{"device_blocks", t.size.device_blocks},
                    {"host_blocks", t.size.host_blocks},
                    {"retained_head_blocks", t.size.retained_head_blocks},
                    {"total_blocks", t.total_blocks},
                    {"device_hit_blocks", t.device_hit_blocks},
                    {"host_hit_blocks", t.host_hit_blocks},
                    {"hit_rate", figure(t.hit_rate())},
                    {"single_pool_hit_rate", figure(row.single.hit_rate())},
                    {"promotions", t.promotions},
                    {"demotions", t.demotions},
                    {"dropped", t.dropped},
                    {"promoted_bytes_per_s", figure(c.bytes_per_s(t.promotions))},
                    {"demoted_bytes_per_s", figure(c.bytes_per_s(t.demotions))}});
  }
  return {{"trace", report.eviction_trace},
          {"block_tokens", c.block_tokens},
          {"block_bytes", c.block_bytes},
          {"trace_seconds", figure(c.trace_seconds)},
          {"prefill_tokens_per_s", figure(c.prefill_tokens_per_s)},
          {"recompute_ms", figure(1e3 * c.recompute_s())},
          {"links", links},
          {"rows", rows}};
}

OrderedJson groups_json(std::span<const LayerGroup> groups) {
  OrderedJson out = OrderedJson::array();
  for (const LayerGroup& g : groups) {
    out.push_back({{"kind", attention_kind_name(g.kind)},
                   {"window", g.window},
                   {"num_blocks", g.num_blocks}});
  }
  return out;
}

OrderedJson hit_json(const PrefixHits& r) {
  return {{"prompt_tokens", r.prompt_tokens},
          {"hit_tokens", r.hit_tokens},
          {"hit_rate", figure(r.hit_rate())},
          {"recomputed_tokens", r.recomputed_tokens()},
          {"full_hold_tokens", r.full_hold_tokens},
          {"of_full_hold", figure(r.of_full_hold())},
          {"hits", r.hits},
          {"cut_hits", r.cut_hits},
          {"checkpoints_saved", r.checkpoints_saved},
          {"evictions", r.evictions}};
}

OrderedJson hybrid_json(const SimReport& report) {
  OrderedJson util = OrderedJson::array();
  for (const HybridUtilRun& run : report.hybrid_util) {
    util.push_back({{"trace", run.trace},
                    {"model", run.model},
                    {"requests", run.requests},
                    {"budget_bytes", run.budget_bytes},
                    {"target_tokens", run.target_tokens},
                    {"groups", groups_json(run.groups)},
                    {"full_blocks", run.full_blocks},
                    {"headroom_groups", groups_json(run.headroom_groups)},
                    {"hybrid", allocator_json(run.hybrid)},
                    {"headroom", allocator_json(run.headroom)},
                    {"full", allocator_json(run.full)}});
  }
  OrderedJson hits = OrderedJson::array();
  for (const HybridHitStudy& study : report.hybrid_hits) {
    OrderedJson rows = OrderedJson::array();
    for (const HybridHitRow& row : study.rows) {
      OrderedJson r = {{"fraction", figure(row.fraction)},
                       {"budget_bytes", row.budget_bytes},
                       {"groups", groups_json(row.groups)},
                       {"vllm_blocks", row.vllm_blocks}};
      r["manager"] = hit_json(row.manager);
      r["vllm_model"] = hit_json(row.vllm);
      r["cache_split_groups"] = groups_json(row.cache_groups);
      r["cache_split_manager"] = hit_json(row.cache_manager);
      rows.push_back(std::move(r));
    }
    hits.push_back({{"model", study.model},
                    {"trace", study.trace},
                    {"requests", study.requests},
                    {"target_tokens", study.target_tokens},
                    {"footprint_blocks", study.footprint_blocks},
                    {"footprint_bytes", study.footprint_bytes},
                    {"cached_tokens", study.cached_tokens},
                    {"chunk_tokens", study.chunk_tokens},
                    {"checkpoint_tokens", study.checkpoint_tokens},
                    {"checkpoint_levels", study.checkpoint_levels},
                    {"vllm_grouping", study.vllm_grouping},
                    {"rows", rows}});
  }
  return {{"utilization", util}, {"hits", hits}};
}

OrderedJson state_json(const SimReport& report) {
  OrderedJson studies = OrderedJson::array();
  for (const StateStudy& s : report.state_hits) {
    OrderedJson rows = OrderedJson::array();
    for (const StateStudyRow& row : s.rows) {
      if (!row.fits) continue;
      OrderedJson policies = OrderedJson::object();
      for (size_t i = 0; i < row.policies.size(); ++i)
        policies[s.policy_names[i]] = hit_json(row.policies[i]);
      rows.push_back({{"fraction", figure(row.fraction)},
                      {"budget_bytes", row.budget_bytes},
                      {"attention_blocks", row.split.attention_blocks},
                      {"state_slots", row.split.state_slots},
                      {"policies", policies},
                      {"vllm_rule", hit_json(row.vllm)}});
    }
    OrderedJson sensitivity = OrderedJson::array();
    for (const auto& [share, r] : s.sensitivity)
      sensitivity.push_back({{"checkpoints_per_sequence", share}, {"pagedkv", hit_json(r)}});
    studies.push_back({{"model", s.model},
                       {"workload", s.workload},
                       {"requests", s.requests},
                       {"prompt_tokens", s.prompt_tokens},
                       {"target_tokens", s.target_tokens},
                       {"footprint_blocks", s.footprint_blocks},
                       {"footprint_checkpoints", s.footprint_checkpoints},
                       {"footprint_bytes", s.footprint_bytes},
                       {"vllm_block_tokens", s.vllm_block_tokens},
                       {"unbounded", hit_json(s.unbounded)},
                       {"rows", rows},
                       {"sensitivity", sensitivity}});
  }
  return studies;
}

OrderedJson clusters_json(const SimReport& report) {
  OrderedJson rows = OrderedJson::array();
  for (const ClusterResult& r : report.clusters) {
    rows.push_back({{"trace", r.trace},
                    {"engines", r.options.num_engines},
                    {"router", router_name(r.options.router)},
                    {"shared_tier_blocks", r.options.shared_tier_blocks},
                    {"shared_tier_bytes_per_s", figure(r.options.shared_tier_bytes_per_s)},
                    {"requests", r.requests},
                    {"completed", r.completed},
                    {"rejected", r.rejected},
                    {"prompt_tokens", r.prompt_tokens},
                    {"device_hit_tokens", r.device_hit_tokens},
                    {"host_hit_tokens", r.host_hit_tokens},
                    {"shared_hit_tokens", r.shared_hit_tokens},
                    {"recomputed_tokens", r.recomputed_tokens},
                    {"routed_cached_tokens", r.routed_cached_tokens},
                    {"sim_time_s", figure(r.sim_time_s)},
                    {"throughput_rps", figure(r.throughput_rps)},
                    {"mean_latency_s", figure(r.mean_latency_s)},
                    {"shared_read_time_s", figure(r.shared_read_time_s)},
                    {"shared_blocks_written", r.shared_blocks_written},
                    {"shared_blocks_evicted", r.shared_blocks_evicted},
                    {"requests_per_engine", r.requests_per_engine}});
  }
  return rows;
}

}  // namespace

std::string to_json(const SimReport& report) {
  OrderedJson runs = OrderedJson::array();
  for (const TraceRun& run : report.runs) runs.push_back(run_json(run));
  OrderedJson json = {{"model", report.model},
                      {"bytes_per_token", report.bytes_per_token},
                      {"quick", report.quick},
                      {"runs", runs}};
  if (!report.eviction_trace.empty()) json["eviction"] = eviction_json(report);
  if (!report.tiers.empty()) json["tiers"] = tiers_json(report);
  if (!report.hybrid_util.empty() || !report.hybrid_hits.empty()) {
    json["hybrid"] = hybrid_json(report);
  }
  if (!report.state_hits.empty()) json["state"] = state_json(report);
  if (!report.clusters.empty()) json["clusters"] = clusters_json(report);
  // A trace named by a file whose name is not UTF-8 gets U+FFFD rather than an exception.
  return json.dump(2, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string to_svg(const SimReport& report) {
  constexpr double kPanelW = 520, kPanelH = 200, kLeft = 70, kGap = 90, kTop = 70, kRowGap = 80;
  // Legend: every allocator name, in first-seen order.
  std::vector<std::string> names;
  for (const TraceRun& run : report.runs) {
    for (const EngineResult& r : run.results) {
      if (std::find(names.begin(), names.end(), r.allocator) == names.end()) {
        names.push_back(r.allocator);
      }
    }
  }
  auto color = [&](const std::string& name) {
    const auto i = std::distance(names.begin(), std::find(names.begin(), names.end(), name));
    return kColors[i % std::size(kColors)];
  };
  const double width = kLeft + 2 * kPanelW + kGap + 40;
  const double legend_rows = std::ceil(static_cast<double>(names.size()) / 5);
  const double legend_h = 22 * legend_rows;
  const double height =
      kTop + legend_h + static_cast<double>(report.runs.size()) * (kPanelH + kRowGap) + 10;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
      "viewBox=\"0 0 {0:.0f} {1:.0f}\" font-family=\"Helvetica, Arial, sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
  out += fmt::format(
      "<text x=\"{:.0f}\" y=\"28\" font-size=\"17\" font-weight=\"bold\">pagedkv-sim: KV "
      "utilization (token slots / reserved slots) and concurrent requests over simulated "
      "time</text>\n",
      kLeft);
  for (size_t i = 0; i < names.size(); ++i) {
    const double x = kLeft + static_cast<double>(i % 5) * 220;
    const double y = 50 + 22 * std::floor(static_cast<double>(i) / 5);
    out += fmt::format(
        "<line x1=\"{0:.0f}\" y1=\"{1:.0f}\" x2=\"{2:.0f}\" y2=\"{1:.0f}\" stroke=\"{3}\" "
        "stroke-width=\"3\"/><text x=\"{4:.0f}\" y=\"{5:.0f}\">{6}</text>\n",
        x, y, x + 24, color(names[i]), x + 30, y + 4, xml_escape(names[i]));
  }
  for (size_t row = 0; row < report.runs.size(); ++row) {
    const TraceRun& run = report.runs[row];
    const double y0 = kTop + legend_h + static_cast<double>(row) * (kPanelH + kRowGap) + 20;
    double t_max = 0;
    int32_t c_max = 0;
    for (const EngineResult& r : run.results) {
      for (const SeriesPoint& p : r.series) {
        t_max = std::max(t_max, p.time_s);
        c_max = std::max(c_max, p.concurrency);
      }
    }
    t_max = nice_max(t_max);
    const double c_axis = nice_max(c_max);
    for (int panel = 0; panel < 2; ++panel) {
      const double x0 = kLeft + panel * (kPanelW + kGap);
      const double y_max = panel == 0 ? 1.0 : c_axis;
      const std::string title = fmt::format("{} (arrivals / {:g}): {}", run.trace, run.time_scale,
                                            panel == 0 ? "KV utilization" : "concurrent requests");
      out += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-weight=\"bold\">{}</text>\n", x0,
                         y0 - 8, xml_escape(title));
      out += fmt::format(
          "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"none\" "
          "stroke=\"#333\"/>\n",
          x0, y0, kPanelW, kPanelH);
      for (int tick = 0; tick <= 4; ++tick) {
        const double fy = tick / 4.0;
        const double y = y0 + kPanelH * (1 - fy);
        out += fmt::format(
            "<line x1=\"{0:.0f}\" y1=\"{1:.1f}\" x2=\"{2:.0f}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
            "<text x=\"{3:.0f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
            x0, y, x0 + kPanelW, x0 - 6, y + 4,
            panel == 0 ? fmt::format("{:.2f}", fy) : fmt::format("{:g}", fy * y_max));
        const double x = x0 + kPanelW * fy;
        out += fmt::format("<text x=\"{:.1f}\" y=\"{:.0f}\" text-anchor=\"middle\">{:g}</text>\n",
                           x, y0 + kPanelH + 16, fy * t_max);
      }
      out += fmt::format(
          "<text x=\"{:.0f}\" y=\"{:.0f}\" text-anchor=\"middle\">simulated time (s)</text>\n",
          x0 + kPanelW / 2, y0 + kPanelH + 34);
      for (const EngineResult& r : run.results) {
        if (r.series.empty()) continue;
        std::string points;
        for (const SeriesPoint& p : r.series) {
          const double v = panel == 0 ? p.utilization : p.concurrency;
          const double x = x0 + kPanelW * std::min(1.0, p.time_s / t_max);
          const double y = y0 + kPanelH * (1 - std::clamp(v / y_max, 0.0, 1.0));
          points += fmt::format("{:.1f},{:.1f} ", x, y);
        }
        out += fmt::format(
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.4\" stroke-opacity=\"0.85\" "
            "points=\"{}\"><title>{}</title></polyline>\n",
            color(r.allocator), points, xml_escape(r.allocator));
      }
    }
  }
  out += "</svg>\n";
  return out;
}

absl::Status write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("error writing '", path, "'"));
  return absl::OkStatus();
}

}  // namespace pagedkv::sim
