// Internal: a windowed layer group (sliding window, chunked local; layer_group.h). A token
// attends only to the tokens of its window, so a sequence holds the blocks from the window
// of its next token on: allocate_slots() releases the entries wholly before it (hashed
// ones stay cached, in the eviction class of the hit points whose windows they complete:
// docs/allocator.md, "Eviction in windowed groups").
//
// A hit of p blocks needs the entries the token at p x block_size attends to, each a
// device or host-tier block verified after the anchor's block before it (its own parent
// may be released), so a collision is never shared; the longest such p is found scanning
// back from the anchor's chain (longest_hit()).
#ifndef PAGEDKV_CACHE_WINDOWED_GROUP_H_
#define PAGEDKV_CACHE_WINDOWED_GROUP_H_

#include <cstdint>
#include <vector>

#include "cache/attention_group.h"
#include "cache/full_attention_group.h"

namespace pagedkv::internal {

class WindowedGroup final : public AttentionGroup {
 public:
  // `anchor`: the model's first full-attention group, or null without prefix caching.
  WindowedGroup(GroupParts parts, SharedState& shared, const FullAttentionGroup* anchor)
      : AttentionGroup(std::move(parts), shared), anchor_(anchor) {}

  int64_t blocks_to_run(int64_t prompt_tokens) const override;
  int32_t begin_match(const Sequence& seq, int32_t max_blocks) override;
  int32_t longest_hit(const Sequence& seq, int32_t p) override;
  absl::Status plan_step(const Sequence& seq, const StepRequest& step,
                         GroupPlan& plan) const override;
  void release_before_step(Sequence& seq, const GroupPlan& plan) override;
  // The entries behind the window at the import's end: no transfer fills them.
  void release_unimported(Sequence& seq) override;

 protected:
  bool device_hit(int32_t i) const override { return hits_.device[i] != kNoBlock; }
  uint64_t parent_key(const Sequence& seq, int32_t entry, bool matched) const override;
  void index_run(Sequence& seq, int32_t first, int32_t n, bool matched) override;
  bool retains_on_release(const Sequence& seq) const override;
  void set_release_retention(const Sequence& seq, int32_t entry) override;

 private:
  enum class Lookup : uint8_t { kUnknown, kFound, kMissing };

  // Whether entry i can be claimed: a device or host-tier block holding block i after the
  // anchor's block i - 1. Looked up once per match.
  bool claimable(const Sequence& seq, int32_t i);
  // The entries [first_held, end) that allocate_slots() may release: those before the
  // window of the token at `needed_from`, up to the first one this step writes (a block
  // whose K/V is not written yet stays until a later call). `freed`: how many of them the
  // release returns to the free queue.
  int32_t release_end(const Sequence& seq, int64_t needed_from, int32_t& freed) const;
  void release_behind_window(Sequence& seq, int32_t end);
  // Whether released blocks keep an eviction class (Options::window_eviction_classes).
  bool has_classes() const;
  // The retention priority of entry `entry` as `seq` releases it (see the file comment).
  int32_t window_priority(const Sequence& seq, int32_t entry) const;

  const FullAttentionGroup* anchor_;
  std::vector<Lookup> looked_up_;      // per entry of the match
  std::vector<uint64_t> parent_keys_;  // scratch of index_run()
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_WINDOWED_GROUP_H_
