// Text and JSON summaries (see summary.h).
#include "summary.h"

#include <cmath>
#include <string_view>

#include "fmt/format.h"

namespace decode_loop {
namespace {

double ratio(double num, double den) { return den > 0.0 ? num / den : 0.0; }

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<int>(ch));
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

// JSON has no infinity: a non-finite value (non-finite logits) is null.
std::string json_number(float x) { return std::isfinite(x) ? fmt::format("{:.6g}", x) : "null"; }

}  // namespace

std::string format_text(const Report& r) {
  const RunStats& s = r.run;
  const auto& m = s.manager;
  std::string out;
  auto line = [&out](std::string text) { out += text + "\n"; };
  line(fmt::format("pagedkv decode loop on {}", r.device));
  line(
      fmt::format("  model        {} layers, d_model {}, {} query / {} KV heads x {}, ffn {}, "
                  "vocab {} ({:.1f} MMAC/token)",
                  r.model.num_layers, r.model.d_model, r.model.num_q_heads, r.model.num_kv_heads,
                  r.model.head_dim, r.model.ffn_dim, r.model.vocab_size,
                  static_cast<double>(macs_per_token(r.model)) * 1e-6));
  line(
      fmt::format("  KV cache     {} blocks x {} tokens ({} KV, {:.2f} MiB budget, {} KiB/block), "
                  "{} host blocks ({})",
                  r.engine.num_blocks, r.engine.block_size, r.kv_dtype,
                  static_cast<double>(r.kv_budget_bytes) / (1 << 20), r.bytes_per_block / 1024,
                  r.engine.num_host_blocks,
                  r.engine.enable_host_cache
                      ? fmt::format("swap, and the host tier's {}", r.engine.host_cache_blocks)
                      : "swap"));
  line(fmt::format("  workload     {}", r.workload));
  line("");
  line(fmt::format("requests       {} completed of {} ({} sequences incl. forked samples)",
                   s.requests_completed, s.requests, s.sequences));
  line(fmt::format("tokens         {} prompt, {} generated", s.prompt_tokens, s.generated_tokens));
  line(
      fmt::format("prefill        {} tokens computed ({} recomputed after preemption) in "
                  "{:.2f} s = {:.0f} tok/s",
                  s.prefill_tokens, s.recompute_tokens, s.prefill_seconds,
                  ratio(static_cast<double>(s.prefill_tokens), s.prefill_seconds)));
  line(fmt::format("decode         {} tokens in {:.2f} s = {:.0f} tok/s ({} steps)",
                   s.decode_tokens, s.decode_seconds,
                   ratio(static_cast<double>(s.decode_tokens), s.decode_seconds), s.steps));
  line(fmt::format("prefix cache   hit rate {:.1f}% ({} of {} prompt tokens found at admission)",
                   100.0 * ratio(static_cast<double>(s.admit_hit_tokens),
                                 static_cast<double>(s.admit_query_tokens)),
                   s.admit_hit_tokens, s.admit_query_tokens));
  if (r.engine.enable_host_cache) {
    line(
        fmt::format("host tier      {} hit tokens promoted from host memory ({:.1f}% of hits); "
                    "{} blocks demoted, {} promoted ({} of both by exchange), {} host evictions; "
                    "{} cached at the end",
                    s.admit_host_hit_tokens,
                    100.0 * ratio(static_cast<double>(s.admit_host_hit_tokens),
                                  static_cast<double>(s.admit_hit_tokens)),
                    m.blocks_demoted, m.blocks_promoted, s.exchange_blocks_executed,
                    m.host_evictions, m.cached_host_blocks));
  }
  line(
      fmt::format("KV blocks      peak {} of {} in use, utilization {:.1f}% (real token slots / "
                  "allocated slots, mean over steps)",
                  s.peak_used_blocks, r.engine.num_blocks,
                  100.0 * ratio(s.real_slot_steps, s.used_slot_steps)));
  line(fmt::format("preemptions    {} recompute, {} swap ({} blocks out, {} in)",
                   m.preemptions_recompute, m.preemptions_swap, m.blocks_swapped_out,
                   m.blocks_swapped_in));
  line(fmt::format("copy-on-write  {} block copies", m.cow_copies));
  line(fmt::format("evictions      {} cached blocks reallocated", m.evictions));
  line(
      fmt::format("concurrency    peak {} sequences paged vs {} with a contiguous reservation "
                  "of {} tokens each (utilization {:.1f}%)",
                  s.peak_running, r.contiguous_peak_concurrency, r.contiguous_max_len,
                  100.0 * r.contiguous_utilization));
  line(fmt::format("wall time      {:.2f} s", s.wall_seconds));
  if (r.verify.has_value()) {
    const VerifyResult& v = *r.verify;
    int32_t counts[3] = {};
    for (const VerifiedSequence& seq : v.sequences) ++counts[static_cast<int>(seq.verdict)];
    line(fmt::format(
        "verify         {}: {} sequences teacher-forced against the dense no-cache reference "
        "({:.2f} s)",
        v.passed() ? "PASS" : "FAIL", v.sequences.size(), v.seconds));
    line(fmt::format(
        "               {} identical, {} near-tie, {} failed; max |logit diff| {:.3g}, {} bound "
        "{:.3g}",
        counts[0], counts[1], counts[2], v.max_logit_diff(), pagedkv::dtype_name(v.cache_dtype),
        v.bound));
    for (const VerifiedSequence& seq : v.sequences) {
      line(
          fmt::format("  request {:>3} sample {} ({}): {} tokens, identical up to {}, max logit "
                      "diff {:.3g}: {}",
                      seq.request, seq.sample, seq.why, seq.num_tokens, seq.identical_tokens,
                      seq.max_logit_diff, verdict_name(seq.verdict)));
      if (!seq.detail.empty()) line(fmt::format("      {}", seq.detail));
    }
  } else {
    line("verify         off");
  }
  return out;
}

