// The capacity planner: pagedkv's pool split for a budget, sequences that fit, and vLLM's
// grouping of the same layers beside it.
#include "pagedkv/capacity_plan.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/arithmetic.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace pagedkv {

using internal::div_ceil;
namespace {

// What makes two layers' vLLM KVCacheSpec equal: attention type, window, shape (dtype and
// block size are the config's, shared by all).
bool same_spec(const KvCacheGroup& a, const KvCacheGroup& b) {
  return a.kind == b.kind && a.window == b.window && a.shape.num_kv_heads == b.shape.num_kv_heads &&
         a.shape.head_dim == b.shape.head_dim && a.shape.latent == b.shape.latent;
}

// Blocks one sequence of `tokens` takes in a group of `kind`/`window` whose blocks hold
// `block_size` tokens: the split rule of KvCacheConfig::blocks_per_sequence() at that size.
int64_t blocks_at(const KvCacheGroup& group, int32_t block_size, int64_t tokens) {
  KvCacheConfig one{.groups = {group}, .block_size = block_size};
  return one.blocks_per_sequence(0, tokens);
}

std::string with_commas(int64_t v) {
  std::string digits = absl::StrCat(v < 0 ? -v : v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string gib(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / static_cast<double>(1 << 30));
}

std::string kind_label(const KvCacheGroup& g) {
  switch (g.kind) {
    case AttentionKind::kSlidingWindow:
      return absl::StrCat("sliding window ", with_commas(g.window));
    case AttentionKind::kChunkedLocal:
      return absl::StrCat("chunked local ", with_commas(g.window));
    case AttentionKind::kState:
      return "state";
    case AttentionKind::kFull:
      break;
  }
  return "full";
}

std::string shape_label(const KvCacheSpec& s) {
  return s.latent ? absl::StrCat("latent ", s.head_dim)
                  : absl::StrCat(s.num_kv_heads, " x ", s.head_dim);
}

}  // namespace

// --- vLLM's grouping -------------------------------------------------------------------------

VllmGrouping vllm_grouping(const KvCacheConfig& config, int64_t budget_bytes,
                           int64_t target_tokens) {
  VllmGrouping v;
  // get_kv_cache_groups() groups layers by spec; our groups already are one kind and
  // window each, so merge only groups whose specs are equal.
  std::vector<int32_t> type_of(config.groups.size());
  std::vector<int32_t> type_first;  // a config group per distinct spec
  std::vector<int32_t> type_layers;
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    size_t t = 0;
    while (t < type_first.size() && !same_spec(config.groups[static_cast<size_t>(type_first[t])],
                                               config.groups[static_cast<size_t>(g)])) {
      ++t;
    }
    if (t == type_first.size()) {
      type_first.push_back(g);
      type_layers.push_back(0);
    }
    type_of[static_cast<size_t>(g)] = static_cast<int32_t>(t);
    type_layers[t] += config.groups[static_cast<size_t>(g)].shape.num_layers;
  }
  const int32_t total_layers = config.num_layers();
  auto layer_page = [&](int32_t g) {
    KvCacheSpec one = config.group_spec(g);
    one.num_layers = 1;
    return one.bytes_per_block();
  };
  bool one_kind = true;
  for (const KvCacheGroup& g : config.groups) {
    one_kind = one_kind && g.kind == config.groups[0].kind && g.window == config.groups[0].window;
  }

