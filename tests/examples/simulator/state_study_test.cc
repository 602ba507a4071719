// Tests of the state-layer prefix-hit study (state_study.h): the vLLM-rule model's hit
// lengths with big blocks and the partial entry, its LRU pool, the manager's checkpoints on
// the same prompts (prompt ends, branch points, an interval), the budget split, and a system
// prompt shorter than vLLM's block repeating under different user turns. Every figure is
// computed by hand in the comments.
#include <catch2/catch.hpp>

#include <utility>
#include <vector>

#include "state_study.h"
#include "studies/vllm_state_rule.h"
#include "tokens.h"

namespace pagedkv::sim {
namespace {

constexpr CheckpointPolicy kPagedkv{.name = "pagedkv"};

// Tokens [0, n) of a shared stream `stream`.
std::vector<TokenId> stream_tokens(uint64_t stream, int32_t n) {
  std::vector<TokenId> t(n);
  for (int32_t p = 0; p < n; ++p) t[p] = derive_token(0x7e57, stream, p);
  return t;
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A workload of these prompts (16-token blocks).
StateWorkload workload_of(std::vector<std::vector<TokenId>> prompts) {
  StateWorkload w;
  w.prompts.name = "unit";
  for (const std::vector<TokenId>& p : prompts) {
    w.prompts.lengths.push_back(static_cast<int32_t>(p.size()));
    w.prompts.outputs.push_back(1);
    w.keys.push_back(prompt_keys(p, 16));
  }
  w.prompts.tokens = [prompts = std::move(prompts)](int64_t i, std::vector<TokenId>& out) {
    out = prompts[static_cast<size_t>(i)];
  };
  return w;
}

// vLLM blocks of `big` tokens whose entries cost one byte each.
VllmStateSizes unit_sizes(int32_t big) {
  return {.block_tokens = big, .state_bytes = 1, .block_bytes = 1};
}

TEST_CASE("state: the vLLM rule hits at its blocks and at partial entries", "[state]") {
  // vLLM blocks of 64 tokens, b = 16; a pool that evicts nothing.
  const std::vector<TokenId> system = stream_tokens(1, 300);
  const std::vector<TokenId> r1 = concat(system, stream_tokens(2, 50));  // 350 tokens
  const std::vector<TokenId> r2 = concat(system, stream_tokens(3, 50));  // 350 tokens
  // A later turn of r1: r1, an answer and a user turn (500 tokens).
  const std::vector<TokenId> r3 = concat(r1, stream_tokens(4, 150));
  const StateWorkload w = workload_of({r1, r2, r3});
  absl::StatusOr<PrefixHits> vllm = replay_vllm_state_rule(w.keys, unit_sizes(64), 1 << 20, 16);
  REQUIRE(vllm.ok());
  // r1 caches blocks and states at 64..320 and the partial entry at 336 (21 x 16).
  // r2 shares 300 tokens: 4 full blocks (256); no state at 288 (no block ends there, no
  // prompt ended there): 256. r3 extends r1: 5 full blocks, and in the sixth r1's partial
  // entry at 336: 336. Total 592.
  CHECK(vllm->hit_tokens == 256 + 336);
  // r1: 5 block states + the partial tail; r2: states at 320 and its tail 336; r3: 384,
  // 448 and the tail 496.
  CHECK(vllm->checkpoints_saved == 6 + 2 + 3);

  // The manager on the same: r2 matches 288 tokens (18 blocks) but no checkpoint lies there
  // yet (r1 saved only its end): 0; it saves the branch point 288 and its end. r3 hits r1's
  // end, 336, and saves its own end.
  absl::StatusOr<PrefixHits> pagedkv =
      replay_state_manager(w, {.attention_blocks = 1000, .state_slots = 100}, kPagedkv, 16);
  REQUIRE(pagedkv.ok());
  CHECK(pagedkv->hit_tokens == 336);
  CHECK(pagedkv->full_hold_tokens == 288 + 336);
  CHECK(pagedkv->checkpoints_saved == 1 + 2 + 1);
}

TEST_CASE("state: a checkpoint every block lets a branch point hit the second time", "[state]") {
  // Two prompts share a 300-token system prompt. The manager's default saves r1's end only,
  // so r2 misses; with a checkpoint every block r1 saves one at 288, the end of the shared
  // blocks, and r2 hits it.
  const std::vector<TokenId> system = stream_tokens(1, 300);
  const StateWorkload w =
      workload_of({concat(system, stream_tokens(2, 50)), concat(system, stream_tokens(3, 50))});
  const StateSplit split{.attention_blocks = 1000, .state_slots = 100};
  absl::StatusOr<PrefixHits> ends = replay_state_manager(w, split, kPagedkv, 16);
  REQUIRE(ends.ok());
  CHECK(ends->hit_tokens == 0);
  absl::StatusOr<PrefixHits> every =
      replay_state_manager(w, split, {.name = "every block", .interval_blocks = 1}, 16);
  REQUIRE(every.ok());
  CHECK(every->hit_tokens == 288);
  CHECK(every->checkpoints_saved == 21 + 3);  // r1 at 16..336; r2 past its hit: 304..336
}

TEST_CASE("state: the vLLM rule's pool evicts least recent entries first", "[state]") {
  // Blocks of 64 tokens, each entry one byte. A 128-token prompt takes 2 blocks, the
  // running state and states at 64 and 128 (the tail 128 is a block end: no partial
  // entry): 5 bytes, 4 cached after it. A pool of 5 bytes keeps one prompt's entries.
  const std::vector<TokenId> a = stream_tokens(1, 128), b = stream_tokens(2, 128);
  const StateWorkload w = workload_of({a, b, a});
  absl::StatusOr<PrefixHits> small = replay_vllm_state_rule(w.keys, unit_sizes(64), 5, 16);
  REQUIRE(small.ok());
  CHECK(small->hit_tokens == 0);  // b evicted a
  absl::StatusOr<PrefixHits> large = replay_vllm_state_rule(w.keys, unit_sizes(64), 10, 16);
  REQUIRE(large.ok());
  CHECK(large->hit_tokens == 64);  // at most length - 1: the state at 64
}

TEST_CASE("state: the budget split by checkpoints per sequence", "[state]") {
  absl::StatusOr<StateModel> m = builtin_state_model("qwen3-next-80b-a3b");
  REQUIRE(m.ok());
  // 12 layers x 2 x 2 x 256 x 2 bytes = 24,576 bytes per token, 393,216 per block; a
  // slot is 36 x (49,152 + 1,048,576) = 39,518,208 bytes. 1,600 tokens: 100 blocks,
  // 39,321,600 bytes; with 2 checkpoints, 3 slots: 118,554,624 bytes. A budget of
  // 100 x (39,321,600 + 118,554,624) splits into 10,000 blocks and 300 slots.
  const int64_t budget = 100 * (int64_t{39321600} + 118554624);
  absl::StatusOr<StateSplit> split = split_state_budget(*m, budget, 1600, 2);
  REQUIRE(split.ok());
  CHECK(split->attention_blocks == 10000);
  CHECK(split->state_slots == 300);
  // With no checkpoint (a running slot only) the state share is a third as large.
  absl::StatusOr<StateSplit> none = split_state_budget(*m, budget, 1600, 0);
  REQUIRE(none.ok());
  CHECK(none->state_slots * 39518208 + none->attention_blocks * 393216 <= budget);
  CHECK(none->attention_blocks > 10000);
  CHECK(none->state_slots < 300);
}

TEST_CASE("state: a system prompt shorter than vLLM's block hits in pagedkv", "[state]") {
  absl::StatusOr<StateModel> model = builtin_state_model("qwen3-next-80b-a3b");
  REQUIRE(model.ok());
  // One GDN layer's state (49,152 + 1,048,576 bytes) over one attention layer's token
  // (2 x 2 x 256 x 2 = 2,048 bytes) is 536 tokens: 544, the next multiple of 16.
  REQUIRE(model->vllm.block_tokens == 544);
  CHECK(model->slot_bytes == 36 * (49152 + 1048576));
  // A 300-token system prompt under ten different 100-token user turns.
  const std::vector<TokenId> system = stream_tokens(7, 300);
  std::vector<std::vector<TokenId>> prompts;
  for (uint64_t u = 0; u < 10; ++u) prompts.push_back(concat(system, stream_tokens(100 + u, 100)));
  const StateWorkload w = workload_of(std::move(prompts));
  const int64_t budget = int64_t{64} << 30;  // evicts nothing
  absl::StatusOr<StateSplit> split = split_state_budget(*model, budget, 400, 2);
  REQUIRE(split.ok());
  absl::StatusOr<PrefixHits> pagedkv = replay_state_manager(w, *split, kPagedkv, 16);
  absl::StatusOr<PrefixHits> vllm = replay_vllm_state_rule(w.keys, model->vllm, budget, 16);
  REQUIRE(pagedkv.ok());
  REQUIRE(vllm.ok());
  // The second request saves the branch point 288 (18 blocks); the eight after it hit it.
  CHECK(pagedkv->hit_tokens == 8 * 288);
  CHECK(pagedkv->hits == 8);
  // vLLM: no block of 544 tokens ends inside the prompts (400 tokens), and the partial
  // entries sit at the prompt ends (400), which no later prompt shares.
  CHECK(vllm->hit_tokens == 0);
}

}  // namespace
}  // namespace pagedkv::sim
