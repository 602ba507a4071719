// KvCacheConfig: bytes per token per group, what one sequence keeps, and the split of a
// byte budget into one pool per layer group.
#include "pagedkv/kv_cache_config.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/arithmetic.h"
#include "common/status_macros.h"

namespace pagedkv {

using internal::div_ceil;
namespace {

// "group 1 (sliding_window 1024, 52 layers)" for messages.
std::string describe(const KvCacheConfig& config, int32_t g) {
  const KvCacheGroup& group = config.groups[static_cast<size_t>(g)];
  std::string kind = attention_kind_name(group.kind);
  if (group.kind != AttentionKind::kFull && group.kind != AttentionKind::kState) {
    absl::StrAppend(&kind, " ", group.window);
  }
  return absl::StrCat("group ", g, " (", kind, ", ", config.num_layers(g), " layers)");
}

// A state group: window 0, layers, and some state; its `shape` is not read.
absl::Status validate_state(const KvCacheGroup& group, int32_t g) {
  const StateShape& state = group.state;
  if (group.window != 0) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheConfig: group ", g,
                                                   " is state with window ", group.window,
                                                   "; a state group takes window 0"));
  }
  if (state.num_layers <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheConfig: group ", g,
                                                   ": state.num_layers is ", state.num_layers,
                                                   ", must be at least 1"));
  }
  if (state.conv_elements < 0 || state.recurrent_elements < 0 ||
      state.conv_elements + state.recurrent_elements == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheConfig: group ", g, ": state.conv_elements is ", state.conv_elements,
                     " and state.recurrent_elements is ", state.recurrent_elements,
                     "; both must be >= 0 and one > 0"));
  }
  // A slot beyond 2^40 bytes (a TiB per sequence) is a unit mistake; the bound keeps slot
  // bytes x slot counts inside int64.
  constexpr int64_t kMaxElements = int64_t{1} << 36;
  if (state.conv_elements > kMaxElements || state.recurrent_elements > kMaxElements ||
      state.bytes_per_layer() > (int64_t{1} << 40) / state.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheConfig: group ", g, ": a state slot of ", state.num_layers,
                     " layers x (", state.conv_elements, " + ", state.recurrent_elements,
                     ") elements is more than 2^40 bytes"));
  }
  return absl::OkStatus();
}

// A budget beyond 1 PiB is a unit mistake, and the bound keeps budget x demand products
// well inside 128 bits.
constexpr int64_t kMaxBudgetBytes = int64_t{1} << 50;

}  // namespace

absl::Status KvCacheConfig::validate() const {
  if (groups.empty()) {
    return absl::InvalidArgumentError("KvCacheConfig: no layer groups; a model needs at least one");
  }
  for (int32_t g = 0; g < num_groups(); ++g) {
    const KvCacheGroup& group = groups[static_cast<size_t>(g)];
    switch (group.kind) {
      case AttentionKind::kFull:
        if (group.window != 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("KvCacheConfig: group ", g, " is full attention with window ",
                           group.window, "; full attention takes window 0"));
        }
        break;
      case AttentionKind::kSlidingWindow:
      case AttentionKind::kChunkedLocal:
        if (group.window <= 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("KvCacheConfig: group ", g, " is ", attention_kind_name(group.kind),
                           " with window ", group.window, ", must be at least 1 token"));
        }
        break;
      case AttentionKind::kState:
        PAGEDKV_RETURN_IF_ERROR(validate_state(group, g));
        continue;  // its shape is not read
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("KvCacheConfig: group ", g, " has attention kind value ",
                         static_cast<int>(group.kind), ", not an AttentionKind"));
    }
    if (absl::Status status = group_spec(g).validate(); !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCacheConfig: group ", g, ": ", status.message()));
    }
  }
  bool attention = false;
  for (int32_t g = 0; g < num_groups(); ++g) attention = attention || !is_state(g);
  if (!attention) {
    return absl::InvalidArgumentError(
        "KvCacheConfig: only state groups; a prefix hit is verified along an attention "
        "group's block chain, so state-only models (Mamba, RWKV) are out of scope: add the "
        "attention group");
  }
  if (checkpoints_per_sequence < 0) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheConfig: checkpoints_per_sequence is ",
                                                   checkpoints_per_sequence,
                                                   ", must be at least 0"));
  }
  return absl::OkStatus();
}