  if (type_first.size() == 1) {
    // is_kv_cache_spec_uniform(): _get_kv_cache_groups_uniform_spec(), one group of all
    // layers, group_size tensors of one layer's page each.
    v.rule = "uniform_spec";
    v.group_size = total_layers;
    v.page_bytes = layer_page(0);
    v.block_bytes = v.page_bytes * total_layers;
    v.groups.push_back(
        {.source_group = 0,
         .num_layers = total_layers,
         .block_size = config.block_size,
         .blocks_per_sequence = blocks_at(config.groups[0], config.block_size, target_tokens)});
  } else if (one_kind) {
    // UniformTypeKVCacheSpecs: one attention type, layers of different shapes, one group;
    // each layer's tensor holds its own page per block.
    v.rule = "uniform_type";
    v.group_size = total_layers;
    for (int32_t g = 0; g < config.num_groups(); ++g) {
      v.block_bytes += layer_page(g) * config.groups[static_cast<size_t>(g)].shape.num_layers;
    }
    v.groups.push_back(
        {.source_group = 0,
         .num_layers = total_layers,
         .block_size = config.block_size,
         .blocks_per_sequence = blocks_at(config.groups[0], config.block_size, target_tokens)});
  } else {
    // unify_kv_cache_spec_page_size(): smaller pages grow their block size to the largest
    // page, which must be a multiple of each.
    v.rule = "uniform_page_size";
    int64_t max_page = 0;
    for (int32_t g = 0; g < config.num_groups(); ++g) max_page = std::max(max_page, layer_page(g));
    std::vector<int32_t> type_block_size(type_first.size());
    for (size_t t = 0; t < type_first.size(); ++t) {
      const int64_t page = layer_page(type_first[t]);
      if (max_page % page != 0) {
        v.rule = "unsupported";
        v.reason =
            absl::StrCat("unify_kv_cache_spec_page_size() raises NotImplementedError: page of ",
                         max_page, " bytes is not a multiple of ", page, " bytes (",
                         kind_label(config.groups[static_cast<size_t>(type_first[t])]), ")");
        return v;
      }
      type_block_size[t] = static_cast<int32_t>(config.block_size * (max_page / page));
    }
    // _get_kv_cache_groups_uniform_page_size(): group_size is the fewest layers of a type,
    // or the most when that is below 1.5x the fewest; each type is cut into
    // ceil(layers / group_size) groups (layers[i::num_groups]), padded to group_size.
    const int32_t min_layers = *std::min_element(type_layers.begin(), type_layers.end());
    const int32_t max_layers = *std::max_element(type_layers.begin(), type_layers.end());
    v.group_size = max_layers < 1.5 * min_layers ? max_layers : min_layers;
    for (size_t t = 0; t < type_first.size(); ++t) {
      const int32_t n = type_layers[t];
      const int32_t num_groups = static_cast<int32_t>(div_ceil(n, v.group_size));
      v.padding_layers += num_groups * v.group_size - n;
      const KvCacheGroup& source = config.groups[static_cast<size_t>(type_first[t])];
      for (int32_t i = 0; i < num_groups; ++i) {
        v.groups.push_back(
            {.source_group = type_first[t],
             .num_layers = static_cast<int32_t>(div_ceil(n - i, num_groups)),
             .block_size = type_block_size[t],
             .blocks_per_sequence = blocks_at(source, type_block_size[t], target_tokens)});
      }
    }
    v.page_bytes = max_page;
    v.block_bytes = max_page * v.group_size;
  }
  // get_kv_cache_config_from_groups(): group_size tensors of num_blocks pages each.
  v.num_blocks = budget_bytes / v.block_bytes;
  if (v.rule == "uniform_page_size") {
    // Blocks of the pool spread over the groups as target-length sequences take them; a
    // block of a group with n real layers carries group_size - n padding pages.
    int64_t blocks = 0, padded_pages = 0;
    for (const VllmKvCacheGroup& g : v.groups) {
      blocks += g.blocks_per_sequence;
      padded_pages += g.blocks_per_sequence * (v.group_size - g.num_layers);
    }
    if (blocks > 0) {
      v.padding_bytes = static_cast<int64_t>(static_cast<__int128>(v.num_blocks) * v.page_bytes *
                                             padded_pages / blocks);
    }
  }
  v.waste_fraction = budget_bytes > 0
                         ? static_cast<double>(v.padding_bytes) / static_cast<double>(budget_bytes)
                         : 0.0;
  return v;
}

int64_t vllm_max_sequences(const KvCacheConfig& config, const VllmGrouping& vllm, int64_t tokens) {
  int64_t blocks = 0;
  for (const VllmKvCacheGroup& g : vllm.groups) {
    blocks += blocks_at(config.groups[static_cast<size_t>(g.source_group)], g.block_size, tokens);
  }
  return blocks > 0 ? vllm.num_blocks / blocks : 0;
}

// --- vLLM's attention block size beside state layers ------------------------------------------

