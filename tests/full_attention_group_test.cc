// Tests of FullAttentionGroup, driven directly (support/group_test_util.h): a sequence holds
// every block of its context, a step's blocks and copy-on-write, the plan's refusals, and
// hits as the verified chain from block 0. A fresh pool hands out its clean blocks in id
// order.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "support/group_test_util.h"

namespace pagedkv {
namespace {

using internal::FullAttentionGroup;
using internal::GroupPlan;
using internal::Sequence;
using internal::StepRequest;
using testing::first_token_hash;
using testing::GroupFixture;
using testing::tokens_from;

// One full-attention group of 8 blocks of 4 tokens.
KvCacheManager::Options one_group(KvCacheManager::Options options = {}) {
  options.block_size = 4;
  options.layer_groups = full_attention(8);
  return options;
}

TEST_CASE("a full group needs every block of a prompt to run", "[full_attention_group]") {
  GroupFixture f(one_group());
  const FullAttentionGroup& g = f.group<FullAttentionGroup>(0);
  CHECK(g.blocks_to_run(1) == 1);
  CHECK(g.blocks_to_run(4) == 1);
  CHECK(g.blocks_to_run(5) == 2);
  CHECK(g.blocks_to_run(32) == 8);
}

TEST_CASE(
    "a step takes the blocks its slots need, and a write into a shared partial block copies it",
    "[full_attention_group]") {
  GroupFixture f(one_group());
  FullAttentionGroup& g = f.group<FullAttentionGroup>(0);
  Sequence& a = f.add(1, tokens_from(100, 10));
  CHECK(f.step(a, 10) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(a.tables[0].blocks == std::vector<BlockId>{0, 1, 2});
  (void)f.end_step();
  // A fork shares the three blocks; the last holds 2 tokens.
  Sequence& b = f.add(2, a.tokens);
  b.tables = a.tables;
  b.num_computed = 10;
  b.state = SequenceState::kRunning;
  g.fork(b, /*context_blocks=*/3);
  CHECK(*g.device_pool().ref_count(2) == 2);
  // a's next token goes into block 2, which b shares: a copy of its 2 tokens into block 3
  // takes its place in a's table.
  a.tokens.push_back(110);
  CHECK(f.step(a, 1) == std::vector<int64_t>{3 * 4 + 2});
  CHECK(a.tables[0].blocks == std::vector<BlockId>{0, 1, 3});
  CHECK(b.tables[0].blocks == std::vector<BlockId>{0, 1, 2});
  CHECK(*g.device_pool().ref_count(2) == 1);
  CHECK(f.end_step().copy_on_write ==
        std::vector<BlockCopy>{{.src = 2, .dst = 3, .num_tokens = 2, .group = 0}});
  CHECK(f.shared().counters.cow_copies == 1);
}

TEST_CASE("a full group's plan refuses what its pool cannot hold, naming the figures",
          "[full_attention_group]") {
  GroupFixture f(one_group({.watermark_blocks = 2}));
  FullAttentionGroup& g = f.group<FullAttentionGroup>(0);
  Sequence& running = f.add(1, tokens_from(0, 8));
  f.step(running, 8);  // blocks 0 and 1
  GroupPlan plan;
  // An admission leaves the watermark free while another sequence runs.
  const Sequence& admitted = f.add(2, tokens_from(100, 24));
  const StepRequest six_blocks{.num_new_tokens = 24,
                               .new_total = 24,
                               .slots_total = 24,
                               .total_blocks = 6,
                               .admission = true};
  const absl::Status exhausted = g.plan_step(admitted, six_blocks, plan);
  CHECK(absl::IsResourceExhausted(exhausted));
  CHECK(std::string(exhausted.message()) ==
        "allocate_slots(seq 2): need 6 blocks + watermark 2, 6 free of 8");
  // More blocks than the pool has can never be served.
  const Sequence& long_prompt = f.add(3, tokens_from(200, 40));
  const StepRequest ten_blocks{.num_new_tokens = 40,
                               .new_total = 40,
                               .slots_total = 40,
                               .total_blocks = 10,
                               .admission = true};
  const absl::Status too_long = g.plan_step(long_prompt, ten_blocks, plan);
  CHECK(absl::IsInvalidArgument(too_long));
  CHECK(std::string(too_long.message()) ==
        "allocate_slots(seq 3): 40 slots need 10 blocks; the pool has 8");
  CHECK(g.device_pool().num_free_blocks() == 6);  // plans change nothing
}

TEST_CASE("a full group's hit is the verified chain from block 0", "[full_attention_group]") {
  GroupFixture f(one_group({.hash_fn = first_token_hash}));
  FullAttentionGroup& g = f.group<FullAttentionGroup>(0);
  Sequence& a = f.add(1, tokens_from(0, 16));
  f.step(a, 16);  // blocks 0-3, each cached after the one before
  (void)f.end_step();
  // The same prompt: every block a hit (the last token never is: 3 of 4 blocks).
  Sequence& same = f.add(2, tokens_from(0, 16));
  f.hash(same, 3);
  CHECK(g.begin_match(same, 3) == 3);
  CHECK(g.longest_hit(same, 3) == 3);
  for (int32_t i = 0; i < 3; ++i) CHECK(g.matched_key(i) == g.held_key(a, i));
  // Block 2 differs: the chain stops before it.
  std::vector<TokenId> other = tokens_from(0, 16);
  other[9] = 999;
  Sequence& differs = f.add(3, other);
  f.hash(differs, 3);
  CHECK(g.begin_match(differs, 3) == 2);
  // Block 1 starts like a's (4) and so hashes alike, but holds other tokens: verification
  // refuses the candidate, and nothing after it can hit.
  std::vector<TokenId> colliding = tokens_from(0, 16);
  colliding[5] = 77;
  Sequence& collides = f.add(4, colliding);
  f.hash(collides, 3);
  CHECK(collides.block_hashes[1] == a.block_hashes[1]);
  CHECK(g.begin_match(collides, 3) == 1);
}

}  // namespace
}  // namespace pagedkv
