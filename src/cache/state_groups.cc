// KvCacheManager's state groups (AttentionKind::kState: Mamba2, Gated DeltaNet layers):
// one state slot per started sequence, and checkpoints of it (docs/allocator.md, "State
// groups").
//
// A checkpoint is a slot cached in the group's pool under the hash of the block it ends:
// the state after tokens [0, b * block_size), verified after the anchor's block b - 2 and
// the tokens of block b - 1, as a windowed group's block is, so a collision is never
// restored. Positions saved (admission): the end of the prompt's last full block (where
// a conversation's next turn resumes), the branch point of the sequence's match (where
// the cached chain stopped matching its prompt: a prefix two prompts share, such as a
// system prompt), and every Options::state_checkpoint_interval_blocks blocks. Eviction:
// the free queue's LRU order (a hit moves a checkpoint to the back). Retention classes by
// hits and length were measured and lost to LRU (docs/results.md, "State-space layers").
//
// With the host tier, an evicted checkpoint is demoted like a K/V block (HostTier, from
// allocate_device_blocks()). A hit on a checkpoint the tier holds restores it straight
// from the host slot into the sequence's new slot (a promote copy) and keeps it in the
// tier: the step's copy_state runs before its promotions, so a promotion into a device
// checkpoint could not be restored from in the same step, and one copy of megabytes per
// layer over the host link beats two plus a second device slot.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/group_pools.h"
#include "cache/sequence.h"
#include "cache/step_ledger.h"
#include "common/status_macros.h"
#include "pagedkv/kv_cache_manager.h"

