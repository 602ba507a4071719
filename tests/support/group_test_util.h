// File: tests/support/group_test_util.h
//
// The layer groups of a model built as KvCacheManager builds them (make_group_cache()),
// without the coordinator, so that each kind's tests drive its class directly: plan and
// apply a step, offer computed blocks, match a prefix, end the step.
#ifndef PAGEDKV_TESTS_SUPPORT_GROUP_TEST_UTIL_H_
#define PAGEDKV_TESTS_SUPPORT_GROUP_TEST_UTIL_H_

#include <catch2/catch.hpp>

#include <memory>
#include <numeric>
#include <vector>

#include "cache/attention_group.h"
#include "cache/full_attention_group.h"
#include "cache/group_factory.h"
#include "cache/state_group.h"
#include "cache/windowed_group.h"

namespace pagedkv::testing {

class GroupFixture {
 public:
  // The groups of `options.layer_groups` (the first full one built first, as the anchor).
  explicit GroupFixture(const KvCacheManager::Options& options)
      : shared_(options, static_cast<int32_t>(options.layer_groups.size())) {
    const std::vector<LayerGroup>& specs = shared_.options.layer_groups;
    shared_.ledger = internal::StepLedger(specs);
    groups_.resize(specs.size());
    for (const bool anchor_pass : {true, false}) {
      for (size_t i = 0; i < specs.size(); ++i) {
        const bool full = specs[i].kind == AttentionKind::kFull;
        if (groups_[i] != nullptr || (anchor_pass && (!full || anchor_ != nullptr))) continue;
        absl::StatusOr<std::unique_ptr<internal::GroupCache>> group =
            internal::make_group_cache(specs, i, shared_, anchor_);
        REQUIRE(group.ok());
        groups_[i] = *std::move(group);
        if (anchor_pass) anchor_ = static_cast<internal::FullAttentionGroup*>(groups_[i].get());
      }
    }
  }

  template <typename Kind = internal::GroupCache>
  Kind& group(int32_t g) {
    return static_cast<Kind&>(*groups_[g]);
  }
  internal::SharedState& shared() { return shared_; }
  internal::StepLedger& ledger() { return shared_.ledger; }

  // A waiting sequence of `tokens`, as add_sequence() makes it.
  internal::Sequence& add(SeqId id, std::vector<TokenId> tokens) {
    auto s = std::make_unique<internal::Sequence>();
    s->id = id;
    s->prompt_len = static_cast<int32_t>(tokens.size());
    s->tokens = std::move(tokens);
    s->tables.resize(groups_.size());
    sequences_.push_back(std::move(s));
    return *sequences_.back();
  }

  // allocate_slots(seq, n) as the coordinator runs it: every group plans, then every group
  // applies; the tokens count as computed and full blocks are offered (full groups first).
  // Returns group `g`'s slots.
  std::vector<int64_t> step(internal::Sequence& seq, int32_t n, int32_t g = 0) {
    const int32_t bs = shared_.block_size;
    const int64_t total = int64_t{seq.num_computed} + n;
    const internal::StepRequest request{.num_new_tokens = n,
                                        .new_total = total,
                                        .slots_total = total,
                                        .total_blocks = (total + bs - 1) / bs,
                                        .write_block = seq.num_computed / bs,
                                        .partial = seq.num_computed % bs,
                                        .admission = seq.state == SequenceState::kWaiting};
    std::vector<internal::GroupPlan> plans(groups_.size());
    for (size_t i = 0; i < groups_.size(); ++i) {
      const absl::Status planned = groups_[i]->plan_step(seq, request, plans[i]);
      INFO(planned.ToString());
      REQUIRE(planned.ok());
    }
    std::vector<std::vector<int64_t>> slots(groups_.size(), std::vector<int64_t>(n));
    for (size_t i = 0; i < groups_.size(); ++i) groups_[i]->release_before_step(seq, plans[i]);
    for (size_t i = 0; i < groups_.size(); ++i)
      groups_[i]->apply_step(seq, request, plans[i], slots[i]);
    if (n > 0) shared_.ledger.mark_scheduled(seq, seq.num_computed);
    seq.num_computed = static_cast<int32_t>(total);
    if (seq.state != SequenceState::kRunning) ++shared_.num_running;
    seq.state = SequenceState::kRunning;
    offer(seq);
    return slots[g];
  }

  // The sequence's computed full blocks entered into every attention group's index.
  void offer(internal::Sequence& seq) {
    const int32_t full = seq.num_computed / shared_.block_size;
    if (seq.num_offered_blocks >= full) return;
    internal::hash_full_blocks(seq, full, shared_.block_size, shared_.options.hash_fn);
    for (const bool full_groups : {true, false}) {
      for (const auto& g : groups_) {
        if (g->kind() == AttentionKind::kState ||
            (g->kind() == AttentionKind::kFull) != full_groups) {
          continue;
        }
        static_cast<internal::AttentionGroup&>(*g).offer(seq, seq.num_offered_blocks, full);
      }
    }
    seq.num_offered_blocks = full;
  }

  // The sequence's hashes of its first `n` blocks, for a match.
  void hash(internal::Sequence& seq, int32_t n) {
    internal::hash_full_blocks(seq, n, shared_.block_size, shared_.options.hash_fn);
  }

  // Ends the step: its ops taken, held blocks released.
  StepOps end_step() {
    return shared_.ledger.take([this](internal::Hold side, int32_t g) -> internal::BlockPoolCore& {
      return side == internal::Hold::kDevice ? groups_[g]->device() : groups_[g]->host();
    });
  }

 private:
  internal::SharedState shared_;
  std::vector<std::unique_ptr<internal::GroupCache>> groups_;
  internal::FullAttentionGroup* anchor_ = nullptr;
  std::vector<std::unique_ptr<internal::Sequence>> sequences_;
};

// Hashes by a block's first token alone: blocks that start alike collide, and only the
// verification of a hit's tokens tells them apart.
inline BlockHash first_token_hash(const BlockHash*, std::span<const TokenId> tokens,
                                  std::span<const uint64_t>) {
  return {static_cast<uint64_t>(tokens[0]), 0};
}

inline std::vector<TokenId> tokens_from(TokenId first, int n) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_GROUP_TEST_UTIL_H_