absl::StatusOr<int32_t> vllm_state_block_size(const KvCacheConfig& config,
                                              const VllmStateBlockOptions& options) {
  if (options.kernel_alignment < 0 || options.prefix_caching_chunk < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vllm_state_block_size: kernel_alignment is ", options.kernel_alignment,
                     " and prefix_caching_chunk is ", options.prefix_caching_chunk,
                     "; neither may be negative"));
  }
  int32_t attention = -1;
  int64_t state_page = 0;
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    const KvCacheGroup& group = config.groups[static_cast<size_t>(g)];
    if (group.kind == AttentionKind::kState) {
      state_page = std::max(state_page, group.state.bytes_per_layer());
    } else if (attention < 0) {
      attention = g;
    }
  }
  if (state_page <= 0) {
    return absl::InvalidArgumentError(
        "vllm_state_block_size: the config has no state group with state bytes; vLLM's rule "
        "applies to attention beside state layers");
  }
  if (attention < 0) {
    return absl::InvalidArgumentError(
        "vllm_state_block_size: the config has no attention group; vLLM's rule sizes the "
        "attention block beside state layers");
  }
  // FullAttentionSpec / MLAAttentionSpec with block_size 1: one layer, one token.
  KvCacheSpec one = config.group_spec(attention);
  one.num_layers = 1;
  const int64_t token_page = one.bytes_per_token();
  if (token_page <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vllm_state_block_size: group ", attention, " has ", token_page,
                     " KV bytes per token and layer, must be positive"));
  }
  const int64_t a = options.kernel_alignment > 0 ? options.kernel_alignment : one.latent ? 64 : 16;
  int64_t block = 0;
  if (options.prefix_caching_chunk > 0) {
    const int64_t chunk = std::lcm(int64_t{options.prefix_caching_chunk}, a);
    block = chunk * div_ceil(div_ceil(state_page, token_page), chunk);
  } else {
    block = a * div_ceil(state_page, a * token_page);
  }
  if (block > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("vllm_state_block_size: ", block, " tokens, more than 2^31 - 1 (state page ",
                     state_page, " bytes, token page ", token_page, " bytes)"));
  }
  return static_cast<int32_t>(block);
}

// --- the plan --------------------------------------------------------------------------------

absl::StatusOr<CapacityPlan> plan_capacity(const KvCacheConfig& config,
                                           const PlanOptions& options) {
  PAGEDKV_RETURN_IF_ERROR(config.validate());
  if (options.budget_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan_capacity: budget is ", options.budget_bytes, " bytes, must be positive"));
  }
  if (options.max_model_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan_capacity: max_model_len is ", options.max_model_len,
        ", must be at least 1 (the config names no max_position_embeddings: pass one)"));
  }
  CapacityPlan plan;
  plan.config = config;
  plan.budget_bytes = options.budget_bytes;
  plan.max_model_len = options.max_model_len;
  plan.target_tokens = options.target_tokens == 0 ? options.max_model_len : options.target_tokens;
  if (plan.target_tokens < 1 || plan.target_tokens > plan.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("plan_capacity: target length is ",
                                                   plan.target_tokens, " tokens, must be in [1, ",
                                                   plan.max_model_len, "] (max_model_len)"));
  }
  PAGEDKV_ASSIGN_OR_RETURN(plan.split, config.split_budget(plan.budget_bytes, plan.target_tokens,
                                                           options.cached_tokens));
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    plan.groups.push_back({.group = config.groups[static_cast<size_t>(g)],
                           .bytes_per_token = config.bytes_per_token(g),
                           .page_bytes = config.page_bytes(g),
                           .blocks_per_sequence = config.blocks_per_sequence(g, plan.target_tokens),
                           .num_blocks = plan.split.groups[static_cast<size_t>(g)].num_blocks,
                           .pool_bytes = plan.split.pool_bytes[static_cast<size_t>(g)]});
  }
  plan.waste_fraction = static_cast<double>(plan.padding_bytes + plan.split.lost_bytes) /
                        static_cast<double>(plan.budget_bytes);
  plan.vllm = vllm_grouping(config, plan.budget_bytes, plan.target_tokens);
  if (plan.vllm.rule == "unsupported") plan.notes.push_back("vLLM: " + plan.vllm.reason);

  std::vector<int64_t> lengths = options.lengths;
  if (lengths.empty()) lengths = {plan.target_tokens, plan.max_model_len};
  for (int64_t tokens : lengths) {
    if (tokens < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan_capacity: length ", tokens, " tokens, must be at least 1"));
    }
    if (tokens > plan.max_model_len) {
      plan.notes.push_back(absl::StrCat("length ", with_commas(tokens), " capped at max_model_len ",
                                        with_commas(plan.max_model_len)));
      tokens = plan.max_model_len;
    }
    if (std::any_of(plan.lengths.begin(), plan.lengths.end(),
                    [&](const LengthPlan& l) { return l.tokens == tokens; })) {
      continue;
    }
    const int64_t min_bytes = config.min_bytes_per_sequence(tokens);
    plan.lengths.push_back({.tokens = tokens,
                            .min_bytes = min_bytes,
                            .held_bytes = config.held_bytes_per_sequence(tokens),
                            .reserved_bytes = config.reserved_bytes_per_sequence(tokens),
                            .sequences = config.max_sequences(plan.split, tokens),
                            .vllm_sequences = vllm_max_sequences(config, plan.vllm, tokens),
                            .ideal_sequences = plan.budget_bytes / min_bytes});
  }
  // An engine refuses a max_model_len that no pool can hold once; say which pool is short.
  for (const GroupPlan& g : plan.groups) {
    const int64_t need =
        KvCacheConfig{.groups = {g.group}, .dtype = config.dtype, .block_size = config.block_size}
            .blocks_per_sequence(0, plan.max_model_len);
    if (g.num_blocks < need) {
      plan.notes.push_back(
          absl::StrCat("one sequence of max_model_len ", with_commas(plan.max_model_len),
                       " tokens does not fit: ", kind_label(g.group), " needs ", with_commas(need),
                       " blocks, its pool has ", with_commas(g.num_blocks),
                       "; raise the budget, lower max_model_len or split for a "
                       "longer target"));
    }
  }
  return plan;
}