KvCacheSpec KvCacheConfig::group_spec(int32_t g) const {
  KvCacheSpec spec = groups[static_cast<size_t>(g)].shape;
  spec.dtype = dtype;
  spec.block_size = block_size;
  return spec;
}

int32_t KvCacheConfig::num_layers(int32_t g) const {
  const KvCacheGroup& group = groups[static_cast<size_t>(g)];
  return group.kind == AttentionKind::kState ? group.state.num_layers : group.shape.num_layers;
}

int32_t KvCacheConfig::num_layers() const {
  int32_t layers = 0;
  for (int32_t g = 0; g < num_groups(); ++g) layers += num_layers(g);
  return layers;
}

int64_t KvCacheConfig::bytes_per_token(int32_t g) const {
  return is_state(g) ? 0 : group_spec(g).bytes_per_token();
}

int64_t KvCacheConfig::page_bytes(int32_t g) const {
  return is_state(g) ? groups[static_cast<size_t>(g)].state.bytes()
                     : group_spec(g).bytes_per_block();
}

int64_t KvCacheConfig::bytes_per_token() const {
  int64_t bytes = 0;
  for (int32_t g = 0; g < num_groups(); ++g) bytes += bytes_per_token(g);
  return bytes;
}

// --- what one sequence keeps ---------------------------------------------------------------

int64_t KvCacheConfig::tokens_attended(int32_t g, int64_t tokens) const {
  if (tokens <= 0) return 0;
  const KvCacheGroup& group = groups[static_cast<size_t>(g)];
  return tokens - first_attended(group.kind, group.window, tokens - 1);
}

int64_t KvCacheConfig::min_bytes_per_sequence(int64_t tokens) const {
  int64_t bytes = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    // A state group keeps its slot whatever the length.
    bytes += is_state(g) ? (tokens > 0 ? page_bytes(g) : 0)
                         : tokens_attended(g, tokens) * bytes_per_token(g);
  }
  return bytes;
}

int64_t KvCacheConfig::blocks_held(int32_t g, int64_t tokens) const {
  if (tokens <= 0) return 0;
  if (is_state(g)) return 1;  // its slot
  const KvCacheGroup& group = groups[static_cast<size_t>(g)];
  const int64_t first_block = first_attended(group.kind, group.window, tokens - 1) / block_size;
  const int64_t last_block = (tokens - 1) / block_size;
  return last_block - first_block + 1;
}

int64_t KvCacheConfig::held_bytes_per_sequence(int64_t tokens) const {
  int64_t bytes = 0;
  for (int32_t g = 0; g < num_groups(); ++g) bytes += blocks_held(g, tokens) * page_bytes(g);
  return bytes;
}

int64_t KvCacheConfig::blocks_per_sequence(int32_t g, int64_t tokens) const {
  if (tokens <= 0) return 0;
  const KvCacheGroup& group = groups[static_cast<size_t>(g)];
  const int64_t all = div_ceil(tokens, block_size);
  switch (group.kind) {
    case AttentionKind::kSlidingWindow:
      return std::min(
          all,
          div_ceil(std::min<int64_t>(tokens, int64_t{group.window} - 1 + block_size), block_size) +
              1);
    case AttentionKind::kChunkedLocal:
      return std::min(all, div_ceil(std::min<int64_t>(tokens, group.window), block_size) + 1);
    case AttentionKind::kState:
      return 1;  // one state slot per sequence
    case AttentionKind::kFull:
      break;
  }
  return all;
}

int64_t KvCacheConfig::split_pages_per_sequence(int32_t g, int64_t tokens) const {
  const int64_t blocks = blocks_per_sequence(g, tokens);
  return is_state(g) && blocks > 0 ? blocks + checkpoints_per_sequence : blocks;
}

int64_t KvCacheConfig::reserved_bytes_per_sequence(int64_t tokens) const {
  int64_t bytes = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    bytes += blocks_per_sequence(g, tokens) * page_bytes(g);
  }
  return bytes;
}

// --- the budget split -----------------------------------------------------------------------

