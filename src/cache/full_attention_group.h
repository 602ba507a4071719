// Internal: a full-attention layer group. A token attends to every earlier token, so a
// sequence holds every block of its context, and a prefix hit is the verified chain of
// cached blocks from block 0: each block after its parent's contents (content keys), so a
// hash collision is never shared. With a host tier the chain continues from the device
// into host-tier blocks, as far as free device blocks can take their promotions.
//
// The first full group of a model is its anchor: windowed and state groups verify their
// blocks after the anchor's chain (their own parents may be released), and drop what was
// cached after anchor contents that left both of its pools (dead_contents()).
#ifndef PAGEDKV_CACHE_FULL_ATTENTION_GROUP_H_
#define PAGEDKV_CACHE_FULL_ATTENTION_GROUP_H_

#include <cstdint>
#include <vector>

#include "cache/attention_group.h"

namespace pagedkv::internal {

class FullAttentionGroup final : public AttentionGroup {
 public:
  using AttentionGroup::AttentionGroup;

  int64_t blocks_to_run(int64_t prompt_tokens) const override;
  // The verified chain: device hits from block 0, then host-tier hits, as many as free
  // device blocks are left once the device hits are shared (each promotion needs one), up
  // to `max_blocks`. Records the hits and the content keys along the chain.
  int32_t begin_match(const Sequence& seq, int32_t max_blocks) override;
  int32_t longest_hit(const Sequence& seq, int32_t p) override;

  // As the anchor: the content key of the chain's block `entry` in the last match, and of
  // the block `seq` holds there.
  uint64_t matched_key(int32_t entry) const { return keys_[entry]; }
  uint64_t held_key(const Sequence& seq, int32_t entry) const {
    return device().content_key(table(seq).blocks[entry]);
  }
  // As the anchor: the contents whose last cached copy left both of its pools since the
  // last call, into `out` (cleared first).
  void take_dead_contents(std::vector<uint64_t>& out);

 protected:
  bool device_hit(int32_t i) const override { return i < device_run_; }
  uint64_t parent_key(const Sequence& seq, int32_t entry, bool matched) const override;
  void index_run(Sequence& seq, int32_t first, int32_t n, bool matched) override;

 private:
  std::vector<uint64_t> keys_;  // the content key of each entry's hit in the last match
  int32_t device_run_ = 0;      // the chain's device hits, then host hits up to chain_end_
  int32_t chain_end_ = 0;
  std::vector<BlockPoolCore::DeadContent> dead_;  // scratch of take_dead_contents()
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_FULL_ATTENTION_GROUP_H_