namespace pagedkv {

using internal::block_tokens;
using internal::GroupPools;
using internal::Hold;
using internal::Sequence;

// Records the saves of the checkpoint positions that allocate_slots() just computed past:
// blocks (old_computed / b, num_computed / b].
void KvCacheManager::save_checkpoints(Sequence& seq, int32_t old_computed) {
  if (!options_.enable_prefix_caching || seq.kv_before_reset) return;
  const int32_t bs = options_.block_size;
  const int32_t prompt_end = seq.prompt_len / bs;
  const int32_t every = options_.state_checkpoint_interval_blocks;
  for (int32_t b = old_computed / bs + 1; b <= seq.num_computed / bs; ++b) {
    if (b != prompt_end && b != seq.state_branch && (every == 0 || b % every != 0)) continue;
    for (GroupPools& g : groups_) {
      if (g.holds_state()) save_checkpoint(seq, g, b);
    }
  }
}

// Saves `seq`'s state after `blocks` blocks into a new checkpoint slot of `g`, unless the
// group keeps that checkpoint already or only the watermark's slots are free:
// checkpoints never take the headroom.
void KvCacheManager::save_checkpoint(Sequence& seq, GroupPools& g, int32_t blocks) {
  const int32_t bs = options_.block_size;
  hash_full_blocks(seq, blocks);
  const BlockHash& hash = seq.block_hashes[blocks - 1];
  const GroupPools& anchor = groups_[anchor_];
  const uint64_t parent_key =
      blocks == 1 ? 0 : anchor.device.content_key(seq.tables[anchor_].blocks[blocks - 2]);
  const auto tokens = block_tokens(seq, blocks - 1, bs);
  const BlockId kept = g.device.indexed_block(hash);
  if (kept != kNoBlock && g.device.holds_contents(kept, parent_key, tokens, seq.extra_keys)) return;
  if (g.device.num_free_blocks() <= g.watermark_blocks) return;
  BlockId checkpoint = kNoBlock;
  allocate_device_blocks(g, {&checkpoint, 1});
  const int32_t cached = g.device.cache_full_blocks_unchecked(
      {&checkpoint, 1}, {&hash, 1}, kNoBlock, blocks == 1 ? nullptr : &seq.block_hashes[blocks - 2],
      tokens, seq.extra_keys, {&parent_key, 1});
  // A copy kept after other parent contents is replaced; a collision or K/V from before a
  // reset_prefix_cache() is not indexed, so not saved.
  if (cached == 0) {
    g.device.free_unchecked({&checkpoint, 1});
    return;
  }
  // HostAdmission::kReused: a new checkpoint has no evidence of reuse, unless a ghost.
  if (g.host_tier != nullptr) g.host_tier->note_computed({&checkpoint, 1}, {&hash, 1});
  ledger_->record(StateSave{.seq = seq.id,
                            .position = blocks * bs,
                            .src = seq.tables[g.index].blocks[0],
                            .dst = checkpoint,
                            .group = g.index});
  ledger_->mark_written(g.index, checkpoint);  // restorable from the next step on
  ledger_->release(g.device, Hold::kDevice, g.index, checkpoint);  // parked until the step ends
  ++group_counters_[g.index].checkpoints_saved;
}

// The longest hit of at most `p` blocks that state group `g` can serve: a checkpoint at
// exactly that point, verified after the anchor's chain, on the device (saved before this
// step) or else in the host tier (a demotion of this step runs before the restore), with
// a free slot to restore it into. Records it in g.match.
int32_t KvCacheManager::checkpoint_hit(const Sequence& seq, GroupPools& g, int32_t p) {
  const int32_t bs = options_.block_size;
  const internal::GroupMatch& chain = groups_[anchor_].match;
  for (int32_t q = p; q > 0; --q) {
    const BlockHash& hash = seq.block_hashes[q - 1];
    const uint64_t parent_key = q == 1 ? 0 : chain.keys[q - 2];
    const auto tokens = block_tokens(seq, q - 1, bs);
    const BlockId c = g.device.indexed_block(hash);
    if (c != kNoBlock && !ledger_->written(g.index, c) &&
        g.device.holds_contents(c, parent_key, tokens, seq.extra_keys)) {
      if (room(g, g.device.ref_count_unchecked(c) == 0 ? 1 : 0) < 1) return 0;
      g.match.checkpoint = c;
      g.match.checkpoint_on_host = false;
      return q;
    }
    if (g.host_tier == nullptr) continue;
    const BlockId h =
        internal::HostTier::find_hit(g.host, hash, parent_key, tokens, seq.extra_keys);
    if (h == kNoBlock) continue;
    if (room(g, 0) < 1) return 0;
    g.match.checkpoint = h;
    g.match.checkpoint_on_host = true;
    return q;
  }
  return 0;
}

// Gives `seq` a slot in every state group and restores the checkpoint of its hit into it:
// from a device checkpoint StepOps::copy_state, from a host-tier one StepOps::promote
// (the checkpoint stays in the tier). The checkpoint returns to its pool's free queue
// tail after the step.
void KvCacheManager::restore_checkpoints(Sequence& seq) {
  for (GroupPools& g : groups_) {
    if (!g.holds_state()) continue;
    const BlockId checkpoint = g.match.checkpoint;
    const bool on_host = g.match.checkpoint_on_host;
    BlockPool& pool = on_host ? g.host : g.device;
    // So that the allocation below cannot evict it (nor its demotions, on the host).
    pool.touch_unchecked(checkpoint);
    BlockId slot = kNoBlock;
    allocate_device_blocks(g, {&slot, 1});
    const BlockCopy copy{checkpoint, slot, options_.block_size, g.index};
    ledger_->record(on_host ? internal::kPromote : internal::kCopyState, copy);
    ledger_->mark_filled_by_copy(g.index, slot);
    // Parked until the step.
    ledger_->release(pool, on_host ? Hold::kHost : Hold::kDevice, g.index, checkpoint);
    if (g.host_tier != nullptr && on_host) g.host_tier->note_restored();
    if (g.host_tier != nullptr && !on_host) g.host_tier->note_hit(checkpoint);
    seq.tables[g.index].blocks.assign(1, slot);
    ++group_counters_[g.index].checkpoints_restored;
  }
}

// Validation of fork() for state groups: a parent holding slots must have its state
// computed (not scheduled in this step), and every state group a free slot for the child.
absl::Status KvCacheManager::check_state_slots(const Sequence& seq, const char* caller) const {
  for (const GroupPools& g : groups_) {
    if (!g.holds_state() || seq.tables[g.index].blocks.empty()) continue;
    if (ledger_->scheduled(seq)) {
      return absl::FailedPreconditionError(
          absl::StrCat(caller, "(parent ", seq.id, "): its state in group ", g.index,
                       " is not computed before this step's ops run; fork after the step"));
    }
    if (g.device.num_free_blocks() < 1) {
      return absl::ResourceExhaustedError(absl::StrCat(caller, "(parent ", seq.id,
                                                       "): no free state slot in group ", g.index,
                                                       " of ", g.spec.num_blocks));
    }
  }
  return absl::OkStatus();
}

// The child of a fork (a copy of its parent) takes a slot of its own in every state group
// where the parent holds one, filled by a copy of the parent's. Until the step's copies
// run it counts as scheduled: a swap-out, which runs first, would read the slot empty.
void KvCacheManager::fork_state(Sequence& child) {
  for (GroupPools& g : groups_) {
    std::vector<BlockId>& blocks = child.tables[g.index].blocks;
    if (!g.holds_state() || blocks.empty()) continue;
    const BlockId parent_slot = blocks[0];
    allocate_device_blocks(g, {blocks.data(), 1});
    ledger_->record(internal::kCopyState, {parent_slot, blocks[0], options_.block_size, g.index});
    ledger_->mark_filled_by_copy(g.index, blocks[0]);
    ledger_->mark_scheduled(child, child.num_computed);
  }
}

absl::Status KvCacheManager::write_state_slots(std::span<const SeqId> seqs, int32_t group,
                                               std::span<int32_t> out) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(group, "write_state_slots"));
  if (!groups_[group].holds_state() || out.size() < seqs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("write_state_slots: layer group ", group, " is ",
                                                   attention_kind_name(groups_[group].spec.kind),
                                                   " (need a state group), out has ", out.size(),
                                                   " entries for ", seqs.size(), " sequences"));
  }
  PAGEDKV_RETURN_IF_ERROR(resolve_running(seqs, "write_state_slots"));
  for (size_t i = 0; i < batch_.size(); ++i) out[i] = batch_[i]->tables[group].blocks[0];
  return absl::OkStatus();
}

}  // namespace pagedkv
