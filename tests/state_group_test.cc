// Tests of StateGroup, driven directly (support/group_test_util.h) beside the full group
// that anchors it: one state slot per started sequence, where checkpoints are due, a
// checkpoint hit at exactly its position and its restore, and the refusals of a fork. A
// fresh pool hands out its clean slots in id order.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "support/group_test_util.h"

namespace pagedkv {
namespace {

using internal::FullAttentionGroup;
using internal::GroupPlan;
using internal::Sequence;
using internal::StateGroup;
using internal::StepRequest;
using testing::first_token_hash;
using testing::GroupFixture;
using testing::tokens_from;

constexpr int32_t kFull = 0;
constexpr int32_t kState = 1;

// A full group of 32 blocks of 4 tokens and a state group of `slots` slots.
KvCacheManager::Options with_state(int32_t slots, KvCacheManager::Options options = {}) {
  options.block_size = 4;
  options.layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 32},
                          {.kind = AttentionKind::kState, .num_blocks = slots}};
  return options;
}

TEST_CASE("a sequence takes one state slot at admission, and none is left to refuse",
          "[state_group]") {
  GroupFixture f(with_state(2));
  StateGroup& g = f.group<StateGroup>(kState);
  CHECK(g.blocks_to_run(1) == 1);
  CHECK(g.blocks_to_run(1 << 20) == 1);
  Sequence& a = f.add(1, tokens_from(100, 10));
  // No slots in a state group: its state is updated in place.
  CHECK(f.step(a, 10, kState) == std::vector<int64_t>(10, -1));
  CHECK(a.tables[kState].blocks == std::vector<BlockId>{0});
  a.tokens.push_back(7);
  f.step(a, 1);
  CHECK(a.tables[kState].blocks == std::vector<BlockId>{0});  // the same slot
  Sequence& b = f.add(2, tokens_from(200, 4));
  f.step(b, 4);  // slot 1, the last
  GroupPlan plan;
  const Sequence& c = f.add(3, tokens_from(300, 4));
  const absl::Status none =
      g.plan_step(c, StepRequest{.num_new_tokens = 4, .new_total = 4, .admission = true}, plan);
  CHECK(absl::IsResourceExhausted(none));
  CHECK(std::string(none.message()) ==
        "allocate_slots(seq 3): need a state slot in group 1, 0 "
        "free of 2");
}

TEST_CASE("checkpoints are due at the prompt's end, the branch point and every interval",
          "[state_group]") {
  Sequence s;
  s.prompt_len = 10;  // 2 full blocks of 4
  s.state_branch = 5;
  const KvCacheManager::Options options{.block_size = 4, .state_checkpoint_interval_blocks = 3};
  std::vector<int32_t> due;
  for (int32_t b = 1; b <= 9; ++b) {
    if (StateGroup::checkpoint_due(s, b, options)) due.push_back(b);
  }
  CHECK(due == std::vector<int32_t>{2, 3, 5, 6, 9});
  CHECK_FALSE(StateGroup::checkpoint_due(s, 3, {.block_size = 4}));  // no interval
}

TEST_CASE("a checkpoint is a hit at exactly its position, verified after the anchor's chain",
          "[state_group]") {
  GroupFixture f(with_state(4, {.hash_fn = first_token_hash}));
  FullAttentionGroup& full = f.group<FullAttentionGroup>(kFull);
  StateGroup& g = f.group<StateGroup>(kState);
  Sequence& a = f.add(1, tokens_from(0, 10));
  f.step(a, 10);  // slot 0; full blocks 0 and 1 cached
  g.save_checkpoint(a, 2);
  g.save_checkpoint(a, 2);  // kept already: no second copy
  const StepOps saved = f.end_step();
  CHECK(saved.save_state ==
        std::vector<StateSave>{{.seq = 1, .position = 8, .src = 0, .dst = 1, .group = kState}});
  CHECK(g.stats().checkpoints_saved == 1);
  // Another prompt with the same first 8 tokens: the checkpoint after block 2 is a hit,
  // none is at block 1.
  std::vector<TokenId> tokens = tokens_from(0, 8);
  tokens.insert(tokens.end(), {50, 51, 52, 53});
  Sequence& b = f.add(2, tokens);
  f.hash(b, 2);
  REQUIRE(full.begin_match(b, 2) == 2);
  REQUIRE(g.begin_match(b, 2) == 2);
  CHECK(g.longest_hit(b, 1) == 0);
  CHECK(g.longest_hit(b, 2) == 2);
  // Its restore: a slot of b's own (2), filled by a copy of the checkpoint.
  g.restore_checkpoint(b);
  CHECK(b.tables[kState].blocks == std::vector<BlockId>{2});
  CHECK(f.end_step().copy_state ==
        std::vector<BlockCopy>{{.src = 1, .dst = 2, .num_tokens = 4, .group = kState}});
  CHECK(g.stats().checkpoints_restored == 1);
  // Other tokens in block 1 hash alike (its first token), but the checkpoint after it is
  // verified against its tokens: no hit.
  std::vector<TokenId> other = tokens_from(0, 12);
  other[5] = 99;
  Sequence& c = f.add(3, other);
  f.hash(c, 2);
  REQUIRE(c.block_hashes[1] == a.block_hashes[1]);
  REQUIRE(full.begin_match(c, 2) == 1);
  CHECK(g.longest_hit(c, 2) == 0);
}

TEST_CASE("a fork needs its parent's state computed and a free slot", "[state_group]") {
  GroupFixture f(with_state(2));
  StateGroup& g = f.group<StateGroup>(kState);
  Sequence& a = f.add(1, tokens_from(0, 6));
  f.step(a, 6);
  const absl::Status unwritten = g.check_fork(a, "fork");
  CHECK(absl::IsFailedPrecondition(unwritten));
  CHECK(std::string(unwritten.message()) ==
        "fork(parent 1): its state in group 1 is not computed before this step's ops run; fork "
        "after the step");
  (void)f.end_step();
  REQUIRE(g.check_fork(a, "fork").ok());
  // The child gets the last slot, filled by a copy of the parent's.
  Sequence& child = f.add(2, a.tokens);
  child.tables = a.tables;
  child.num_computed = a.num_computed;
  g.fork(child, /*context_blocks=*/2);
  CHECK(child.tables[kState].blocks == std::vector<BlockId>{1});
  CHECK(f.end_step().copy_state ==
        std::vector<BlockCopy>{{.src = 0, .dst = 1, .num_tokens = 4, .group = kState}});
  const absl::Status full = g.check_fork(a, "fork");
  CHECK(absl::IsResourceExhausted(full));
  CHECK(std::string(full.message()) == "fork(parent 1): no free state slot in group 1 of 2");
}

}  // namespace
}  // namespace pagedkv
