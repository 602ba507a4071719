// Text and JSON summaries (see summary.h).
#include "summary.h"

#include <cmath>
#include <iterator>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace decode_loop {

MechanismSet Report::covered() const {
  return verify.has_value() ? verify->covered() : MechanismSet{};
}

MechanismSet Report::fault_exercised() const {
  return faulted_mechanisms(engine.fault) & run.exercised();
}

bool Report::fault_covered() const {
  const MechanismSet exercised = fault_exercised();
  return !exercised.empty() && exercised.minus(covered()).empty();
}

namespace {

using Json = nlohmann::ordered_json;  // fields in the order written, as the text has them

double ratio(double num, double den) { return den > 0.0 ? num / den : 0.0; }

// "cow-copy 3, fork 12": the exercised mechanisms with their sequence counts.
std::string mechanism_counts(const RunStats& s) {
  std::string out;
  for (size_t i = 0; i < kMechanisms.size(); ++i) {
    if (s.mechanism_sequences[i] == 0) continue;
    out += fmt::format("{}{} {}", out.empty() ? "" : ", ", mechanism_name(kMechanisms[i]),
                       s.mechanism_sequences[i]);
  }
  return out.empty() ? "none" : out;
}

std::string fault_line(const Report& r) {
  const MechanismSet broken = faulted_mechanisms(r.engine.fault);
  const MechanismSet exercised = r.fault_exercised();
  if (exercised.empty()) {
    return fmt::format("fault          {} breaks {}: no sequence went through it, nothing to catch",
                       r.fault, mechanism_names(broken));
  }
  return fmt::format("fault          {} breaks {}: exercised ({}), {} by a verified sequence",
                     r.fault, mechanism_names(broken), mechanism_names(exercised),
                     r.fault_covered() ? "covered" : "NOT covered");
}

std::string coverage_line(const Report& r) {
  const MechanismSet exercised = r.run.exercised();
  const MechanismSet uncovered = exercised.minus(r.covered());
  if (uncovered.empty()) {
    return fmt::format("               covers every mechanism exercised ({})",
                       mechanism_names(exercised));
  }
  return fmt::format(
      "               covers {}; NOT covered: {} (--verify {} or more covers every one)",
      mechanism_names(r.covered()), mechanism_names(uncovered), exercised.size());
}

// JSON array of the set's mechanism names.
Json names_json(MechanismSet set) {
  Json names = Json::array();
  for (const Mechanism m : kMechanisms) {
    if (set.contains(m)) names.push_back(mechanism_name(m));
  }
  return names;
}

// A float as the shortest decimal that reads back as it ("0.8", not 0.800000011920929);
// JSON has no infinity: a non-finite value (non-finite logits) is null.
Json float_json(float x) {
  return std::isfinite(x) ? Json(std::stod(fmt::format("{}", x))) : Json(nullptr);
}

Json verify_json(const VerifyResult& v, MechanismSet exercised) {
  Json sequences = Json::array();
  for (const VerifiedSequence& seq : v.sequences) {
    sequences.push_back({{"request", seq.request},
                         {"sample", seq.sample},
                         {"why", seq.why},
                         {"mechanisms", names_json(seq.mechanisms)},
                         {"temperature", float_json(seq.temperature)},
                         {"tokens", seq.num_tokens},
                         {"identical_tokens", seq.identical_tokens},
                         {"differing_tokens", seq.differing_tokens},
                         {"max_logit_diff", float_json(seq.max_logit_diff)},
                         {"verdict", verdict_name(seq.verdict)},
                         {"detail", seq.detail}});
  }
  return {{"requested", v.requested},
          {"passed", v.passed()},
          {"dtype", pagedkv::dtype_name(v.cache_dtype)},
          {"bound", float_json(v.bound)},
          {"max_logit_diff", float_json(v.max_logit_diff())},
          {"seconds", v.seconds},
          {"mechanisms_covered", names_json(v.covered())},
          {"mechanisms_uncovered", names_json(exercised.minus(v.covered()))},
          {"sequences", std::move(sequences)}};
}

// The publisher's counters under the names of their metrics (docs/events.md, "Metrics").
Json kv_events_json(const std::optional<pagedkv::KvEventPublisher::Stats>& stats) {
  if (!stats.has_value()) return nullptr;
  const pagedkv::KvEventPublisher::Stats& e = *stats;
  return {{"next_seq", e.next_seq},
          {"batches_published", e.steps_published},
          {"events_published", e.events_published},
          {"events_dropped_subscriber_hwm", e.events_dropped_hwm},
          {"events_dropped_publisher_queue", e.events_dropped_queue},
          {"replay_requests", e.replay_requests},
          {"snapshot_requests", e.snapshot_requests},
          {"requests_refused", e.requests_refused},
          {"stalled_peers_dropped", e.stalled_peers_dropped},
          {"handshakes_refused", e.handshakes_refused}};
}

Json disaggregation_json(const std::optional<Report::Disaggregation>& pair) {
  if (!pair.has_value()) return nullptr;
  const DisaggregationStats& d = pair->stats;
  return {{"transport", pair->transport},
          {"transfer_fault", pair->fault},
          {"handoffs", d.handoffs},
          {"transfers", d.transfers},
          {"local_imports", d.local_imports},
          {"transfers_complete", d.transfers_complete},
          {"transfers_failed", d.transfers_failed},
          {"transfers_timed_out", d.transfers_timed_out},
          {"transfers_cancelled", d.transfers_cancelled},
          {"blocks_expected", d.blocks_expected},
          {"blocks_verified", d.blocks_verified},
          {"blocks_corrupt", d.blocks_corrupt},
          {"blocks_missing", d.blocks_missing},
          {"blocks_wrong", d.blocks_wrong},
          {"bytes_verified", d.bytes_verified},
          {"import_tokens", d.import_tokens},
          {"local_hit_tokens", d.local_hit_tokens},
          {"served_tokens", d.served_tokens},
          {"imported_tokens", d.imported_tokens},
          {"recomputed_tokens", d.recomputed_tokens},
          {"peer_killed", d.peer_killed},
          {"rerouted_sequences", d.rerouted_sequences},
          {"mean_transfer_ms", 1000 * ratio(d.transfer_seconds, static_cast<double>(d.transfers))},
          {"prefill_steps", d.prefill.steps},
          {"prefill_engine_prefill_tokens", d.prefill.prefill_tokens}};
}

// The remote tier's counters, and its store's (docs/remote.md, "The tier").
Json remote_json(const std::optional<Report::Remote>& remote) {
  if (!remote.has_value()) return nullptr;
  const pagedkv::RemoteTierStats& t = remote->tier;
  const pagedkv::RemoteKvStats& s = remote->store_stats;
  return {{"store", remote->store},
          {"lookups", t.lookups},
          {"lookup_blocks", t.lookup_blocks},
          {"found_blocks", t.found_blocks},
          {"missing_blocks", t.missing_blocks},
          {"corrupt_blocks", t.corrupt_blocks},
          {"foreign_blocks", t.foreign_blocks},
          {"other_blocks", t.other_blocks},
          {"error_blocks", t.error_blocks},
          {"timed_out", t.timed_out},
          {"loaded_blocks", t.loaded_blocks},
          {"loaded_tokens", t.loaded_tokens},
          {"written_blocks", t.written_blocks},
          {"written_bytes", t.written_bytes},
          {"write_failures", t.write_failures},
          {"skipped_writes", t.skipped_writes},
          {"store_bytes_read", s.bytes_read},
          {"store_errors", s.errors},
          {"store_reconnects", s.reconnects},
          {"store_redirects", s.redirects},
          {"store_dropped_puts", s.dropped_puts},
          {"store_failed_fast", s.failed_fast},
          {"store_latency_max_us", s.latency_max_us},
          {"store_latency_mean_us",
           ratio(static_cast<double>(s.latency_sum_us), static_cast<double>(s.requests))}};
}

// "2, 5" for a group's layers.
std::string layer_list(const CacheGroup& g) {
  std::string out;
  for (const int32_t l : g.layers) out += fmt::format("{}{}", out.empty() ? "" : ", ", l);
  return out;
}

std::string model_line(const Report& r) {
  const ModelConfig& c = r.model;
  const std::string rest =
      fmt::format("d_model {}, ffn {}, vocab {} ({:.1f} MMAC/token)", c.d_model, c.ffn_dim,
                  c.vocab_size, static_cast<double>(macs_per_token(c)) * 1e-6);
  if (c.mla()) {
    return fmt::format(
        "  model        {} ({}), {} heads of {} + {} query / key and {} value dims, latent {} "
        "+ rope {}, {}",
        r.model_name, describe_layers(c), c.num_q_heads, c.qk_nope_head_dim, c.qk_rope_head_dim,
        c.v_head_dim, c.kv_lora_rank, c.qk_rope_head_dim, rest);
  }
  const std::string layers = c.layer_pattern.empty()
                                 ? fmt::format("{} layers", c.num_layers)
                                 : fmt::format("{} ({})", r.model_name, describe_layers(c));
  const std::string scan = c.kind == ModelKind::kSsm
                               ? fmt::format(", scan of {} channels after a {}-tap conv",
                                             c.state_channels(), c.conv_kernel)
                               : "";
  return fmt::format("  model        {}, {} query / {} KV heads x {}{}, {}", layers, c.num_q_heads,
                     c.num_kv_heads, c.head_dim, scan, rest);
}

std::string host_note(const Report& r, const CacheGroup& g) {
  return r.engine.enable_host_cache
             ? fmt::format("swap, and the host tier's {}", g.host_cache_blocks)
             : "swap";
}

Json groups_json(const Report& r) {
  Json groups = Json::array();
  const CachePlan& plan = r.engine.cache;
  for (int32_t g = 0; g < plan.num_groups(); ++g) {
    const CacheGroup& group = plan.groups[g];
    Json entry = {{"kind", pagedkv::attention_kind_name(group.kind)},
                  {"window", group.window},
                  {"layers", group.layers},
                  {"num_blocks", group.num_blocks},
                  {"num_host_blocks", group.num_host_blocks},
                  {"host_cache_blocks", group.host_cache_blocks},
                  {"bytes_per_block", group.page_bytes()}};
    if (g < std::ssize(r.run.peak_group_blocks)) {
      entry["peak_used_blocks"] = r.run.peak_group_blocks[g];
    }
    if (g < std::ssize(r.run.manager_groups)) {
      const auto& s = r.run.manager_groups[g];
      entry["released_blocks"] = s.released_blocks;
      entry["hit_blocks"] = s.hit_blocks;
      entry["evictions"] = s.evictions;
      entry["blocks_demoted"] = s.blocks_demoted;
      entry["blocks_promoted"] = s.blocks_promoted;
      if (group.kind == pagedkv::AttentionKind::kState) {
        entry["checkpoints_saved"] = s.checkpoints_saved;
        entry["checkpoints_restored"] = s.checkpoints_restored;
      }
    }
    groups.push_back(std::move(entry));
  }
  return groups;
}

Json fault_json(const Report& r) {
  if (r.engine.fault == Fault::kNone) return nullptr;
  return {{"name", r.fault},
          {"mechanisms", names_json(faulted_mechanisms(r.engine.fault))},
          {"exercised", !r.fault_exercised().empty()},
          {"covered", r.fault_covered()}};
}

}  // namespace

