// FullAttentionGroup: a sequence holds its whole context; hits are the verified chain.
#include "cache/full_attention_group.h"

#include <algorithm>

namespace pagedkv::internal {

int64_t FullAttentionGroup::blocks_to_run(int64_t prompt_tokens) const {
  return num_blocks_for_tokens(prompt_tokens, shared_.block_size);
}

int32_t FullAttentionGroup::begin_match(const Sequence& seq, int32_t max_blocks) {
  const int32_t bs = shared_.block_size;
  hits_.reserve(max_blocks);
  if (std::ssize(keys_) < max_blocks) keys_.resize(max_blocks);
  uint64_t parent = 0;
  int32_t free_hits = 0;  // device hits in the free queue: sharing takes them out of it
  int32_t i = 0;
  for (; i < max_blocks; ++i) {
    const BlockId hit = device().indexed_block(seq.block_hashes[i], key_space());
    if (hit == kNoBlock ||
        !device().holds_contents(hit, parent, block_tokens(seq, i, bs), seq.extra_keys)) {
      break;
    }
    hits_.device[i] = hit;
    keys_[i] = parent = device().content_key(hit);
    free_hits += device().ref_count_unchecked(hit) == 0;
  }
  device_run_ = i;
  if (host_tier() != nullptr) {
    const int32_t end = std::min(max_blocks, i + room(free_hits));
    for (; i < end; ++i) {
      const BlockId hit = HostTier::find_hit(host(), seq.block_hashes[i], parent,
                                             block_tokens(seq, i, bs), seq.extra_keys);
      if (hit == kNoBlock) break;
      hits_.host[i] = hit;
      keys_[i] = parent = host().content_key(hit);
    }
  }
  chain_end_ = i;
  return i;
}

int32_t FullAttentionGroup::longest_hit(const Sequence&, int32_t p) {
  return std::min(p, chain_end_);
}

uint64_t FullAttentionGroup::parent_key(const Sequence& seq, int32_t entry, bool matched) const {
  return matched ? keys_[entry - 1] : held_key(seq, entry - 1);
}

// Along its own chain: each block after the one before it in the table.
void FullAttentionGroup::index_run(Sequence& seq, int32_t first, int32_t n, bool) {
  const int32_t bs = shared_.block_size;
  const std::vector<BlockId>& blocks = table(seq).blocks;
  device().cache_full_blocks_unchecked(
      std::span<const BlockId>(blocks).subspan(first, n),
      std::span<const BlockHash>(seq.block_hashes).subspan(first, n),
      first == 0 ? kNoBlock : blocks[first - 1],
      first == 0 ? nullptr : &seq.block_hashes[first - 1],
      std::span<const TokenId>(seq.tokens)
          .subspan(static_cast<size_t>(first) * bs, static_cast<size_t>(n) * bs),
      seq.extra_keys, {}, key_space());
}

void FullAttentionGroup::take_dead_contents(std::vector<uint64_t>& out) {
  out.clear();
  auto holds = [](const BlockPoolCore& pool, const BlockPoolCore::DeadContent& d) {
    const BlockId b = pool.indexed_block(d.hash);
    return b != kNoBlock && pool.content_key(b) == d.content_key;
  };
  for (BlockPoolCore* pool : {&device(), &host()}) {
    if (!pool->has_dead_contents()) continue;
    pool->take_dead_contents(dead_);
    for (const BlockPoolCore::DeadContent& d : dead_) {
      if (!holds(device(), d) && !holds(host(), d)) out.push_back(d.content_key);
    }
  }
}

}  // namespace pagedkv::internal