std::string format_json(const Report& r) {
  const RunStats& s = r.run;
  const auto& m = s.manager;
  std::string out = "{\n";
  auto field = [&out](std::string_view key, const std::string& value, bool last = false) {
    out += fmt::format("  {}: {}{}\n", json_string(key), value, last ? "" : ",");
  };
  field("device", json_string(r.device));
  field("workload", json_string(r.workload));
  field("model",
        fmt::format("{{\"num_layers\": {}, \"d_model\": {}, \"num_q_heads\": {}, "
                    "\"num_kv_heads\": {}, \"head_dim\": {}, \"ffn_dim\": {}, "
                    "\"vocab_size\": {}}}",
                    r.model.num_layers, r.model.d_model, r.model.num_q_heads, r.model.num_kv_heads,
                    r.model.head_dim, r.model.ffn_dim, r.model.vocab_size));
  field("kv_cache",
        fmt::format("{{\"num_blocks\": {}, \"block_size\": {}, \"dtype\": {}, "
                    "\"budget_bytes\": {}, \"bytes_per_block\": {}, \"num_host_blocks\": {}, "
                    "\"host_cache\": {}, \"host_cache_blocks\": {}}}",
                    r.engine.num_blocks, r.engine.block_size, json_string(r.kv_dtype),
                    r.kv_budget_bytes, r.bytes_per_block, r.engine.num_host_blocks,
                    r.engine.enable_host_cache ? "true" : "false", r.engine.host_cache_blocks));
  field("preemption_policy", json_string(r.preemption_policy));
  field("requests", std::to_string(s.requests));
  field("requests_completed", std::to_string(s.requests_completed));
  field("sequences", std::to_string(s.sequences));
  field("prompt_tokens", std::to_string(s.prompt_tokens));
  field("generated_tokens", std::to_string(s.generated_tokens));
  field("prefill_tokens", std::to_string(s.prefill_tokens));
  field("recompute_tokens", std::to_string(s.recompute_tokens));
  field("decode_tokens", std::to_string(s.decode_tokens));
  field("steps", std::to_string(s.steps));
  field("prefill_seconds", fmt::format("{:.6f}", s.prefill_seconds));
  field("decode_seconds", fmt::format("{:.6f}", s.decode_seconds));
  field("wall_seconds", fmt::format("{:.6f}", s.wall_seconds));
  field("prefill_tokens_per_second",
        fmt::format("{:.3f}", ratio(static_cast<double>(s.prefill_tokens), s.prefill_seconds)));
  field("decode_tokens_per_second",
        fmt::format("{:.3f}", ratio(static_cast<double>(s.decode_tokens), s.decode_seconds)));
  field("prefix_cache_hit_rate",
        fmt::format("{:.6f}", ratio(static_cast<double>(s.admit_hit_tokens),
                                    static_cast<double>(s.admit_query_tokens))));
  field("prefix_hit_tokens", std::to_string(s.admit_hit_tokens));
  field("prefix_query_tokens", std::to_string(s.admit_query_tokens));
  // The allocator's own counters also count lookups of admissions that were retried.
  field("allocator_prefix_hit_tokens", std::to_string(m.prefix_hit_tokens));
  field("allocator_prefix_query_tokens", std::to_string(m.prefix_query_tokens));
  // Host tier: hits of admissions found there, and the allocator's tier counters next to
  // the copies the store ran.
  field("host_hit_tokens", std::to_string(s.admit_host_hit_tokens));
  field("allocator_host_hit_tokens", std::to_string(m.host_hit_tokens));
  field("blocks_demoted", std::to_string(m.blocks_demoted));
  field("blocks_promoted", std::to_string(m.blocks_promoted));
  field("demote_blocks_executed", std::to_string(s.demote_blocks_executed));
  field("promote_blocks_executed", std::to_string(s.promote_blocks_executed));
  field("exchange_blocks_executed", std::to_string(s.exchange_blocks_executed));
  field("host_evictions", std::to_string(m.host_evictions));
  field("cached_host_blocks", std::to_string(m.cached_host_blocks));
  field("peak_used_blocks", std::to_string(s.peak_used_blocks));
  field("kv_utilization", fmt::format("{:.6f}", ratio(s.real_slot_steps, s.used_slot_steps)));
  field("preemptions_recompute", std::to_string(m.preemptions_recompute));
  field("preemptions_swap", std::to_string(m.preemptions_swap));
  field("blocks_swapped_out", std::to_string(m.blocks_swapped_out));
  field("blocks_swapped_in", std::to_string(m.blocks_swapped_in));
  field("cow_copies", std::to_string(m.cow_copies));
  field("evictions", std::to_string(m.evictions));
  field("peak_running_sequences", std::to_string(s.peak_running));
  field("contiguous",
        fmt::format("{{\"reserved_tokens_per_sequence\": {}, "
                    "\"peak_concurrency\": {}, \"utilization\": {:.6f}}}",
                    r.contiguous_max_len, r.contiguous_peak_concurrency, r.contiguous_utilization));
  if (r.verify.has_value()) {
    const VerifyResult& v = *r.verify;
    std::string seqs = "[";
    for (size_t i = 0; i < v.sequences.size(); ++i) {
      const VerifiedSequence& seq = v.sequences[i];
      seqs += fmt::format(
          "{}{{\"request\": {}, \"sample\": {}, \"why\": {}, \"temperature\": {}, "
          "\"tokens\": {}, \"identical_tokens\": {}, \"differing_tokens\": {}, "
          "\"max_logit_diff\": {}, \"verdict\": {}, \"detail\": {}}}",
          i == 0 ? "" : ", ", seq.request, seq.sample, json_string(seq.why), seq.temperature,
          seq.num_tokens, seq.identical_tokens, seq.differing_tokens,
          json_number(seq.max_logit_diff), json_string(verdict_name(seq.verdict)),
          json_string(seq.detail));
    }
    seqs += "]";
    field("verify",
          fmt::format("{{\"requested\": {}, \"passed\": {}, \"dtype\": {}, \"bound\": {}, "
                      "\"max_logit_diff\": {}, \"seconds\": {:.6f}, \"sequences\": {}}}",
                      v.requested, v.passed() ? "true" : "false",
                      json_string(pagedkv::dtype_name(v.cache_dtype)), json_number(v.bound),
                      json_number(v.max_logit_diff()), v.seconds, seqs),
          true);
  } else {
    field("verify", "null", true);
  }
  out += "}\n";
  return out;
}

}  // namespace decode_loop
