// The model's layers as the allocator's layer groups, and their pools (see cache_plan.h).
#include "cache_plan.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "pagedkv/block_pool.h"

namespace decode_loop {
namespace {

using pagedkv::AttentionKind;

// How the allocator sees layer `l`: its own attention, or full when treated as full.
LayerAttention allocator_view(const ModelConfig& model, int32_t l, bool treat_as_full) {
  return treat_as_full ? LayerAttention{} : model.attention(l);
}

// The scaled watermark the manager gives group g (kv_cache_manager.h, Options::layer_groups).
int32_t group_watermark(const CachePlan& plan, int32_t g) {
  const int64_t wm = watermark_blocks(plan);
  const int64_t blocks = plan.groups[g].num_blocks;
  const int64_t first = plan.groups[0].num_blocks;
  return static_cast<int32_t>(std::min((wm * blocks + first - 1) / first, blocks - 1));
}

}  // namespace

std::string CacheGroup::name() const {
  switch (kind) {
    case AttentionKind::kFull:
      return "full";
    case AttentionKind::kSlidingWindow:
      return absl::StrCat("sliding window ", window);
    case AttentionKind::kChunkedLocal:
      return absl::StrCat("chunked local ", window);
    case AttentionKind::kState:
      return "state";
  }
  return "unknown";
}

int64_t CacheGroup::page_bytes() const {
  return kind == AttentionKind::kState ? state.bytes() : spec.bytes_per_block();
}

int64_t CachePlan::pool_bytes() const {
  int64_t bytes = 0;
  for (const CacheGroup& g : groups) bytes += int64_t{g.num_blocks} * g.page_bytes();
  return bytes;
}

int64_t CachePlan::bytes_per_block_all_groups() const {
  int64_t bytes = 0;
  for (const CacheGroup& g : groups) {
    if (g.kind != AttentionKind::kState) bytes += g.spec.bytes_per_block();
  }
  return bytes;
}

absl::StatusOr<pagedkv::KvCachePlan> CachePlan::kv_plan() const {
  std::vector<pagedkv::LayerGroup> pools;
  for (const CacheGroup& g : groups) {
    pools.push_back({.kind = g.kind,
                     .window = g.window,
                     .num_blocks = g.num_blocks,
                     .num_host_blocks = g.num_host_blocks});
  }
  return pagedkv::KvCachePlan::create(config, std::move(pools));
}

absl::StatusOr<CachePlan> plan_cache(const ModelConfig& model, pagedkv::DType dtype,
                                     int32_t block_size, bool treat_as_full) {
  CachePlan plan;
  plan.treat_as_full = treat_as_full;
  for (int32_t l = 0; l < model.num_layers && treat_as_full; ++l) {
    if (model.is_state_layer(l)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--treat-as-full: layer ", l, " is a state-space layer, which holds no K/V"));
    }
  }
  plan.places.resize(model.num_layers);
  // Full groups first: group 0 anchors the windowed groups' prefix hits.
  for (const bool full : {true, false}) {
    for (int32_t l = 0; l < model.num_layers; ++l) {
      const LayerAttention a = allocator_view(model, l, treat_as_full);
      if ((a.kind == AttentionKind::kFull) != full) continue;
      auto it = std::find_if(plan.groups.begin(), plan.groups.end(), [&](const CacheGroup& g) {
        return g.kind == a.kind && g.window == a.window;
      });
      if (it == plan.groups.end()) {
        it = plan.groups.insert(plan.groups.end(), CacheGroup{.kind = a.kind, .window = a.window});
      }
      plan.places[l] = {.group = static_cast<int32_t>(it - plan.groups.begin()),
                        .index = static_cast<int32_t>(it->layers.size())};
      it->layers.push_back(l);
    }
  }
  plan.config.dtype = dtype;
  plan.config.block_size = block_size;
  for (CacheGroup& g : plan.groups) {
    if (g.kind == AttentionKind::kState) {
      g.state = {.num_layers = static_cast<int32_t>(g.layers.size()),
                 .conv_elements = model.conv_state_elements(),
                 .recurrent_elements = model.recurrent_state_elements(),
                 .conv_dtype = pagedkv::DType::kFloat32,
                 .recurrent_dtype = pagedkv::DType::kFloat32};
      plan.config.groups.push_back({.kind = g.kind, .state = g.state});
      continue;
    }
    g.spec = {.num_layers = static_cast<int32_t>(g.layers.size()),
              .num_kv_heads = model.mla() ? 1 : model.num_kv_heads,
              .head_dim = model.mla() ? model.latent_dim() : model.head_dim,
              .dtype = dtype,
              .block_size = block_size,
              .latent = model.mla()};
    plan.config.groups.push_back({.kind = g.kind, .window = g.window, .shape = g.spec});
  }
  if (absl::Status s = plan.config.validate(); !s.ok()) return s;
  return plan;
}

absl::Status size_pools(const PoolBudgets& budgets, int64_t split_tokens, CachePlan* plan) {
  const pagedkv::KvCacheConfig& config = plan->config;
  plan->split_tokens = split_tokens;
  plan->budget_bytes = budgets.device_bytes;
  absl::StatusOr<pagedkv::PoolSplit> device =
      config.split_budget(budgets.device_bytes, split_tokens);
  if (!device.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-budget-mb: ", device.status().message()));
  }
  // A swap space below one page of some group is no swap space at all.
  absl::StatusOr<pagedkv::PoolSplit> swap = config.split_budget(budgets.swap_bytes, split_tokens);
  absl::StatusOr<pagedkv::PoolSplit> cache;
  if (budgets.host_cache_bytes > 0) {
    cache = config.split_budget(budgets.host_cache_bytes, split_tokens);
    if (!cache.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--host-cache-mb: ", cache.status().message()));
    }
  }
  for (int32_t g = 0; g < plan->num_groups(); ++g) {
    CacheGroup& group = plan->groups[g];
    group.num_blocks = device->groups[g].num_blocks;
    const int64_t swap_blocks = swap.ok() ? swap->groups[g].num_blocks : 0;
    group.host_cache_blocks = cache.ok() ? cache->groups[g].num_blocks : 0;
    const int64_t host_blocks = swap_blocks + group.host_cache_blocks;
    if (host_blocks > pagedkv::BlockPool::kMaxBlocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--swap-space-mb + --host-cache-mb: ", host_blocks, " host blocks in group ", g, " (",
          group.name(), "), more than the limit ", pagedkv::BlockPool::kMaxBlocks));
    }
    group.num_host_blocks = static_cast<int32_t>(host_blocks);
  }
  // A windowed pool must hold a window's blocks (a state pool a slot) beside its
  // watermark, or no sequence could ever decode in it.
  for (int32_t g = 0; g < plan->num_groups(); ++g) {
    const CacheGroup& group = plan->groups[g];
    if (group.kind == AttentionKind::kFull) continue;
    const int64_t window_blocks =
        config.blocks_per_sequence(g, std::numeric_limits<int32_t>::max());
    const int32_t usable = group.num_blocks - group_watermark(*plan, g);
    if (usable < window_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-budget-mb: group ", g, " (", group.name(), ") gets ", group.num_blocks,
                       " blocks, ", usable, " beside its watermark; a sequence needs ",
                       window_blocks, " for its window or state: raise the budget"));
    }
  }
  return absl::OkStatus();
}