namespace {

// Water filling: `budget` shared in proportion to `demand`, no group above its cap while
// another is below its own; once every group is at its cap, what is left is shared in
// proportion again. No caps: plain proportion.
std::vector<__int128> fill_shares(__int128 budget, const std::vector<__int128>& demand,
                                  const std::vector<__int128>& caps) {
  const size_t n = demand.size();
  std::vector<__int128> share(n, 0);
  std::vector<bool> at_cap(n, false);
  __int128 left = budget;
  // A group over its cap at this level is over it at every later one: the level only
  // rises as capped groups give back their excess.
  for (bool capped = !caps.empty(); capped;) {
    __int128 total = 0;
    for (size_t g = 0; g < n; ++g) total += at_cap[g] ? 0 : demand[g];
    capped = false;
    for (size_t g = 0; g < n && total > 0; ++g) {
      if (at_cap[g] || left * demand[g] / total < caps[g]) continue;
      at_cap[g] = capped = true;
      share[g] = caps[g];
      left -= caps[g];
    }
  }
  const bool all_at_cap = std::find(at_cap.begin(), at_cap.end(), false) == at_cap.end();
  __int128 total = 0;
  for (size_t g = 0; g < n; ++g) total += all_at_cap || !at_cap[g] ? demand[g] : 0;
  for (size_t g = 0; g < n; ++g) {
    if (all_at_cap || !at_cap[g]) share[g] += left * demand[g] / total;
  }
  return share;
}

}  // namespace

absl::StatusOr<PoolSplit> KvCacheConfig::split_budget(int64_t budget_bytes, int64_t target_tokens,
                                                      int64_t cached_tokens) const {
  PAGEDKV_RETURN_IF_ERROR(validate());
  if (budget_bytes < 0 || budget_bytes > kMaxBudgetBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("split_budget: budget is ", budget_bytes, " bytes, must be in [0, 2^50]"));
  }
  if (target_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("split_budget: target length is ", target_tokens,
                                                   " tokens, must be at least 1"));
  }
  if (cached_tokens < 0 || cached_tokens > kMaxBudgetBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("split_budget: cached_tokens is ", cached_tokens, ", must be in [0, 2^50]"));
  }
  // Demand of one target-length sequence in each group, in bytes (a state group's: its
  // running slot and checkpoints); the budget is shared in that proportion, so that every
  // pool holds the same number of such sequences. A cached block is at most one block of
  // each attention group and one checkpoint of each state group.
  std::vector<__int128> demand(groups.size());
  std::vector<__int128> caps;
  for (int32_t g = 0; g < num_groups(); ++g) {
    const int64_t per_sequence = split_pages_per_sequence(g, target_tokens);
    demand[static_cast<size_t>(g)] = static_cast<__int128>(per_sequence) * page_bytes(g);
    if (cached_tokens > 0) {
      caps.push_back(static_cast<__int128>(div_ceil(cached_tokens, block_size) + per_sequence) *
                     page_bytes(g));
    }
  }
  const std::vector<__int128> shares = fill_shares(budget_bytes, demand, caps);
  PoolSplit split;
  split.budget_bytes = budget_bytes;
  split.target_tokens = target_tokens;
  split.cached_tokens = cached_tokens;
  for (int32_t g = 0; g < num_groups(); ++g) {
    const int64_t share = static_cast<int64_t>(shares[static_cast<size_t>(g)]);
    const int64_t page = page_bytes(g);
    const int64_t blocks = std::min<int64_t>(share / page, std::numeric_limits<int32_t>::max());
    if (blocks < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("split_budget: a budget of ", budget_bytes, " bytes gives ",
                       describe(*this, g), " ", share, " bytes, less than one ",
                       is_state(g) ? absl::StrCat("state slot of ", page, " bytes")
                                   : absl::StrCat("page of ", page, " bytes (", block_size,
                                                  " tokens x ", bytes_per_token(g), " bytes)"),
                       "; raise the budget"));
    }
    const KvCacheGroup& group = groups[static_cast<size_t>(g)];
    split.groups.push_back(LayerGroup{
        .kind = group.kind, .window = group.window, .num_blocks = static_cast<int32_t>(blocks)});
    split.pool_bytes.push_back(blocks * page);
    split.used_bytes += blocks * page;
  }
  split.lost_bytes = budget_bytes - split.used_bytes;
  return split;
}

int64_t KvCacheConfig::max_sequences(const PoolSplit& split, int64_t tokens) const {
  int64_t fewest = std::numeric_limits<int64_t>::max();
  for (int32_t g = 0; g < num_groups() && g < static_cast<int32_t>(split.groups.size()); ++g) {
    const int64_t need = blocks_per_sequence(g, tokens);
    if (need == 0) continue;
    fewest = std::min<int64_t>(fewest, split.groups[static_cast<size_t>(g)].num_blocks / need);
  }
  return fewest == std::numeric_limits<int64_t>::max() ? 0 : fewest;
}

}  // namespace pagedkv
