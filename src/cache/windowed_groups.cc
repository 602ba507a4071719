// KvCacheManager's windowed groups (sliding window, chunked local): releasing the entries
// behind a window, the eviction class a released block keeps (docs/allocator.md,
// "Eviction in windowed groups"), and dropping windowed blocks whose anchor content is gone.
#include "pagedkv/kv_cache_manager.h"

#include "cache/group_pools.h"
#include "cache/sequence.h"
#include "cache/step_ledger.h"
#include "common/arithmetic.h"

namespace pagedkv {

using internal::div_ceil;
using internal::GroupPools;
using internal::GroupTable;
using internal::Hold;
using internal::Sequence;

// Releases the entries [first_held, end) of a windowed group's table: no future token of
// the sequence attends to them. Hashed blocks stay cached, so a later prompt can still hit
// them, in the retention class of the hit points they complete (window_priority()); they
// go in table order, so within a class the free queue evicts a window from its start.
void KvCacheManager::release_behind_window(Sequence& seq, GroupPools& g, int32_t end) {
  GroupTable& t = seq.tables[g.index];
  BlockId last_clean = kNoBlock;
  for (int32_t i = t.first_held; i < end; ++i) {
    set_release_retention(seq, g, i);
    ledger_->release(g.device, Hold::kDevice, g.index, t.blocks[i], last_clean);
    t.blocks[i] = kNoBlock;
  }
  group_counters_[g.index].released_blocks += end - t.first_held;
  t.first_held = end;
}

// The retention priority of entry i of a windowed group when `seq` releases it: the class
// of the most useful hit point whose window holds the entry (a hit of p blocks needs
// entries first_needed_block(p x block_size) to p - 1). Top: the branch points of the
// sequence's match (its full-group chain's end, its hit's end: a later prompt is likely to
// stop there again); below, the checkpoints, coarser ones higher; lowest, none.
int32_t KvCacheManager::window_priority(const Sequence& seq, const GroupPools& g,
                                        int32_t entry) const {
  const int32_t bs = options_.block_size;
  const int32_t levels =
      options_.window_checkpoint_tokens > 0 ? options_.window_checkpoint_levels : 0;
  const int32_t top = 2 + levels;
  // A hit point lies within the sequence's full blocks: past them, no later prompt with
  // this content can stop there.
  const int64_t full_blocks = static_cast<int64_t>(seq.tokens.size()) / bs;
  auto completes = [&](int64_t point) {  // in blocks
    return point > entry && point <= full_blocks && g.first_needed_block(point * bs, bs) <= entry;
  };
  int32_t cls = 1;
  if (completes(seq.match_chain_end) || completes(seq.match_hit)) {
    cls = top;
  } else {
    int64_t spacing = options_.window_checkpoint_tokens;
    for (int32_t level = 0; level < levels && spacing >= bs; ++level, spacing /= 2) {
      // The first checkpoint past the entry; a later one's window starts later still.
      const int64_t k = div_ceil(int64_t{entry + 1} * bs, spacing);
      if (completes(k * spacing / bs)) {
        cls = top - 1 - level;
        break;
      }
    }
  }
  return kDefaultRetentionPriority - (top - cls);
}

// Drops the windowed blocks and checkpoints cached after anchor contents that are gone
// from both of the anchor's pools: no hit can verify them again, and they would outlive
// their anchors.
void KvCacheManager::bury_dead_windows() {
  GroupPools& anchor = groups_[anchor_];
  for (BlockPool* pool : {&anchor.device, &anchor.host}) {
    if (!pool->has_dead_contents()) continue;
    pool->take_dead_contents(dead_);
    for (const BlockPool::DeadContent& d : dead_) {
      auto holds = [&](const BlockPool& p) {
        const BlockId b = p.indexed_block(d.hash);
        return b != kNoBlock && p.content_key(b) == d.content_key;
      };
      if (holds(anchor.device) || holds(anchor.host)) continue;
      for (GroupPools& g : groups_) {
        if (g.full()) continue;
        g.device.uncache_children(d.content_key);
        g.host.uncache_children(d.content_key);
      }
    }
  }
}

// The engine's retention ranges win over the window classes: they name what it will reuse.
void KvCacheManager::set_release_retention(const Sequence& seq, GroupPools& g, int32_t entry) {
  const BlockId block = seq.tables[g.index].blocks[entry];
  const int64_t first_token = int64_t{entry} * options_.block_size;
  for (auto r = seq.retention.rbegin(); r != seq.retention.rend(); ++r) {
    if (first_token >= r->begin && first_token < r->end) {
      g.device.set_retention_unchecked(block, r->priority, r->duration_ms);
      return;
    }
  }
  if (g.windowed() && options_.enable_prefix_caching) {
    g.device.set_retention_unchecked(block, window_priority(seq, g, entry), 0);
  }
}

}  // namespace pagedkv
