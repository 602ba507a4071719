// Internal: what KvCacheManager keeps per layer group (pagedkv/layer_group.h).
//
// Every group has a device pool and a host pool of its own, with blocks of its own layers'
// bytes, and its own host tier; the step ledger is shared (one step for all groups). A
// sequence holds one table per group (Sequence::tables), of the same block size, so entry
// i of every table holds the same tokens.
//
// Which blocks a group needs: a full group every block of the context; a windowed group
// the blocks from first_attended() of the next token to compute; a state group one state
// slot. A prefix hit of p blocks needs, in every attention group, the blocks that the
// token at p * block_size attends to, and in every state group a checkpoint at p.
#ifndef PAGEDKV_CACHE_GROUP_POOLS_H_
#define PAGEDKV_CACHE_GROUP_POOLS_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "cache/host_tier.h"
#include "pagedkv/block_pool.h"
#include "pagedkv/layer_group.h"

namespace pagedkv::internal {

// What match_prefix() found in one group, entry by entry; scratch reused across calls.
struct GroupMatch {
  enum State : uint8_t { kUnknown, kFound, kMissing };
  std::vector<BlockId> device;  // the verified device hit of an entry, or kNoBlock
  std::vector<BlockId> host;    // the verified host-tier hit, or kNoBlock
  std::vector<uint64_t> keys;   // full groups: the content key of the entry's hit
  std::vector<uint8_t> state;   // windowed groups: looked up yet, and found
  // Full groups: the chain's device hits, then host hits up to chain_end.
  int32_t device_run = 0;
  int32_t chain_end = 0;
  // Scratch of the claim: entries to promote and their host blocks.
  std::vector<int32_t> promote_at;
  std::vector<BlockId> promote_hits;
  std::vector<uint64_t> parent_keys;
  BlockId partial_src = kNoBlock;   // the block partial-block reuse copies from
  BlockId checkpoint = kNoBlock;    // state groups: the checkpoint the hit restores,
  bool checkpoint_on_host = false;  // a device slot, or a host-tier slot when this is set

  // Sizes the scratch for `n` entries; a windowed group's entries become unknown.
  void reset(int32_t n, bool windowed) {
    const auto size = static_cast<size_t>(n);
    if (device.size() < size) {
      device.resize(size);
      host.resize(size);
      keys.resize(size);
      state.resize(size);
    }
    if (windowed) std::fill_n(state.begin(), size, kUnknown);
  }
};

struct GroupPools {
  LayerGroup spec;
  int32_t index = 0;             // its place in the manager's groups
  int32_t watermark_blocks = 0;  // Options::watermark_blocks, scaled to the group's pool
  BlockPool device;
  BlockPool host;
  std::unique_ptr<HostTier> host_tier;  // null without Options::enable_host_cache
  GroupMatch match;                     // match_prefix()'s scratch

  bool full() const { return spec.kind == AttentionKind::kFull; }
  bool windowed() const {
    return spec.kind == AttentionKind::kSlidingWindow || spec.kind == AttentionKind::kChunkedLocal;
  }
  // A state group's pool holds state slots: a sequence's table is its one slot, and the
  // cached slots are checkpoints, each indexed under the hash of the block it ends.
  bool holds_state() const { return spec.kind == AttentionKind::kState; }

  // The first table entry that a token at position `pos` needs.
  int32_t first_needed_block(int64_t pos, int32_t block_size) const {
    return static_cast<int32_t>(first_attended(spec.kind, spec.window, pos) / block_size);
  }
};

// What the host tier works on in group `g`.
inline HostTier::Pools pools_of(GroupPools& g, StepLedger& ledger) {
  return {g.device, g.host, ledger, g.index};
}

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_GROUP_POOLS_H_