absl::StatusOr<CapacityPlan> plan_capacity(const HfModelConfig& model, const PlanOptions& options) {
  PlanOptions resolved = options;
  if (resolved.max_model_len == 0) resolved.max_model_len = model.max_position_embeddings;
  PAGEDKV_ASSIGN_OR_RETURN(CapacityPlan plan, plan_capacity(model.kv, resolved));
  plan.model_type = model.model_type;
  plan.notes.insert(plan.notes.begin(), model.notes.begin(), model.notes.end());
  return plan;
}

// --- output ----------------------------------------------------------------------------------

std::string format_plan_text(const CapacityPlan& plan) {
  const KvCacheConfig& c = plan.config;
  std::string out = absl::StrFormat(
      "model %s: %d layers in %d group%s, KV %s, %d-token blocks\n"
      "budget %s (%s bytes); max_model_len %s; pools split for %s-token sequences%s\n\n",
      plan.model_type.empty() ? "(unnamed)" : plan.model_type, c.num_layers(), c.num_groups(),
      c.num_groups() == 1 ? "" : "s", kv_dtype_name(c.dtype), c.block_size, gib(plan.budget_bytes),
      with_commas(plan.budget_bytes), with_commas(plan.max_model_len),
      with_commas(plan.target_tokens),
      plan.split.cached_tokens == 0
          ? ""
          : absl::StrCat(" and ", with_commas(plan.split.cached_tokens), " cached tokens"));
  absl::StrAppendFormat(&out, "%-24s %6s %10s %12s %12s %10s %10s %11s\n", "group", "layers",
                        "KV shape", "bytes/token", "page bytes", "blocks/seq", "blocks", "pool");
  int64_t total_bpt = 0;
  for (const GroupPlan& g : plan.groups) {
    absl::StrAppendFormat(&out, "%-24s %6d %10s %12s %12s %10s %10s %11s\n", kind_label(g.group),
                          g.group.shape.num_layers, shape_label(g.group.shape),
                          with_commas(g.bytes_per_token), with_commas(g.page_bytes),
                          with_commas(g.blocks_per_sequence), with_commas(g.num_blocks),
                          gib(g.pool_bytes));
    total_bpt += g.bytes_per_token;
  }
  absl::StrAppendFormat(&out, "%-24s %6d %10s %12s\n\n", "all layers", c.num_layers(), "",
                        with_commas(total_bpt));
  absl::StrAppendFormat(&out,
                        "pagedkv: one pool per group, no padding; %s bytes below a page lost "
                        "(%.4f%% of the budget)\n",
                        with_commas(plan.split.lost_bytes), 100.0 * plan.waste_fraction);
  const VllmGrouping& v = plan.vllm;
  if (v.rule == "uniform_page_size") {
    std::vector<std::string> sizes;
    for (const VllmKvCacheGroup& g : v.groups) {
      sizes.push_back(absl::StrCat(g.num_layers));
    }
    absl::StrAppendFormat(
        &out,
        "vLLM:    %d KV cache groups of %d layers (real layers %s), %d padding layers; %s "
        "bytes of padding (%.2f%% of the budget) at %s tokens\n",
        v.groups.size(), v.group_size, absl::StrJoin(sizes, "/"), v.padding_layers,
        with_commas(v.padding_bytes), 100.0 * v.waste_fraction, with_commas(plan.target_tokens));
  } else if (v.rule == "unsupported") {
    absl::StrAppendFormat(&out, "vLLM:    cannot group this model: %s\n", v.reason);
  } else {
    absl::StrAppendFormat(
        &out, "vLLM:    one KV cache group (%s), no padding (0.00%% of the budget)\n", v.rule);
  }
  absl::StrAppendFormat(&out, "\n%10s %14s %14s %8s %14s %10s %10s %10s\n", "tokens",
                        "min bytes/seq", "held bytes", "held/min", "set aside", "pagedkv", "vLLM",
                        "ideal");
  for (const LengthPlan& l : plan.lengths) {
    absl::StrAppendFormat(&out, "%10s %14s %14s %8.4f %14s %10s %10s %10s\n", with_commas(l.tokens),
                          with_commas(l.min_bytes), with_commas(l.held_bytes),
                          static_cast<double>(l.held_bytes) / static_cast<double>(l.min_bytes),
                          with_commas(l.reserved_bytes), with_commas(l.sequences),
                          with_commas(l.vllm_sequences), with_commas(l.ideal_sequences));
  }
  absl::StrAppend(&out,
                  "(sequences that fit at once; ideal: budget / min bytes, with no blocks, "
                  "padding or split)\n");
  for (const std::string& note : plan.notes) absl::StrAppend(&out, "note: ", note, "\n");
  return out;
}

