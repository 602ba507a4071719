// CacheCoordinator's prefix cache across the groups: a waiting sequence's hit (the longest
// prefix every group can serve, found without changing anything, then claimed), computed
// blocks offered to each group's index, checkpoints, and the flush.
#include <algorithm>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/cache_coordinator.h"
#include "common/status_macros.h"

namespace pagedkv::internal {

// A waiting sequence without blocks, which match_prefix() and peek_prefix() take.
absl::StatusOr<Sequence*> CacheCoordinator::matchable(SeqId seq, const char* caller) const {
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, caller));
  if (s->state != SequenceState::kWaiting || !s->tables[0].blocks.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        caller, "(seq ", seq, "): sequence is ", state_name(s->state), " with ",
        s->tables[0].blocks.size(), " blocks; only a waiting sequence without blocks can match"));
  }
  return s;
}

absl::StatusOr<int32_t> CacheCoordinator::match_prefix(SeqId seq) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, matchable(seq, "match_prefix"));
  const auto len = static_cast<int32_t>(s->tokens.size());
  shared_.counters.prefix_query_tokens += len;
  if (!shared_.options.enable_prefix_caching) return 0;

  // NOTE: never match the last token; its logits must be computed.
  const int32_t bs = shared_.block_size;
  const int32_t max_blocks = (len - 1) / bs;
  hash_full_blocks(*s, max_blocks, bs, shared_.options.hash_fn);
  int32_t chain_end = 0;  // what the full groups hold, before the others cut it
  const int32_t hit = find_hit(*s, max_blocks, &chain_end);
  // Every group's device hits are shared before any promotion, so that none evicts them.
  for (AttentionGroup* g : attention_) g->share_hit(*s, hit);
  for (AttentionGroup* g : attention_) {
    const int32_t promoted = g->promote_host_hits(*s, hit);
    if (g == anchor_) shared_.counters.host_hit_tokens += int64_t{promoted} * bs;
  }
  if (hit > 0) {
    for (StateGroup* g : state_) g->restore_checkpoint(*s);
  }
  const int32_t partial =
      shared_.options.enable_partial_block_reuse ? reuse_partial_block(*s, hit) : 0;
  s->num_computed = hit * bs + partial;
  s->num_offered_blocks = hit;
  // A hit on a block another sequence fills in this step holds K/V not written yet, and
  // so does a partial block until the step's copies run; a restored state is there only
  // once they run too.
  int32_t first_unwritten = partial > 0 || (!state_.empty() && hit > 0) ? hit : hit + 1;
  for (const AttentionGroup* g : attention_) {
    first_unwritten = g->first_unwritten(*s, hit, first_unwritten);
  }
  if (first_unwritten <= hit) shared_.ledger.mark_scheduled(*s, first_unwritten * bs);
  shared_.counters.prefix_hit_tokens += s->num_computed;
  shared_.counters.partial_hit_tokens += partial;
  if (windowed_) {
    s->match_chain_end = chain_end;
    s->match_hit = hit;
  }
  if (!state_.empty()) s->state_branch = chain_end > hit ? chain_end : 0;
  if (buries_) bury_dead_contents();
  return s->num_computed;
}

// The hit match_prefix() would claim, described group by group; claims nothing. The same
// search as match_prefix() (find_hit(), find_partial()), which changes only the groups'
// scratch and the sequence's cached block hashes.
absl::StatusOr<PrefixHit> CacheCoordinator::peek_prefix(SeqId seq) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, matchable(seq, "peek_prefix"));
  PrefixHit out;
  out.groups.resize(groups_.size());
  if (!shared_.options.enable_prefix_caching) return out;
  const int32_t bs = shared_.block_size;
  const int32_t max_blocks = (static_cast<int32_t>(s->tokens.size()) - 1) / bs;
  hash_full_blocks(*s, max_blocks, bs, shared_.options.hash_fn);
  int32_t chain_end = 0;
  const int32_t hit = find_hit(*s, max_blocks, &chain_end);
  for (AttentionGroup* g : attention_) g->describe_hit(hit, out.groups[g->index()]);
  if (hit > 0) {
    for (StateGroup* g : state_) g->describe_hit(out.groups[g->index()]);
  }
  if (shared_.options.enable_partial_block_reuse) {
    std::vector<int32_t> taken(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) taken[g] = out.groups[g].blocks_taken();
    out.num_partial_tokens = find_partial(*s, hit, taken);
    if (out.num_partial_tokens > 0) {
      for (AttentionGroup* g : attention_) g->describe_partial(out.groups[g->index()]);
    }
  }
  out.num_tokens = hit * bs + out.num_partial_tokens;
  return out;
}

