// Internal: what the attention kinds (full, sliding window, chunked local) share: a table of
// K/V blocks per sequence, entry i holding tokens [i * block_size, (i + 1) * block_size).
//
// A step: the blocks its slots need beyond the table, plus a copy of the shared partially
// filled block it writes (copy-on-write). A hit's claim: its device blocks shared, its
// host-tier blocks promoted into new device blocks and indexed. Offers: computed full
// blocks entered into the prefix index. The kinds differ in where a table starts
// (first_needed_block()), where hits end (begin_match(), longest_hit()) and whose contents
// a block is cached after (parent_key(): a full group's own chain, a windowed group's the
// anchor's).
#ifndef PAGEDKV_CACHE_ATTENTION_GROUP_H_
#define PAGEDKV_CACHE_ATTENTION_GROUP_H_

#include <cstdint>
#include <span>
#include <vector>

#include "cache/group_cache.h"

namespace pagedkv::internal {

class AttentionGroup : public GroupCache {
 public:
  using GroupCache::GroupCache;

  // The first table entry that a token at position `pos` attends to.
  int32_t first_needed_block(int64_t pos) const {
    return static_cast<int32_t>(first_attended(kind(), spec().window, pos) / shared_.block_size);
  }

  absl::Status plan_step(const Sequence& seq, const StepRequest& step,
                         GroupPlan& plan) const override;
  void apply_step(Sequence& seq, const StepRequest& step, const GroupPlan& plan,
                  std::span<int64_t> slots) override;
  absl::Status check_fork(const Sequence& parent, const char* caller) const override;
  void fork(Sequence& child, int32_t context_blocks) override;
  int32_t held_entries(const Sequence& seq) const override;
  void roll_back(Sequence& seq, int32_t num_accepted) override;
  // Hand-offs: the held entries of the computed tokens; an import fills those past the
  // local hit that the window at its end needs.
  KvHandoffGroup export_entries(const Sequence& seq) const override;
  KvHandoffGroup import_entries(const Sequence& seq) const override;
  bool serves_import(const Sequence& seq, int32_t p, int32_t verified) const override;
  int32_t entry_tokens(const Sequence& seq, int32_t entry) const override;
  absl::Status check_table(const Sequence& seq) const override;

  // --- claiming a hit of `hit` blocks (match_prefix) ---------------------------------------
  // Entries [first_needed_block(hit x block_size), hit) of `seq`'s table from the match:
  // the device hits shared now (every group's before any promotion, so that no promotion
  // evicts them), the rest kNoBlock for promote_host_hits().
  void share_hit(Sequence& seq, int32_t hit);
  // Promotes the match's host-tier hits among the claimed entries and indexes them;
  // returns how many.
  int32_t promote_host_hits(Sequence& seq, int32_t hit);
  // What share_hit() and promote_host_hits() would take for a hit of `hit` blocks
  // (peek_prefix()): the entries' device hits, the free ones among them, the promotions.
  void describe_hit(int32_t hit, PrefixHit::Group& out) const;
  // The first claimed entry below `bound` that a write of this step fills (its K/V is not
  // there yet), else `bound`.
  int32_t first_unwritten(const Sequence& seq, int32_t hit, int32_t bound) const;
  // Partial-block reuse: the cached block that continues the hit with the longest prefix
  // of `next` (*matched tokens), if one is there before this step's copies run and a free
  // block can take its copy; else kNoBlock. `unclaimed`: the hit is not claimed yet
  // (peek_prefix()): it follows the match's chain, and a free block must be left once the
  // claim takes `taken` more.
  BlockId partial_source(const Sequence& seq, int32_t hit, std::span<const TokenId> next,
                         int32_t* matched, bool unclaimed = false, int32_t taken = 0);
  // What reuse_partial() would take from the free blocks: partial_source()'s block if it
  // is free, and its copy.
  void describe_partial(PrefixHit::Group& out) const;
  // Copies the first `tokens` tokens of partial_source()'s block into a new block that
  // ends `seq`'s table (copy-on-write).
  void reuse_partial(Sequence& seq, int32_t tokens);

  // --- offers and releases ---------------------------------------------------------------
  // Enters `seq`'s computed full blocks [first, end) that it holds into the prefix index.
  void offer(Sequence& seq, int32_t first, int32_t end);
  // For a sequence scheduled in this step that gives up: the blocks this step's writes
  // would fill and it holds alone are uncached, as their K/V may never be written.
  void uncache_unwritten(const Sequence& seq);

 protected:
  // What a match found, entry by entry: a verified device hit, or a verified host-tier
  // hit (kNoBlock where none); scratch reused across calls.
  struct Hits {
    std::vector<BlockId> device;
    std::vector<BlockId> host;
    // Scratch of the claim: entries to promote and their host blocks.
    std::vector<int32_t> promote_at;
    std::vector<BlockId> promote_hits;
    BlockId partial_src = kNoBlock;  // the block partial-block reuse copies from

    void reserve(int32_t n) {
      const auto size = static_cast<size_t>(n);
      if (device.size() < size) {
        device.resize(size);
        host.resize(size);
      }
    }
  };

  // plan_step() once a windowed group knows which entries it releases first (`release_end`),
  // how many of them return to the free queue (`freed`) and how many past the table's end
  // it leaves unheld (`skipped`, GroupPlan).
  absl::Status plan_blocks(const Sequence& seq, const StepRequest& step, int32_t release_end,
                           int32_t freed, int32_t skipped, GroupPlan& plan) const;
  // Whether entry i of the match is a device hit (else a host-tier hit, to promote).
  virtual bool device_hit(int32_t i) const = 0;
  // The content key that `seq`'s entry `entry` (> 0) is cached after: the match's (before
  // the claim, `matched`) or the held blocks'.
  virtual uint64_t parent_key(const Sequence& seq, int32_t entry, bool matched) const = 0;
  // Indexes `seq`'s held entries [first, first + n) after parent_key(..., matched).
  virtual void index_run(Sequence& seq, int32_t first, int32_t n, bool matched) = 0;
  bool retains_on_release(const Sequence& seq) const override;
  void set_release_retention(const Sequence& seq, int32_t entry) override;
  // The retention `seq`'s own ranges give its entry (the last range covering its first
  // token); false when none covers it.
  bool set_range_retention(const Sequence& seq, int32_t entry);

  Hits hits_;

 private:
  void grow_table(Sequence& seq, const GroupPlan& plan, int32_t write_block, int32_t valid_tokens);
  void write_slots(const BlockId* blocks, int32_t offset, std::span<int64_t> slots) const;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_ATTENTION_GROUP_H_
