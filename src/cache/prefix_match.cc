// KvCacheManager's prefix cache: hashing a sequence's full blocks, offering computed
// blocks to each group's index, matching a waiting sequence's prefix across the layer
// groups (and into the host tier), and the flush.
//
// A hit of p blocks needs, in every group, the blocks the token at p * block_size attends
// to: a full group its whole chain [0, p), a windowed group the entries from
// first_needed_block(p * block_size). Full groups verify each block after its parent's
// contents (content keys); a windowed group, whose parents may be released, verifies each
// block after the contents of the anchor's block before it (the first full group), so a
// collision is never shared in any group. The hit is found without changing anything,
// then claimed: device hits are shared, host-tier hits promoted.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/group_pools.h"
#include "cache/host_tier.h"
#include "cache/sequence.h"
#include "cache/step_ledger.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "pagedkv/kv_cache_manager.h"

namespace pagedkv {

using internal::block_tokens;
using internal::GroupMatch;
using internal::GroupPools;
using internal::GroupTable;
using internal::Sequence;
using internal::state_name;

void KvCacheManager::hash_full_blocks(Sequence& seq, int32_t num_full_blocks) {
  const int32_t bs = options_.block_size;
  PAGEDKV_DCHECK(static_cast<int64_t>(num_full_blocks) * bs <=
                 static_cast<int64_t>(seq.tokens.size()));
  for (auto i = static_cast<int32_t>(seq.block_hashes.size()); i < num_full_blocks; ++i) {
    const BlockHash* parent = i == 0 ? nullptr : &seq.block_hashes[i - 1];
    seq.block_hashes.push_back(options_.hash_fn(parent, block_tokens(seq, i, bs), seq.extra_keys));
  }
}

// --- finding a hit -----------------------------------------------------------------------

// The verified chain of a full group: device hits from block 0, then host-tier hits, as
// many as free device blocks are left once the device hits are shared (each promotion
// needs one), up to `max_blocks`. Records the hits and the content keys along the chain in
// g.match; returns its length.
int32_t KvCacheManager::match_chain(const Sequence& seq, GroupPools& g, int32_t max_blocks) {
  const int32_t bs = options_.block_size;
  GroupMatch& m = g.match;
  m.reset(max_blocks, /*windowed=*/false);
  uint64_t parent_key = 0;
  int32_t free_hits = 0;  // device hits in the free queue: sharing takes them out of it
  int32_t i = 0;
  for (; i < max_blocks; ++i) {
    const BlockId hit = g.device.indexed_block(seq.block_hashes[i]);
    if (hit == kNoBlock ||
        !g.device.holds_contents(hit, parent_key, block_tokens(seq, i, bs), seq.extra_keys)) {
      break;
    }
    m.device[i] = hit;
    m.keys[i] = parent_key = g.device.content_key(hit);
    free_hits += g.device.ref_count_unchecked(hit) == 0;
  }
  m.device_run = i;
  if (g.host_tier != nullptr) {
    const int32_t end = std::min(max_blocks, i + room(g, free_hits));
    for (; i < end; ++i) {
      const BlockId hit = internal::HostTier::find_hit(g.host, seq.block_hashes[i], parent_key,
                                                       block_tokens(seq, i, bs), seq.extra_keys);
      if (hit == kNoBlock) break;
      m.host[i] = hit;
      m.keys[i] = parent_key = g.host.content_key(hit);
    }
  }
  m.chain_end = i;
  return i;
}

// Whether entry i of a windowed group can be claimed: a device or host-tier block holding
// block i after the anchor's block i - 1. Looked up once per match.
bool KvCacheManager::window_entry(const Sequence& seq, GroupPools& g, int32_t i) {
  GroupMatch& m = g.match;
  if (m.state[i] != GroupMatch::kUnknown) return m.state[i] == GroupMatch::kFound;
  const uint64_t parent_key = i == 0 ? 0 : groups_[anchor_].match.keys[i - 1];
  const auto tokens = block_tokens(seq, i, options_.block_size);
  m.device[i] = g.device.indexed_block(seq.block_hashes[i]);
  if (m.device[i] != kNoBlock &&
      !g.device.holds_contents(m.device[i], parent_key, tokens, seq.extra_keys)) {
    m.device[i] = kNoBlock;
  }
  m.host[i] = m.device[i] == kNoBlock && g.host_tier != nullptr
                  ? internal::HostTier::find_hit(g.host, seq.block_hashes[i], parent_key, tokens,
                                                 seq.extra_keys)
                  : kNoBlock;
  const bool found = m.device[i] != kNoBlock || m.host[i] != kNoBlock;
  m.state[i] = found ? GroupMatch::kFound : GroupMatch::kMissing;
  return found;
}

// The longest hit of at most `p` blocks that windowed group `g` can serve: every entry the
// token at q * block_size attends to is there, with no more in the host tier than free
// device blocks to promote them into.
int32_t KvCacheManager::window_hit(const Sequence& seq, GroupPools& g, int32_t p) {
  const int32_t bs = options_.block_size;
  int32_t q = p;
  while (q > 0) {
    const int32_t first = g.first_needed_block(int64_t{q} * bs, bs);
    int32_t in_host = 0;
    int32_t free_hits = 0;
    int32_t missing = -1;
    for (int32_t i = q - 1; i >= first; --i) {  // the last entries are the likeliest misses
      if (!window_entry(seq, g, i)) {
        missing = i;
        break;
      }
      const BlockId d = g.match.device[i];
      in_host += d == kNoBlock;
      free_hits += d != kNoBlock && g.device.ref_count_unchecked(d) == 0;
    }
    if (missing < 0 && in_host <= room(g, free_hits)) return q;
    // A hit past a missing entry would need it; with too many promotions, try one less.
    q = missing >= 0 ? missing : q - 1;
  }
  return 0;
}

// The longest prefix, in blocks, that every group can serve; changes nothing.
// *chain_end: the full groups' part of it, before the windowed and state groups cut it.
int32_t KvCacheManager::find_hit(const Sequence& seq, int32_t max_blocks, int32_t* chain_end) {
  int32_t p = max_blocks;
  for (GroupPools& g : groups_) {
    if (g.full()) p = std::min(p, match_chain(seq, g, max_blocks));
  }
  *chain_end = p;
  if (!windowed_ && !has_state_) return p;
  for (GroupPools& g : groups_) {
    if (g.windowed()) g.match.reset(max_blocks, /*windowed=*/true);
  }
  // Each windowed or state group may cut the hit shorter, which changes what the others
  // need: stop when a whole round agrees.
  for (bool changed = true; changed && p > 0;) {
    changed = false;
    for (GroupPools& g : groups_) {
      if (g.full()) continue;
      const int32_t q = g.windowed() ? window_hit(seq, g, p) : checkpoint_hit(seq, g, p);
      changed |= q < p;
      p = q;
    }
  }
  return p;
}

// Free device blocks a group may fill with promotions once `free_hits` free blocks are
// shared: the watermark stays free while others run.
int32_t KvCacheManager::room(const GroupPools& g, int32_t free_hits) const {
  const int32_t reserve = num_running_ > 0 ? g.watermark_blocks : 0;
  return std::max(0, g.device.num_free_blocks() - free_hits - reserve);
}

// --- claiming it -------------------------------------------------------------------------

bool KvCacheManager::device_hit(const GroupPools& g, int32_t i) {
  return g.windowed() ? g.match.device[i] != kNoBlock : i < g.match.device_run;
}

// Entries [first, p) of `g`'s table from the match: its device hits are shared now (every
// group's before any promotion, so that no promotion evicts them), the rest stay kNoBlock
// for promote_host_hits().
void KvCacheManager::share_device_hits(Sequence& seq, GroupPools& g, int32_t first, int32_t p) {
  GroupTable& t = seq.tables[g.index];
  t.blocks.assign(p, kNoBlock);
  t.first_held = first;
  for (int32_t i = first; i < p; ++i) {
    if (!device_hit(g, i)) continue;
    t.blocks[i] = g.match.device[i];
    g.device.touch_unchecked(t.blocks[i]);
    if (g.host_tier != nullptr) g.host_tier->note_hit(t.blocks[i]);
  }
}

// Promotes the host-tier hits among entries [first_held, p) of `g` and indexes them: a full
// group's are the run after its device hits (one BlockStored), a windowed group's verify
// after the anchor's blocks.
void KvCacheManager::promote_host_hits(Sequence& seq, GroupPools& g, int32_t p) {
  GroupTable& t = seq.tables[g.index];
  GroupMatch& m = g.match;
  m.promote_at.clear();
  m.promote_hits.clear();
  for (int32_t i = t.first_held; i < p; ++i) {
    if (device_hit(g, i)) continue;
    m.promote_at.push_back(i);
    m.promote_hits.push_back(m.host[i]);
  }
  if (m.promote_at.empty()) return;
  scratch_blocks_.resize(m.promote_at.size());
  g.host_tier->promote(m.promote_hits, scratch_blocks_, internal::pools_of(g, *ledger_));
  for (size_t j = 0; j < m.promote_at.size(); ++j) t.blocks[m.promote_at[j]] = scratch_blocks_[j];
  const int32_t bs = options_.block_size;
  const auto count = std::ssize(m.promote_at);
  // Index runs of consecutive entries, one call each.
  for (size_t begin = 0; begin < m.promote_at.size();) {
    size_t end = begin + 1;
    while (end < m.promote_at.size() && m.promote_at[end] == m.promote_at[end - 1] + 1) ++end;
    const int32_t first = m.promote_at[begin];
    const auto n = end - begin;
    if (g.windowed()) {
      m.parent_keys.resize(n);
      for (size_t j = 0; j < n; ++j) {
        const int32_t i = first + static_cast<int32_t>(j);
        m.parent_keys[j] = i == 0 ? 0 : groups_[anchor_].match.keys[i - 1];
      }
    }
    g.device.cache_full_blocks_unchecked(
        std::span<const BlockId>(t.blocks).subspan(first, n),
        std::span<const BlockHash>(seq.block_hashes).subspan(first, n),
        first == 0 || g.windowed() ? kNoBlock : t.blocks[first - 1],
        first == 0 ? nullptr : &seq.block_hashes[first - 1],
        std::span<const TokenId>(seq.tokens).subspan(static_cast<size_t>(first) * bs, n * bs),
        seq.extra_keys,
        g.windowed() ? std::span<const uint64_t>(m.parent_keys) : std::span<const uint64_t>());
    begin = end;
  }
  if (g.index == anchor_) counters_.host_hit_tokens += count * bs;
}

// Continues a hit of `hit` blocks into the first tokens of a cached block: every group must
// hold a cached block after its block hit - 1 (a windowed group: after the anchor's) that
// starts with the prompt's next tokens, and a free block to copy it into. The shortest of
// those matches is reused: each group's block is copied (copy-on-write) into a new block
// that ends the table. Returns the tokens reused (0: none).
int32_t KvCacheManager::reuse_partial_block(Sequence& seq, int32_t hit) {
  const int32_t bs = options_.block_size;
  const auto len = static_cast<int32_t>(seq.tokens.size());
  // Never the last token, and fewer than a block (a whole block would be a full hit).
  int32_t k = std::min(bs - 1, len - 1 - hit * bs);
  if (k <= 0) return 0;
  const auto next = std::span<const TokenId>(seq.tokens).subspan(static_cast<size_t>(hit) * bs);
  auto parent_key = [&](const GroupPools& g) -> uint64_t {
    if (hit == 0) return 0;
    const GroupPools& parent = g.windowed() ? groups_[anchor_] : g;
    return parent.device.content_key(seq.tables[parent.index].blocks[hit - 1]);
  };
  for (GroupPools& g : groups_) {
    int32_t matched = 0;
    const BlockId src =
        g.device.longest_partial_match(parent_key(g), next.first(k), seq.extra_keys, &matched);
    // Its K/V must be there before this step's copies run, and a block must be free.
    const int32_t free_src = src != kNoBlock && g.device.ref_count_unchecked(src) == 0;
    if (src == kNoBlock || ledger_->written(g.index, src) || room(g, free_src) < 1) return 0;
    g.match.partial_src = src;
    k = std::min(k, matched);
  }
  for (GroupPools& g : groups_) {
    const BlockId src = g.match.partial_src;
    g.device.touch_unchecked(src);  // so that the allocation below cannot evict it
    BlockId dst = kNoBlock;
    allocate_device_blocks(g, {&dst, 1});
    ledger_->record(internal::kCopyOnWrite, {src, dst, k, g.index});
    ledger_->release(g.device, internal::Hold::kDevice, g.index, src);  // parked until the step
    ledger_->mark_filled_by_copy(g.index, dst);
    seq.tables[g.index].blocks.push_back(dst);
  }
  return k;
}

absl::StatusOr<int32_t> KvCacheManager::match_prefix(SeqId seq) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "match_prefix"));
  if (s->state != SequenceState::kWaiting || !s->tables[0].blocks.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "match_prefix(seq ", seq, "): sequence is ", state_name(s->state), " with ",
        s->tables[0].blocks.size(), " blocks; only a waiting sequence without blocks can match"));
  }
  const auto len = static_cast<int32_t>(s->tokens.size());
  counters_.prefix_query_tokens += len;
  if (!options_.enable_prefix_caching) return 0;

  // NOTE: never match the last token; its logits must be computed.
  const int32_t bs = options_.block_size;
  const int32_t max_blocks = (len - 1) / bs;
  hash_full_blocks(*s, max_blocks);
  int32_t chain_end = 0;  // what the full groups hold, before the windowed ones cut it
  const int32_t hit = find_hit(*s, max_blocks, &chain_end);
  for (GroupPools& g : groups_) {
    if (g.holds_state()) continue;
    const int32_t first = g.windowed() ? g.first_needed_block(int64_t{hit} * bs, bs) : 0;
    share_device_hits(*s, g, first, hit);
    group_counters_[g.index].hit_blocks += hit - first;
  }
  for (GroupPools& g : groups_) {
    if (g.host_tier != nullptr && !g.holds_state()) promote_host_hits(*s, g, hit);
  }
  if (has_state_ && hit > 0) restore_checkpoints(*s);
  const int32_t partial = options_.enable_partial_block_reuse ? reuse_partial_block(*s, hit) : 0;
  s->num_computed = hit * bs + partial;
  s->num_offered_blocks = hit;
  // A hit on a block another sequence fills in this step holds K/V not written yet, and
  // so does a partial block until the step's copies run; a restored state is there only
  // once they run too.
  int32_t first_unwritten = partial > 0 || (has_state_ && hit > 0) ? hit : hit + 1;
  for (const GroupPools& g : groups_) {
    if (g.holds_state()) continue;
    const GroupTable& t = s->tables[g.index];
    for (int32_t i = t.first_held; i < std::min(hit, first_unwritten); ++i) {
      if (ledger_->written(g.index, t.blocks[i])) {
        first_unwritten = i;
        break;
      }
    }
  }
  if (first_unwritten <= hit) ledger_->mark_scheduled(*s, first_unwritten * bs);
  counters_.prefix_hit_tokens += s->num_computed;
  counters_.partial_hit_tokens += partial;
  if (windowed_) {
    s->match_chain_end = chain_end;
    s->match_hit = hit;
  }
  if (has_state_) s->state_branch = chain_end > hit ? chain_end : 0;
  if (buries_) bury_dead_windows();
  return s->num_computed;
}