std::string format_plan_json(const CapacityPlan& plan) {
  using OrderedJson = nlohmann::ordered_json;
  const KvCacheConfig& c = plan.config;
  OrderedJson groups = OrderedJson::array();
  for (const GroupPlan& g : plan.groups) {
    groups.push_back({{"kind", attention_kind_name(g.group.kind)},
                      {"window", g.group.window},
                      {"layers", g.group.shape.num_layers},
                      {"kv_heads", g.group.shape.num_kv_heads},
                      {"head_dim", g.group.shape.head_dim},
                      {"latent", g.group.shape.latent},
                      {"bytes_per_token", g.bytes_per_token},
                      {"page_bytes", g.page_bytes},
                      {"blocks_per_sequence", g.blocks_per_sequence},
                      {"num_blocks", g.num_blocks},
                      {"pool_bytes", g.pool_bytes}});
  }
  const VllmGrouping& v = plan.vllm;
  OrderedJson vllm_groups = OrderedJson::array();
  for (const VllmKvCacheGroup& g : v.groups) {
    vllm_groups.push_back({{"source_group", g.source_group},
                           {"layers", g.num_layers},
                           {"padding_layers", v.group_size - g.num_layers},
                           {"block_size", g.block_size},
                           {"blocks_per_sequence", g.blocks_per_sequence}});
  }
  OrderedJson lengths = OrderedJson::array();
  for (const LengthPlan& l : plan.lengths) {
    lengths.push_back(
        {{"tokens", l.tokens},
         {"min_bytes", l.min_bytes},
         {"held_bytes", l.held_bytes},
         {"held_over_min", static_cast<double>(l.held_bytes) / static_cast<double>(l.min_bytes)},
         {"reserved_bytes", l.reserved_bytes},
         {"sequences", l.sequences},
         {"vllm_sequences", l.vllm_sequences},
         {"ideal_sequences", l.ideal_sequences}});
  }
  OrderedJson json = {{"model_type", plan.model_type},
                      {"kv_dtype", kv_dtype_name(c.dtype)},
                      {"block_size", c.block_size},
                      {"layers", c.num_layers()},
                      {"budget_bytes", plan.budget_bytes},
                      {"max_model_len", plan.max_model_len},
                      {"target_tokens", plan.target_tokens},
                      {"cached_tokens", plan.split.cached_tokens},
                      {"bytes_per_token", c.bytes_per_token()},
                      {"groups", groups},
                      {"padding_bytes", plan.padding_bytes},
                      {"lost_bytes", plan.split.lost_bytes},
                      {"waste_fraction", plan.waste_fraction},
                      {"vllm",
                       {{"source",
                         "vllm/v1/core/kv_cache_utils.py@001cabc1be16a59a70d720ed61a13b678c060a18: "
                         "get_kv_cache_groups, _get_kv_cache_groups_uniform_page_size"},
                        {"rule", v.rule},
                        {"reason", v.reason},
                        {"group_size", v.group_size},
                        {"groups", vllm_groups},
                        {"padding_layers", v.padding_layers},
                        {"page_bytes", v.page_bytes},
                        {"block_bytes", v.block_bytes},
                        {"num_blocks", v.num_blocks},
                        {"padding_bytes", v.padding_bytes},
                        {"waste_fraction", v.waste_fraction}}},
                      {"lengths", lengths},
                      {"notes", plan.notes}};
  return json.dump(2) + "\n";
}

}  // namespace pagedkv