std::string format_text(const Report& r) {
  const RunStats& s = r.run;
  const auto& m = s.manager;
  std::string out;
  auto line = [&out](std::string text) { out += text + "\n"; };
  const CachePlan& plan = r.engine.cache;
  const CacheGroup& group0 = plan.groups.front();
  line(fmt::format("pagedkv decode loop on {}", r.device));
  line(model_line(r));
  if (plan.num_groups() == 1) {
    line(fmt::format(
        "  KV cache     {} blocks x {} tokens ({} KV{}, {:.2f} MiB budget, {} KiB/block), {} host "
        "blocks ({}){}",
        group0.num_blocks, r.engine.cache.config.block_size, r.kv_dtype,
        group0.spec.latent ? " latents" : "", static_cast<double>(r.kv_budget_bytes) / (1 << 20),
        r.bytes_per_block / 1024, group0.num_host_blocks, host_note(r, group0),
        plan.treat_as_full ? ", every layer treated as full attention" : ""));
  } else {
    line(fmt::format(
        "  KV cache     {} layer groups of {}-token blocks ({} KV, {:.2f} MiB budget split for "
        "sequences of {} tokens)",
        plan.num_groups(), r.engine.cache.config.block_size, r.kv_dtype,
        static_cast<double>(r.kv_budget_bytes) / (1 << 20), plan.split_tokens));
    for (int32_t g = 0; g < plan.num_groups(); ++g) {
      const CacheGroup& group = plan.groups[g];
      const bool state = group.kind == pagedkv::AttentionKind::kState;
      line(fmt::format("    group {}    {} (layers {}): {} {} x {} KiB, {} host {} ({})", g,
                       group.name(), layer_list(group), group.num_blocks,
                       state ? "state slots" : "blocks", group.page_bytes() / 1024,
                       group.num_host_blocks, state ? "slots" : "blocks", host_note(r, group)));
    }
  }
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
  line(fmt::format(
      "decode         {} tokens in {:.2f} s = {:.0f} tok/s ({} steps, {:.1f} sequences a step)",
      s.decode_tokens, s.decode_seconds,
      ratio(static_cast<double>(s.decode_tokens), s.decode_seconds), s.steps,
      s.mean_decode_batch()));
  // Two rates: each admitted request once, and every lookup (what the metrics count: a
  // request whose allocation failed is looked up again when it is retried).
  line(fmt::format("prefix cache   hit rate at admission {:.1f}% ({} of {} prompt tokens)",
                   100.0 * ratio(static_cast<double>(s.admit_hit_tokens),
                                 static_cast<double>(s.admit_query_tokens)),
                   s.admit_hit_tokens, s.admit_query_tokens));
  line(fmt::format(
      "               hit rate of all lookups {:.1f}% ({} of {}, retries included: the metrics' "
      "rate)",
      100.0 * ratio(static_cast<double>(m.prefix_hit_tokens),
                    static_cast<double>(m.prefix_query_tokens)),
      m.prefix_hit_tokens, m.prefix_query_tokens));
  if (r.engine.enable_host_cache) {
    line(
        fmt::format("host tier      {} hit tokens promoted from host memory ({:.1f}% of hits); "
                    "{} blocks demoted, {} promoted ({} of both by exchange), {} host evictions; "
                    "{} cached at the end{}",
                    s.admit_host_hit_tokens,
                    100.0 * ratio(static_cast<double>(s.admit_host_hit_tokens),
                                  static_cast<double>(s.admit_hit_tokens)),
                    m.blocks_demoted, m.blocks_promoted, s.exchange_blocks_executed,
                    m.host_evictions, m.cached_host_blocks,
                    r.engine.host_admission == pagedkv::HostAdmission::kReused
                        ? fmt::format("; admission: {} evicted blocks not reused dropped, "
                                      "{} ghost hits",
                                      m.blocks_not_admitted, m.ghost_hits)
                        : ""));
  }
  line(
      fmt::format("KV blocks      peak {} of {} in use{}, utilization {:.1f}% (real token slots / "
                  "allocated slots, mean over steps)",
                  s.peak_used_blocks, group0.num_blocks, plan.num_groups() > 1 ? " in group 0" : "",
                  100.0 * ratio(s.real_slot_steps, s.used_slot_steps)));
  for (int32_t g = 1; g < plan.num_groups() && g < std::ssize(s.manager_groups); ++g) {
    const auto& gs = s.manager_groups[g];
    line(fmt::format(
        "               group {}: peak {} of {} in use, {} released behind the window, {} "
        "claimed by prefix hits",
        g, s.peak_group_blocks[g], plan.groups[g].num_blocks, gs.released_blocks, gs.hit_blocks));
  }
  line(fmt::format("KV bytes       peak {:.3f} MiB of {:.3f} MiB of pools in use",
                   static_cast<double>(s.peak_used_bytes) / (1 << 20),
                   static_cast<double>(plan.pool_bytes()) / (1 << 20)));
  line(fmt::format("preemptions    {} recompute, {} swap ({} blocks out, {} in)",
                   m.preemptions_recompute, m.preemptions_swap, m.blocks_swapped_out,
                   m.blocks_swapped_in));
  if (r.engine.speculative > 0) {
    line(
        fmt::format("speculative    {} drafts ({}, at most {} a step) verified in {} "
                    "sequence-steps, {} accepted ({:.1f}%): {:.2f} tokens a sequence-step",
                    s.draft_tokens, r.engine.drafter ? "replayed" : "prompt lookup",
                    r.engine.speculative, s.speculative_steps, s.accepted_draft_tokens,
                    100.0 * ratio(static_cast<double>(s.accepted_draft_tokens),
                                  static_cast<double>(s.draft_tokens)),
                    ratio(static_cast<double>(s.speculative_tokens),
                          static_cast<double>(s.speculative_steps))));
  }
  line(fmt::format("output         digest {:016x} (of every sequence's generated tokens){}",
                   s.output_digest,
                   r.rehearsal_digest.has_value()
                       ? fmt::format("; without speculation {:016x}: {}", *r.rehearsal_digest,
                                     *r.rehearsal_digest == s.output_digest ? "same" : "DIFFERENT")
                       : ""));
  line(fmt::format("copy-on-write  {} block copies", m.cow_copies));
  line(fmt::format(
      "evictions      {} cached blocks reallocated ({}{})", m.evictions,
      r.engine.eviction_policy == pagedkv::EvictionPolicy::kAdaptive ? "adaptive" : "LRU",
      r.engine.eviction_policy == pagedkv::EvictionPolicy::kAdaptive
          ? fmt::format("; {} recent and {} frequent ghost hits", m.recent_ghost_hits,
                        m.frequent_ghost_hits)
          : ""));
  line(fmt::format("mechanisms     sequences through each: {}", mechanism_counts(s)));
  if (r.engine.fault != Fault::kNone) line(fault_line(r));
  line(fmt::format(
      "concurrency    peak {} sequences paged{} vs {} with a contiguous reservation "
      "of {} tokens each (utilization {:.1f}%)",
      s.peak_running,
      s.peak_decoding == s.peak_running ? ""
                                        : fmt::format(" ({} past their prompt)", s.peak_decoding),
      r.contiguous_peak_concurrency, r.contiguous_max_len, 100.0 * r.contiguous_utilization));
  const CapacityFigures& cap = r.capacity;
  if (cap.sequences_as_full != cap.sequences || cap.held_bytes != cap.held_bytes_as_full) {
    line(fmt::format(
        "capacity       the budget's pools hold {} sequences of {} tokens with layer groups, {} "
        "with every layer full ({:.2f}x); one holds {:.1f} KiB vs {:.1f} KiB (minimum {:.1f} "
        "KiB)",
        cap.sequences, cap.tokens, cap.sequences_as_full,
        ratio(static_cast<double>(cap.sequences), static_cast<double>(cap.sequences_as_full)),
        static_cast<double>(cap.held_bytes) / 1024,
        static_cast<double>(cap.held_bytes_as_full) / 1024,
        static_cast<double>(cap.min_bytes) / 1024));
  }
  if (r.kv_events.has_value()) {
    const pagedkv::KvEventPublisher::Stats& e = *r.kv_events;
    line(fmt::format(
        "kv events      {} events in {} batches published, {} dropped; {} replay and {} "
        "snapshot requests served, {} refused",
        e.events_published, e.steps_published, e.events_dropped_hwm + e.events_dropped_queue,
        e.replay_requests, e.snapshot_requests, e.requests_refused));
  }
  if (r.remote.has_value()) {
    const pagedkv::RemoteTierStats& t = r.remote->tier;
    line(fmt::format(
        "remote tier    {}: {} tokens loaded ({} blocks) in {} lookups of {} blocks: {} found, "
        "{} missing, {} corrupt, {} of another namespace, {} errors, {} timed out; {} blocks "
        "written ({:.1f} MiB), {} write failures",
        r.remote->store, t.loaded_tokens, t.loaded_blocks, t.lookups, t.lookup_blocks,
        t.found_blocks, t.missing_blocks, t.corrupt_blocks, t.foreign_blocks, t.error_blocks,
        t.timed_out, t.written_blocks, static_cast<double>(t.written_bytes) / (1 << 20),
        t.write_failures));
  }
  if (r.disaggregation.has_value()) {
    const DisaggregationStats& d = r.disaggregation->stats;
    line(fmt::format(
        "disaggregated  {} hand-offs prefill -> decode over {} ({} local-only): {} transfers, "
        "{} complete, {} failed, {} timed out; {} of {} blocks verified ({:.1f} MiB), {} "
        "corrupt, {} missing",
        d.handoffs, r.disaggregation->transport, d.local_imports, d.transfers, d.transfers_complete,
        d.transfers_failed, d.transfers_timed_out, d.blocks_verified, d.blocks_expected,
        static_cast<double>(d.bytes_verified) / (1 << 20), d.blocks_corrupt, d.blocks_missing));
    line(fmt::format(
        "               prompt tokens handed off {}: {} local hits, {} imported, {} served "
        "in all, {} recomputed (--transfer-fault {}{})",
        d.import_tokens, d.local_hit_tokens, d.imported_tokens, d.served_tokens,
        d.recomputed_tokens, r.disaggregation->fault,
        d.peer_killed
            ? fmt::format("; prefill engine killed, {} sequences rerouted", d.rerouted_sequences)
            : ""));
  }
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
    line(coverage_line(r));
    for (const VerifiedSequence& seq : v.sequences) {
      line(fmt::format(
          "  request {:>3} sample {} ({}) [{}]: {} tokens, identical up to {}, max "
          "logit diff {:.3g}: {}",
          seq.request, seq.sample, seq.why, mechanism_names(seq.mechanisms), seq.num_tokens,
          seq.identical_tokens, seq.max_logit_diff, verdict_name(seq.verdict)));
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
  Json mechanism_sequences = Json::object();
  for (size_t i = 0; i < kMechanisms.size(); ++i) {
    mechanism_sequences[mechanism_name(kMechanisms[i])] = s.mechanism_sequences[i];
  }
  const Json out = {
      {"device", r.device},
      {"workload", r.workload},
      {"model",
       {{"name", r.model_name},
        {"layers", describe_layers(r.model)},
        {"num_layers", r.model.num_layers},
        {"d_model", r.model.d_model},
        {"num_q_heads", r.model.num_q_heads},
        {"num_kv_heads", r.model.num_kv_heads},
        {"head_dim", r.model.head_dim},
        {"ffn_dim", r.model.ffn_dim},
        {"vocab_size", r.model.vocab_size}}},
      // num_blocks, num_host_blocks and host_cache_blocks: group 0's (the whole cache of a
      // model of one group); layer_groups: each group's.
      {"kv_cache",
       {{"num_blocks", r.engine.cache.groups.front().num_blocks},
        {"block_size", r.engine.cache.config.block_size},
        {"dtype", r.kv_dtype},
        {"budget_bytes", r.kv_budget_bytes},
        {"pool_bytes", r.engine.cache.pool_bytes()},
        {"bytes_per_block", r.bytes_per_block},
        {"num_host_blocks", r.engine.cache.groups.front().num_host_blocks},
        {"host_cache", r.engine.enable_host_cache},
        {"host_admission",
         r.engine.host_admission == pagedkv::HostAdmission::kReused ? "reused" : "all"},
        {"eviction_policy",
         r.engine.eviction_policy == pagedkv::EvictionPolicy::kAdaptive ? "adaptive" : "lru"},
        {"host_cache_blocks", r.engine.cache.groups.front().host_cache_blocks},
        {"treat_as_full", r.engine.cache.treat_as_full},
        {"split_tokens", r.engine.cache.split_tokens},
        {"layer_groups", groups_json(r)}}},
      {"preemption_policy", r.preemption_policy},
      {"requests", s.requests},
      {"requests_completed", s.requests_completed},
      {"sequences", s.sequences},
      {"prompt_tokens", s.prompt_tokens},
      {"generated_tokens", s.generated_tokens},
      // Equal for runs that generate the same tokens (RunStats::output_digest).
      {"output_digest", fmt::format("{:016x}", s.output_digest)},
      {"speculative",
       {{"max_draft_tokens", r.engine.speculative},
        {"draft_tokens", s.draft_tokens},
        {"accepted_draft_tokens", s.accepted_draft_tokens},
        {"acceptance_rate",
         ratio(static_cast<double>(s.accepted_draft_tokens), static_cast<double>(s.draft_tokens))},
        {"drafter", r.engine.drafter ? "replay" : "lookup"},
        {"rehearsal_output_digest", r.rehearsal_digest.has_value()
                                        ? Json(fmt::format("{:016x}", *r.rehearsal_digest))
                                        : Json(nullptr)},
        {"steps", s.speculative_steps},
        {"tokens_per_step", ratio(static_cast<double>(s.speculative_tokens),
                                  static_cast<double>(s.speculative_steps))}}},
      {"prefill_tokens", s.prefill_tokens},
      {"recompute_tokens", s.recompute_tokens},
      {"decode_tokens", s.decode_tokens},
      {"decode_steps", s.decode_steps},
      {"mean_decode_batch", s.mean_decode_batch()},
      {"steps", s.steps},
      {"prefill_seconds", s.prefill_seconds},
      {"decode_seconds", s.decode_seconds},
      {"wall_seconds", s.wall_seconds},
      {"prefill_tokens_per_second",
       ratio(static_cast<double>(s.prefill_tokens), s.prefill_seconds)},
      {"decode_tokens_per_second", ratio(static_cast<double>(s.decode_tokens), s.decode_seconds)},
      // At admission: each admitted request once.
      {"prefix_cache_hit_rate",
       ratio(static_cast<double>(s.admit_hit_tokens), static_cast<double>(s.admit_query_tokens))},
      {"prefix_hit_tokens", s.admit_hit_tokens},
      {"prefix_query_tokens", s.admit_query_tokens},
      // The allocator's own counters (the metrics' prefix_cache_*_total) count every lookup,
      // so an admission retried after its allocation failed counts again.
      {"allocator_prefix_cache_hit_rate",
       ratio(static_cast<double>(m.prefix_hit_tokens), static_cast<double>(m.prefix_query_tokens))},
      {"allocator_prefix_hit_tokens", m.prefix_hit_tokens},
      {"allocator_prefix_query_tokens", m.prefix_query_tokens},
      // Host tier: hits of admissions found there, and the allocator's tier counters next
      // to the copies the store ran.
      {"host_hit_tokens", s.admit_host_hit_tokens},
      // Loaded from the remote tier at admissions (not in prefix_hit_tokens).
      {"remote_tokens", s.admit_remote_tokens},
      {"allocator_host_hit_tokens", m.host_hit_tokens},
      {"blocks_demoted", m.blocks_demoted},
      {"blocks_promoted", m.blocks_promoted},
      {"demote_blocks_executed", s.demote_blocks_executed},
      {"promote_blocks_executed", s.promote_blocks_executed},
      {"exchange_blocks_executed", s.exchange_blocks_executed},
      {"host_evictions", m.host_evictions},
      {"blocks_not_admitted", m.blocks_not_admitted},
      {"ghost_hits", m.ghost_hits},
      {"cached_host_blocks", m.cached_host_blocks},
      {"peak_used_blocks", s.peak_used_blocks},
      {"peak_used_bytes", s.peak_used_bytes},
      {"kv_utilization", ratio(s.real_slot_steps, s.used_slot_steps)},
      {"preemptions_recompute", m.preemptions_recompute},
      {"preemptions_swap", m.preemptions_swap},
      {"blocks_swapped_out", m.blocks_swapped_out},
      {"blocks_swapped_in", m.blocks_swapped_in},
      {"cow_copies", m.cow_copies},
      {"evictions", m.evictions},
      {"recent_ghost_hits", m.recent_ghost_hits},
      {"frequent_ghost_hits", m.frequent_ghost_hits},
      {"peak_running_sequences", s.peak_running},
      {"peak_decoding_sequences", s.peak_decoding},
      {"capacity",
       {{"tokens", r.capacity.tokens},
        {"sequences", r.capacity.sequences},
        {"sequences_as_full", r.capacity.sequences_as_full},
        {"held_bytes", r.capacity.held_bytes},
        {"held_bytes_as_full", r.capacity.held_bytes_as_full},
        {"min_bytes", r.capacity.min_bytes}}},
      {"contiguous",
       {{"reserved_tokens_per_sequence", r.contiguous_max_len},
        {"peak_concurrency", r.contiguous_peak_concurrency},
        {"utilization", r.contiguous_utilization}}},
      // Sequences whose K/V went through each mechanism (mechanism.h).
      {"mechanism_sequences", std::move(mechanism_sequences)},
      {"mechanisms_exercised", names_json(s.exercised())},
      {"kv_events", kv_events_json(r.kv_events)},
      {"remote", remote_json(r.remote)},
      {"disaggregation", disaggregation_json(r.disaggregation)},
      {"max_step_ms", 1000 * s.max_step_seconds},
      {"max_remote_ms_per_step", 1000 * s.max_remote_seconds},
      {"fault", fault_json(r)},
      {"verify", r.verify.has_value() ? verify_json(*r.verify, s.exercised()) : Json(nullptr)},
  };
  return out.dump(2) + "\n";
}

}  // namespace decode_loop