// --- offering and the flush ----------------------------------------------------------------

void KvCacheManager::offer_computed_blocks(Sequence& seq) {
  const int32_t bs = options_.block_size;
  const int32_t full = seq.num_computed / bs;
  // K/V computed before a reset_prefix_cache() is never shared after it, nor is anything
  // computed after it in the same sequence.
  if (!options_.enable_prefix_caching || seq.kv_before_reset) {
    seq.num_offered_blocks = full;
    return;
  }
  if (seq.num_offered_blocks >= full) return;
  hash_full_blocks(seq, full);
  const int32_t first = seq.num_offered_blocks;
  const auto count = static_cast<size_t>(full - first);
  const auto tokens =
      std::span<const TokenId>(seq.tokens).subspan(static_cast<size_t>(first) * bs, count * bs);
  const auto hashes = std::span<const BlockHash>(seq.block_hashes).subspan(first, count);
  const BlockHash* parent_hash = first == 0 ? nullptr : &seq.block_hashes[first - 1];
  // The full groups first: a recomputed anchor block may become a standby and take the
  // indexed copy's content key, and the windowed groups must cache after that key.
  for (GroupPools& g : groups_) {
    if (!g.full()) continue;
    const std::vector<BlockId>& blocks = seq.tables[g.index].blocks;
    g.device.cache_full_blocks_unchecked(std::span<const BlockId>(blocks).subspan(first, count),
                                         hashes, first == 0 ? kNoBlock : blocks[first - 1],
                                         parent_hash, tokens, seq.extra_keys);
    if (g.host_tier != nullptr) {
      g.host_tier->note_computed(std::span<const BlockId>(blocks).subspan(first, count), hashes);
    }
  }
  for (GroupPools& g : groups_) {
    if (!g.windowed()) continue;
    const std::vector<BlockId>& blocks = seq.tables[g.index].blocks;
    // Entries released since (a swapped sequence offers again when it comes back) are not
    // offered; the rest after the anchor's blocks (held: a full group releases nothing).
    const int32_t from = std::max(first, seq.tables[g.index].first_held);
    if (from >= full) continue;
    const auto n = static_cast<size_t>(full - from);
    const std::vector<BlockId>& anchor = seq.tables[anchor_].blocks;
    std::vector<uint64_t>& parent_keys = g.match.parent_keys;
    parent_keys.resize(n);
    for (size_t j = 0; j < n; ++j) {
      const int32_t i = from + static_cast<int32_t>(j);
      parent_keys[j] = i == 0 ? 0 : groups_[anchor_].device.content_key(anchor[i - 1]);
    }
    g.device.cache_full_blocks_unchecked(
        std::span<const BlockId>(blocks).subspan(from, n), hashes.subspan(from - first, n),
        kNoBlock, from == 0 ? nullptr : &seq.block_hashes[from - 1],
        tokens.subspan(static_cast<size_t>(from - first) * bs, n * bs), seq.extra_keys,
        parent_keys);
    if (g.host_tier != nullptr) {
      g.host_tier->note_computed(std::span<const BlockId>(blocks).subspan(from, n),
                                 hashes.subspan(from - first, n));
    }
  }
  seq.num_offered_blocks = full;
}

void KvCacheManager::reset_prefix_cache() {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  bool first = true;
  for (GroupPools& g : groups_) {
    g.device.reset_prefix_cache(/*emit_event=*/first);  // one AllBlocksCleared for all
    g.host.reset_prefix_cache(/*emit_event=*/false);
    first = false;
  }
  for (auto& [id, s] : sequences_) {
    if (s->num_computed > 0 || !s->tables[0].blocks.empty()) s->kv_before_reset = true;
  }
}

}  // namespace pagedkv
