// Internal: a state group (AttentionKind::kState: Mamba2, Gated DeltaNet layers;
// docs/allocator.md, "State groups"). Its pool holds state slots, not token blocks: a
// sequence's table is its one slot, from its admission on, updated in place every token.
//
// A checkpoint is a slot cached in the group's pool under the hash of the block it ends:
// the state after tokens [0, b x block_size), verified after the anchor's block b - 2 and
// the tokens of block b - 1, as a windowed group's block is, so a collision is never
// restored. Positions saved (checkpoint_due()): the end of the prompt's last full block
// (where a conversation's next turn resumes), the branch point of the sequence's match
// (where the cached chain stopped matching its prompt: a prefix two prompts share, such as
// a system prompt), and every Options::state_checkpoint_interval_blocks blocks. Eviction:
// the free queue's LRU order (a hit moves a checkpoint to the back). Retention classes by
// hits and length were measured and lost to LRU (docs/results.md, "State-space layers").
//
// A prefix hit of p blocks needs a checkpoint at exactly p; its restore gives the sequence
// a slot filled by a copy of it. With the host tier, an evicted checkpoint is demoted like
// a K/V block. A hit on a checkpoint the tier holds restores it straight from the host
// slot into the sequence's new slot (a promote copy) and keeps it in the tier: the step's
// copy_state runs before its promotions, so a promotion into a device checkpoint could not
// be restored from in the same step, and one copy of megabytes per layer over the host link
// beats two plus a second device slot.
#ifndef PAGEDKV_CACHE_STATE_GROUP_H_
#define PAGEDKV_CACHE_STATE_GROUP_H_

#include <cstdint>

#include "cache/full_attention_group.h"
#include "cache/group_cache.h"

namespace pagedkv::internal {

class StateGroup final : public GroupCache {
 public:
  // `anchor`: the model's first full-attention group, or null without prefix caching.
  StateGroup(GroupParts parts, SharedState& shared, const FullAttentionGroup* anchor)
      : GroupCache(std::move(parts), shared), anchor_(anchor) {}

  int64_t blocks_to_run(int64_t prompt_tokens) const override;
  int32_t begin_match(const Sequence& seq, int32_t max_blocks) override;
  // A checkpoint at exactly that point, verified after the anchor's chain, on the device
  // (saved before this step) or else in the host tier (a demotion of this step runs
  // before the restore), with a free slot to restore it into.
  int32_t longest_hit(const Sequence& seq, int32_t p) override;
  absl::Status plan_step(const Sequence& seq, const StepRequest& step,
                         GroupPlan& plan) const override;
  void apply_step(Sequence& seq, const StepRequest& step, const GroupPlan& plan,
                  std::span<int64_t> slots) override;
  // A parent holding a slot must have its state computed (not scheduled in this step),
  // and the group a free slot for the child.
  absl::Status check_fork(const Sequence& parent, const char* caller) const override;
  // The child takes a slot of its own, filled by a copy of the parent's. Until the step's
  // copies run it counts as scheduled: a swap-out, which runs first, would read it empty.
  void fork(Sequence& child, int32_t context_blocks) override;
  int32_t held_entries(const Sequence& seq) const override;
  int32_t entry_tokens(const Sequence& seq, int32_t entry) const override;
  // The slot of the last accepted draft's state becomes the sequence's (its own slot when
  // none is accepted); the other slots are released.
  void roll_back(Sequence& seq, int32_t num_accepted) override;
  // Hand-offs: the slot, holding the state after the last token. Only a whole import
  // brings it: a partial one serves no token (the slot's restore, if any, was overwritten).
  KvHandoffGroup export_entries(const Sequence& seq) const override;
  KvHandoffGroup import_entries(const Sequence& seq) const override;
  bool serves_import(const Sequence& seq, int32_t p, int32_t verified) const override;
  // One slot from its admission on (a waiting sequence's claim restores one), its host
  // copy while swapped, a slot per draft; never a cached checkpoint.
  absl::Status check_table(const Sequence& seq) const override;

  // Gives `seq` a slot and restores into it the checkpoint longest_hit() found: a device
  // checkpoint by StepOps::copy_state, a host-tier one by StepOps::promote (it stays in the
  // tier). The checkpoint returns to its pool's free queue tail after the step.
  void restore_checkpoint(Sequence& seq);
  // What restore_checkpoint() would take, for a hit longest_hit() found (peek_prefix()).
  void describe_hit(PrefixHit::Group& out) const;
  // Whether a checkpoint is saved where `seq`'s first `blocks` blocks end (the positions
  // of the file comment).
  static bool checkpoint_due(const Sequence& seq, int32_t blocks,
                             const KvCacheManager::Options& options);
  // Saves `seq`'s state after `blocks` blocks into a new checkpoint slot (a
  // StepOps::save_state), unless the group keeps that checkpoint already or only the
  // watermark's slots are free: checkpoints never take the headroom.
  void save_checkpoint(Sequence& seq, int32_t blocks);

 private:
  // The checkpoint's parent contents: the anchor's block before the one it ends.
  uint64_t checkpoint_parent(const Sequence& seq, int32_t blocks, bool matched) const;

  const FullAttentionGroup* anchor_;
  BlockId hit_ = kNoBlock;    // the checkpoint the last longest_hit() found
  bool hit_on_host_ = false;  // a device slot, or a host-tier slot when set
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_STATE_GROUP_H_
