// Tests of the state-layer prefix-hit study (state_cache.h): admission positions, the
// checkpoint eviction order, the vLLM-rule model's hit lengths with big blocks and the
// partial entry, the budget split, and a system prompt shorter than vLLM's block repeating
// under different user turns. Every figure is computed by hand in the comments.
#include <catch2/catch.hpp>

#include <vector>

#include "state_cache.h"
#include "tokens.h"

namespace pagedkv::sim {
namespace {

using Positions = std::vector<int64_t>;

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

// A model whose vLLM entries cost one byte each, with vLLM blocks of `big` tokens.
StateModel unit_model(int32_t big) {
  StateModel m;
  m.name = "unit";
  m.attention_bytes_per_token = 1;
  m.slot_bytes = 1;
  m.vllm_block_tokens = big;
  m.vllm_state_bytes = 1;
  m.vllm_block_bytes = 1;
  return m;
}

TEST_CASE("state: admission positions", "[state]") {
  const CheckpointPolicy pagedkv = CheckpointPolicy::pagedkv();
  // The prompt's last full block only: no match, nothing to branch from.
  CHECK(admission_positions(100, 0, 0, pagedkv, 16) == Positions{96});
  // The chain matched 288 tokens of 1,000: the branch point and the end (62 x 16).
  CHECK(admission_positions(1000, 288, 0, pagedkv, 16) == Positions{288, 992});
  // Hit at the branch point: its state was not computed, only the end is saved.
  CHECK(admission_positions(1000, 288, 288, pagedkv, 16) == Positions{992});
  // The prompt ends less than a block past the match: 288 is its end, saved once.
  CHECK(admission_positions(300, 288, 0, pagedkv, 16) == Positions{288});
  // Every block boundary after the hit (32, 48, 64; 64 is the end).
  CHECK(admission_positions(70, 16, 16, CheckpointPolicy::every_block(), 16) ==
        Positions{32, 48, 64});
  // Every 4 blocks (64 tokens) plus the branch point 80 and the end 192.
  CheckpointPolicy every4 = pagedkv;
  every4.every_blocks = 4;
  CHECK(admission_positions(200, 80, 0, every4, 16) == Positions{64, 80, 128, 192});
}

TEST_CASE("state: checkpoint buckets are log2 of position / b", "[state]") {
  CHECK(checkpoint_bucket(16, 16) == 0);
  CHECK(checkpoint_bucket(32, 16) == 1);
  CHECK(checkpoint_bucket(48, 16) == 1);
  CHECK(checkpoint_bucket(64, 16) == 2);
  CHECK(checkpoint_bucket(1024, 16) == 6);
}

TEST_CASE("state: eviction order, priority classes against LRU", "[state]") {
  // Three slots: A at 160 (bucket 3), B at 32 (bucket 1), C at 1,024 (bucket 6); B is hit.
  auto run = [](const CheckpointPolicy& policy) {
    CheckpointCache cache(3, policy, 16);
    cache.save(1, 160);
    cache.save(2, 32);
    cache.save(3, 1024);
    cache.hit(2);
    std::vector<std::vector<bool>> held;
    for (auto [key, position] : {std::pair<uint64_t, int64_t>{4, 48}, {5, 4096}, {6, 64}}) {
      cache.save(key, position);
      held.push_back({cache.contains(1), cache.contains(2), cache.contains(3), cache.contains(4),
                      cache.contains(5)});
    }
    return held;
  };
  // Classes: never-hit first, smallest bucket first: D (48) evicts A (bucket 3 < 6);
  // E (4,096) evicts D (bucket 1); F (64) evicts C (6 < E's 8). B, hit, stays.
  const auto classes = run(CheckpointPolicy::classes());
  CHECK(classes[0] == std::vector<bool>{false, true, true, true, false});
  CHECK(classes[1] == std::vector<bool>{false, true, true, false, true});
  CHECK(classes[2] == std::vector<bool>{false, true, false, false, true});
  // pagedkv's LRU (the hit made B the most recent): A, then C, then B go.
  const auto lru = run(CheckpointPolicy::pagedkv());
  CHECK(lru[0] == std::vector<bool>{false, true, true, true, false});
  CHECK(lru[1] == std::vector<bool>{false, true, false, true, true});
  CHECK(lru[2] == std::vector<bool>{false, false, false, true, true});
}

TEST_CASE("state: the hit class never decays: classes evict the next turn's checkpoint",
          "[state]") {
  // Two slots. Checkpoints 1 (32) and 2 (48) are each hit once, as a prompt end is by the
  // next turn, then 3 (64) and 4 (80) are saved, 3 to be hit by its next turn.
  auto run = [](const CheckpointPolicy& policy) {
    CheckpointCache cache(2, policy, 16);
    cache.save(1, 32);
    cache.hit(1);
    cache.save(2, 48);
    cache.hit(2);
    cache.save(3, 64);  // both hit, bucket 1: the older, 1, goes (both orders)
    cache.save(4, 80);
    return std::vector<bool>{cache.contains(1), cache.contains(2), cache.contains(3),
                             cache.contains(4)};
  };
  // Classes: 3 has not been hit yet, so it goes before the stale 2.
  CHECK(run(CheckpointPolicy::classes()) == std::vector<bool>{false, true, false, true});
  // LRU: 2 was last used before 3 was saved: 2 goes, 3 waits for its hit.
  CHECK(run(CheckpointPolicy::pagedkv()) == std::vector<bool>{false, false, true, true});
}

TEST_CASE("state: LRU within a bucket under classes", "[state]") {
  CheckpointCache cache(3, CheckpointPolicy::classes(), 16);
  cache.save(1, 32);    // bucket 1
  cache.save(2, 48);    // bucket 1, newer
  cache.save(3, 1024);  // bucket 6
  cache.save(4, 2048);  // evicts 1: the older of bucket 1
  CHECK_FALSE(cache.contains(1));
  CHECK(cache.contains(2));
  cache.save(1, 32);  // evicts 2, older than 1 now
  CHECK_FALSE(cache.contains(2));
  CHECK(cache.evicted() == 2);
}

TEST_CASE("state: the vLLM rule hits at its blocks and at partial entries", "[state]") {
  // vLLM blocks of 64 tokens, b = 16; a pool that evicts nothing.
  const StateModel model = unit_model(64);
  const std::vector<TokenId> system = stream_tokens(1, 300);
  const std::vector<TokenId> r1 = concat(system, stream_tokens(2, 50));  // 350 tokens
  const std::vector<TokenId> r2 = concat(system, stream_tokens(3, 50));  // 350 tokens
  // A later turn of r1: r1, an answer and a user turn (500 tokens).
  const std::vector<TokenId> r3 = concat(r1, stream_tokens(4, 150));
  StateWorkload w{"unit", {prompt_keys(r1, 16), prompt_keys(r2, 16), prompt_keys(r3, 16)}};
  absl::StatusOr<StateReplayResult> vllm = replay_vllm_state(w, model, 1 << 20, 16);
  REQUIRE(vllm.ok());
  // r1 caches blocks and states at 64..320 and the partial entry at 336 (21 x 16).
  // r2 shares 300 tokens: 4 full blocks (256); no state at 288 (no block ends there, no
  // prompt ended there): 256. r3 extends r1: 5 full blocks, and in the sixth r1's partial
  // entry at 336: 336. Total 592.
  CHECK(vllm->hit_tokens == 256 + 336);
  // r1: 5 block states + the partial tail; r2: states at 320 and its tail 336; r3: 384,
  // 448 and the tail 496.
  CHECK(vllm->checkpoints_saved == 6 + 2 + 3);

  // pagedkv on the same: r2 matches 288 tokens (18 blocks) but no checkpoint lies there
  // yet (r1 saved only its end): 0; it saves the branch point 288. r3 hits r1's end, 336.
  absl::StatusOr<StateReplayResult> pagedkv =
      replay_pagedkv_state(w, 1000, 100, CheckpointPolicy::pagedkv(), 16);
  REQUIRE(pagedkv.ok());
  CHECK(pagedkv->hit_tokens == 336);
  CHECK(pagedkv->attention_tokens == 288 + 336);
  CHECK(pagedkv->checkpoints_saved == 1 + 2 + 1);
}

TEST_CASE("state: the vLLM rule's pool evicts least recent entries first", "[state]") {
  // Blocks of 64 tokens, each entry one byte. A 128-token prompt takes 2 blocks, the
  // running state and states at 64 and 128 (the tail 128 is a block end: no partial
  // entry): 5 bytes, 4 cached after it. A pool of 5 bytes keeps one prompt's entries.
  const StateModel model = unit_model(64);
  const std::vector<TokenId> a = stream_tokens(1, 128), b = stream_tokens(2, 128);
  StateWorkload w{"unit", {prompt_keys(a, 16), prompt_keys(b, 16), prompt_keys(a, 16)}};
  absl::StatusOr<StateReplayResult> small = replay_vllm_state(w, model, 5, 16);
  REQUIRE(small.ok());
  CHECK(small->hit_tokens == 0);  // b evicted a
  absl::StatusOr<StateReplayResult> large = replay_vllm_state(w, model, 10, 16);
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
  REQUIRE(model->vllm_block_tokens == 544);
  CHECK(model->slot_bytes == 36 * (49152 + 1048576));
  // A 300-token system prompt under ten different 100-token user turns.
  const std::vector<TokenId> system = stream_tokens(7, 300);
  StateWorkload w{"system prompt", {}};
  for (uint64_t u = 0; u < 10; ++u)
    w.prompts.push_back(prompt_keys(concat(system, stream_tokens(100 + u, 100)), 16));
  const int64_t budget = int64_t{64} << 30;  // evicts nothing
  absl::StatusOr<StateSplit> split = split_state_budget(*model, budget, 400, 2);
  REQUIRE(split.ok());
  absl::StatusOr<StateReplayResult> pagedkv = replay_pagedkv_state(
      w, split->attention_blocks, split->state_slots, CheckpointPolicy::pagedkv(), 16);
  absl::StatusOr<StateReplayResult> vllm = replay_vllm_state(w, *model, budget, 16);
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
