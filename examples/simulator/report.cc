#include "report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fmt/format.h"

namespace pagedkv::sim {
namespace {

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A finite number for JSON (NaN and infinities are not JSON).
std::string num(double x) {
  if (!std::isfinite(x)) return "null";
  return fmt::format("{:.6g}", x);
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
  std::string out = fmt::format("{:>7} {:>7} {:>6} {:>8} {:>8} {:>8} {:>10} {:>8} {:>11} {:>11}\n",
                                "device", "host", "retain", "dev hit", "host hit", "combined",
                                "LRU(D+H)", "diff", "promo GB/s", "demo GB/s");
  for (const TierRow& row : rows) {
    const TieredReplayResult& t = row.tiered;
    out += fmt::format(
        "{:>7} {:>7} {:>6} {:>8.4f} {:>8.4f} {:>8.4f} {:>10.4f} {:>8.4f} {:>11.3f} {:>11.3f}\n",
        t.device_capacity, t.host_capacity, t.retained_head_blocks, t.device_hit_rate(),
        t.host_hit_rate(), t.hit_rate(), row.single.hit_rate(),
        t.hit_rate() - row.single.hit_rate(), costs.bytes_per_s(t.promotions()) / kGB,
        costs.bytes_per_s(t.demotions) / kGB);
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

std::string to_json(const SimReport& report) {
  std::string out = "{\n";
  out += fmt::format("  \"model\": {},\n  \"bytes_per_token\": {},\n  \"quick\": {},\n",
                     json_string(report.model), report.bytes_per_token,
                     report.quick ? "true" : "false");
  out += "  \"runs\": [";
  for (size_t i = 0; i < report.runs.size(); ++i) {
    const TraceRun& run = report.runs[i];
    out += i == 0 ? "\n" : ",\n";
    out += fmt::format(
        "    {{\"trace\": {}, \"requests\": {}, \"time_scale\": {}, \"budget_tokens\": {}, "
        "\"budget_gib\": {}, \"max_model_len\": {}, \"host_cache_gib\": {}, "
        "\"prompts_truncated\": {}, "
        "\"outputs_clamped\": {},\n     \"allocators\": [",
        json_string(run.trace), run.requests, num(run.time_scale), run.budget_tokens,
        num(run.budget_gib), run.max_model_len, num(run.host_cache_gib),
        run.clamp.prompts_truncated, run.clamp.outputs_clamped);
    for (size_t j = 0; j < run.results.size(); ++j) {
      const EngineResult& r = run.results[j];
      out += j == 0 ? "\n" : ",\n";
      out += fmt::format(
          "      {{\"name\": {}, \"requests\": {}, \"completed\": {}, \"rejected\": {}, "
          "\"steps\": {}, \"sim_time_s\": {}, \"mean_utilization\": {}, \"mean_memory_use\": {}, "
          "\"peak_concurrency\": {}, \"mean_concurrency\": {}, \"throughput_rps\": {}, "
          "\"mean_latency_s\": {}, \"preemptions\": {}, \"preemptions_swap\": {}, "
          "\"prefix_query_tokens\": {}, \"prefix_hit_tokens\": {}, \"prefix_hit_rate\": {}, "
          "\"evictions\": {}, \"cow_copies\": {}, \"generated_tokens\": {}, "
          "\"prefix_host_hit_tokens\": {}, \"blocks_promoted\": {}, \"blocks_demoted\": {}, "
          "\"host_evictions\": {}, \"promote_time_s\": {}, "
          "\"allocator_ns_per_step\": {},\n       \"series\": {{\"time_s\": [",
          json_string(r.allocator), r.requests, r.completed, r.rejected, r.steps, num(r.sim_time_s),
          num(r.mean_utilization), num(r.mean_memory_use), r.peak_concurrency,
          num(r.mean_concurrency), num(r.throughput_rps), num(r.mean_latency_s), r.preemptions,
          r.preemptions_swap, r.prefix_query_tokens, r.prefix_hit_tokens, num(r.prefix_hit_rate()),
          r.evictions, r.cow_copies, r.generated_tokens, r.prefix_host_hit_tokens,
          r.blocks_promoted, r.blocks_demoted, r.host_evictions, num(r.promote_time_s),
          num(r.allocator_ns_per_step));
      std::string util, conc;
      for (size_t k = 0; k < r.series.size(); ++k) {
        const char* sep = k == 0 ? "" : ",";
        out += fmt::format("{}{:.2f}", sep, r.series[k].time_s);
        util += fmt::format("{}{:.4f}", sep, r.series[k].utilization);
        conc += fmt::format("{}{}", sep, r.series[k].concurrency);
      }
      out += fmt::format("], \"utilization\": [{}], \"concurrency\": [{}]}}}}", util, conc);
    }
    out += "]}";
  }
  out += "\n  ]";
  if (!report.eviction_trace.empty()) {
    out += fmt::format(",\n  \"eviction\": {{\"trace\": {}, \"block_tokens\": 512, \"rows\": [",
                       json_string(report.eviction_trace));
    for (size_t i = 0; i < report.eviction.size(); ++i) {
      const EvictionRow& row = report.eviction[i];
      out += fmt::format(
          "{}\n    {{\"capacity\": {}, \"infinite\": {}, \"total_blocks\": {}, "
          "\"lru_hit_blocks\": {}, \"lru_hit_rate\": {}, \"lru_evictions\": {}, "
          "\"belady_hit_blocks\": {}, \"belady_hit_rate\": {}, \"belady_evictions\": {}}}",
          i == 0 ? "" : ",", row.capacity, row.infinite ? "true" : "false", row.lru.total_blocks,
          row.lru.hit_blocks, num(row.lru.hit_rate()), row.lru.evictions, row.belady.hit_blocks,
          num(row.belady.hit_rate()), row.belady.evictions);
    }
    out += "\n  ]}";
  }
  if (!report.tiers.empty()) {
    const TierCostModel& c = report.tier_costs;
    out += fmt::format(
        ",\n  \"tiers\": {{\"trace\": {}, \"block_tokens\": {}, \"block_bytes\": {}, "
        "\"trace_seconds\": {}, \"prefill_tokens_per_s\": {}, \"recompute_ms\": {}, \"links\": [",
        json_string(report.eviction_trace), c.block_tokens, c.block_bytes, num(c.trace_seconds),
        num(c.prefill_tokens_per_s), num(1e3 * c.recompute_s()));
    for (size_t i = 0; i < c.links.size(); ++i) {
      out += fmt::format("{}{{\"name\": {}, \"bytes_per_s\": {}, \"promote_ms\": {}}}",
                         i == 0 ? "" : ", ", json_string(c.links[i].name),
                         num(c.links[i].bytes_per_s), num(1e3 * c.copy_s(c.links[i])));
    }
    out += "], \"rows\": [";
    for (size_t i = 0; i < report.tiers.size(); ++i) {
      const TieredReplayResult& t = report.tiers[i].tiered;
      out += fmt::format(
          "{}\n    {{\"device_blocks\": {}, \"host_blocks\": {}, \"retained_head_blocks\": {}, "
          "\"total_blocks\": {}, "
          "\"device_hit_blocks\": {}, \"host_hit_blocks\": {}, \"hit_rate\": {}, "
          "\"single_pool_hit_rate\": {}, \"promotions\": {}, \"demotions\": {}, "
          "\"host_evictions\": {}, \"promoted_bytes_per_s\": {}, \"demoted_bytes_per_s\": {}}}",
          i == 0 ? "" : ",", t.device_capacity, t.host_capacity, t.retained_head_blocks,
          t.total_blocks, t.device_hit_blocks, t.host_hit_blocks, num(t.hit_rate()),
          num(report.tiers[i].single.hit_rate()), t.promotions(), t.demotions, t.host_evictions,
          num(c.bytes_per_s(t.promotions())), num(c.bytes_per_s(t.demotions)));
    }
    out += "\n  ]}";
  }
  out += "\n}\n";
  return out;
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