int32_t watermark_blocks(const CachePlan& plan) {
  return std::max(1, plan.groups[0].num_blocks / 100);
}

absl::StatusOr<int32_t> max_sequence_tokens(const CachePlan& plan, int32_t prefill_chunk) {
  const int32_t bs = plan.config.block_size;
  int32_t blocks = std::numeric_limits<int32_t>::max();
  for (int32_t g = 0; g < plan.num_groups(); ++g) {
    const CacheGroup& group = plan.groups[g];
    const int32_t usable = group.num_blocks - group_watermark(plan, g);
    if (group.kind == AttentionKind::kState) continue;  // a slot, whatever the length
    if (group.kind == AttentionKind::kFull || prefill_chunk == 0) {
      blocks = std::min(blocks, usable);
      continue;
    }
    // A chunk's blocks and the window of its first token, straddling block boundaries.
    const int64_t chunk_blocks = (int64_t{group.window} - 1 + prefill_chunk + bs - 1) / bs + 1;
    if (usable < chunk_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-budget-mb: group ", g, " (", group.name(), ") gets ", usable,
                       " blocks beside its watermark; a prefill chunk of ", prefill_chunk,
                       " tokens and its "
                       "window need ",
                       chunk_blocks, ": raise the budget or lower --prefill-chunk"));
    }
  }
  return blocks * bs;
}

}  // namespace decode_loop