// The longest prefix, in blocks, that every group can serve; changes nothing.
// *chain_end: the full groups' part of it, before the others cut it.
int32_t CacheCoordinator::find_hit(const Sequence& seq, int32_t max_blocks, int32_t* chain_end) {
  int32_t p = max_blocks;
  for (const auto& g : groups_) p = std::min(p, g->begin_match(seq, max_blocks));
  *chain_end = p;
  // Each follower may cut the hit shorter, which changes what the others need: stop when
  // a whole round agrees.
  for (bool changed = true; changed && p > 0;) {
    changed = false;
    for (GroupCache* g : followers_) {
      const int32_t q = g->longest_hit(seq, p);
      changed |= q < p;
      p = q;
    }
  }
  return p;
}

// How far a hit of `hit` blocks continues into the first tokens of a cached block: every
// group must hold a cached block after its block hit - 1 (a windowed group: after the
// anchor's) that starts with the prompt's next tokens, and a free block to copy it into.
// `taken` (peek_prefix(), before the claim): group g's free blocks the claim takes; empty
// once the hit is claimed. Returns the shortest of those matches (0: none); changes
// nothing but the groups' scratch (partial_source()). Never with state groups.
int32_t CacheCoordinator::find_partial(const Sequence& seq, int32_t hit,
                                       std::span<const int32_t> taken) {
  const int32_t bs = shared_.block_size;
  const auto len = static_cast<int32_t>(seq.tokens.size());
  // Never the last token, and fewer than a block (a whole block would be a full hit).
  int32_t k = std::min(bs - 1, len - 1 - hit * bs);
  if (k <= 0) return 0;
  const auto next = std::span<const TokenId>(seq.tokens).subspan(static_cast<size_t>(hit) * bs);
  for (AttentionGroup* g : attention_) {
    int32_t matched = 0;
    const bool unclaimed = !taken.empty();
    const int32_t more = unclaimed ? taken[g->index()] : 0;
    if (g->partial_source(seq, hit, next.first(k), &matched, unclaimed, more) == kNoBlock) {
      return 0;
    }
    k = std::min(k, matched);
  }
  return k;
}

// Reuses find_partial()'s tokens: each group's block is copied (copy-on-write) into a new
// block that ends the table. Returns the tokens reused (0: none).
int32_t CacheCoordinator::reuse_partial_block(Sequence& seq, int32_t hit) {
  const int32_t k = find_partial(seq, hit, {});
  if (k == 0) return 0;
  for (AttentionGroup* g : attention_) g->reuse_partial(seq, k);
  return k;
}

// --- offers, checkpoints and the flush -------------------------------------------------------

void CacheCoordinator::offer_computed_blocks(Sequence& seq) {
  const int32_t bs = shared_.block_size;
  const int32_t full = verified_tokens(seq) / bs;  // drafts are never offered
  // K/V computed before a reset_prefix_cache() is never shared after it, nor is anything
  // computed after it in the same sequence.
  if (!shared_.options.enable_prefix_caching || seq.kv_before_reset) {
    seq.num_offered_blocks = full;
    return;
  }
  if (seq.num_offered_blocks >= full) return;
  hash_full_blocks(seq, full, bs, shared_.options.hash_fn);
  // The full groups first: a recomputed anchor block may become a standby and take the
  // indexed copy's content key, and the windowed groups must cache after that key.
  for (AttentionGroup* g : offer_order_) g->offer(seq, seq.num_offered_blocks, full);
  seq.num_offered_blocks = full;
}

// Records the saves of the checkpoint positions that allocate_slots() just computed past:
// blocks (old_computed / b, verified tokens / b] (none where drafts are).
void CacheCoordinator::save_checkpoints(Sequence& seq, int32_t old_computed) {
  if (!shared_.options.enable_prefix_caching || seq.kv_before_reset) return;
  const int32_t bs = shared_.block_size;
  for (int32_t b = old_computed / bs + 1; b <= verified_tokens(seq) / bs; ++b) {
    if (!StateGroup::checkpoint_due(seq, b, shared_.options)) continue;
    for (StateGroup* g : state_) g->save_checkpoint(seq, b);
  }
}

// Drops the windowed blocks and checkpoints cached after anchor contents that are gone
// from both of the anchor's pools: no hit can verify them again, and they would outlive
// their anchors.
void CacheCoordinator::bury_dead_contents() {
  anchor_->take_dead_contents(dead_);
  for (const uint64_t key : dead_) {
    for (GroupCache* g : followers_) g->forget_children(key);
  }
}

void CacheCoordinator::reset_prefix_cache() {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  bool first = true;
  for (const auto& g : groups_) {
    // One AllBlocksCleared for all; a shared pool is reset once.
    if (first || !shared_.options.shared_block_pool) {
      g->device().reset_prefix_cache(/*emit_event=*/first);
    }
    g->host().reset_prefix_cache(/*emit_event=*/false);
    first = false;
  }
  for (auto& [id, s] : sequences_) {
    if (s->num_computed > 0 || !s->tables[0].blocks.empty()) s->kv_before_reset = true;
  }
}

}  // namespace pagedkv::internal
