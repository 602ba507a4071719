// Tests of KvCacheManager: admission, prefix matching, slots, copy-on-write, preemption,
// swapping, block tables, bad input. check_invariants() runs after every step.
#include "pagedkv/kv_cache_manager.h"

#include <catch2/catch.hpp>

#include <climits>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "support/manager_test_util.h"

namespace pagedkv {
namespace {

using namespace pagedkv::testing;  // NOLINT: the shared test helpers

// Everything observable about the manager, to check that a failed call changed nothing.
struct Snapshot {
  KvCacheManager::Stats stats;
  std::vector<std::tuple<SeqId, SequenceState, int32_t, std::vector<TokenId>, Blocks, Blocks>> seqs;
  Blocks free_queue;
  bool operator==(const Snapshot& o) const {
    return seqs == o.seqs && free_queue == o.free_queue &&
           stats.used_blocks == o.stats.used_blocks && stats.free_blocks == o.stats.free_blocks &&
           stats.cached_free_blocks == o.stats.cached_free_blocks &&
           stats.used_host_blocks == o.stats.used_host_blocks &&
           stats.evictions == o.stats.evictions && stats.cow_copies == o.stats.cow_copies;
  }
};

Snapshot snapshot(const KvCacheManager& m, const std::vector<SeqId>& ids) {
  Snapshot s{m.stats(), {}, m.device_pool().value()->free_queue_order()};
  for (const SeqId id : ids) {
    auto v = m.sequence(id);
    if (!v.ok()) continue;
    s.seqs.emplace_back(id, v->state, v->num_computed_tokens,
                        std::vector<TokenId>(v->tokens.begin(), v->tokens.end()),
                        Blocks(v->block_table.begin(), v->block_table.end()),
                        Blocks(v->host_blocks.begin(), v->host_blocks.end()));
  }
  return s;
}

BlockHash constant_hash(const BlockHash*, std::span<const TokenId>, std::span<const uint64_t>) {
  return BlockHash{7, 7};
}

struct RecordingHooks : PreemptionHooks {
  std::vector<std::pair<SeqId, PreemptionMode>> calls;
  std::vector<SeqId> claims;
  void on_preempt(SeqId victim, PreemptionMode mode) override { calls.emplace_back(victim, mode); }
  void on_claim_released(SeqId seq) override { claims.push_back(seq); }
};

TEST_CASE("create rejects invalid options, naming the value") {
  require_error(KvCacheManager::create({.layer_groups = full_attention(0)}).status(),
                absl::StatusCode::kInvalidArgument, "num_blocks 0");
  require_error(
      KvCacheManager::create({.block_size = -2, .layer_groups = full_attention(4)}).status(),
      absl::StatusCode::kInvalidArgument, "block_size -2");
  require_error(KvCacheManager::create({.layer_groups = full_attention(4, -1)}).status(),
                absl::StatusCode::kInvalidArgument, "num_host_blocks -1");
  require_error(
      KvCacheManager::create({.watermark_blocks = 4, .layer_groups = full_attention(4)}).status(),
      absl::StatusCode::kInvalidArgument, "watermark_blocks 4");
  require_error(
      KvCacheManager::create({.max_model_len = 0, .layer_groups = full_attention(4)}).status(),
      absl::StatusCode::kInvalidArgument, "max_model_len 0");
  require_error(
      KvCacheManager::create({.hash_fn = nullptr, .layer_groups = full_attention(4)}).status(),
      absl::StatusCode::kInvalidArgument, "hash_fn");
}

TEST_CASE("prefill returns the slot mapping and fills blocks in order") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(8)});
  admit(m, 1, iota_tokens(6));
  REQUIRE(*m.match_prefix(1) == 0);
  REQUIRE(allocate(m, 1, 6) == Slots{0, 1, 2, 3, 4, 5});
  REQUIRE(table(m, 1) == Blocks{0, 1});
  REQUIRE(m.sequence(1)->state == SequenceState::kRunning);
  REQUIRE(m.sequence(1)->num_computed_tokens == 6);
  // Decode: two tokens fit in block 1, the third opens block 2.
  for (const int64_t expected : {6, 7, 8}) {
    REQUIRE(m.append_tokens(1, std::vector<TokenId>{1}).ok());
    REQUIRE(allocate(m, 1, 1) == Slots{expected});
  }
  REQUIRE(table(m, 1) == Blocks{0, 1, 2});
  REQUIRE(m.stats().used_blocks == 3);
}

// allocate_slots() reuses the sequence the last append_tokens() found: a free, a re-added id
// and other sequences in between must not leave it pointing at the wrong one.
TEST_CASE("allocate_slots after append_tokens finds the right sequence") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(8)});
  admit(m, 1, iota_tokens(2));
  admit(m, 2, iota_tokens(3));
  REQUIRE(allocate(m, 1, 2) == Slots{0, 1});
  REQUIRE(allocate(m, 2, 3) == Slots{4, 5, 6});
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{7}).ok());
  REQUIRE(allocate(m, 2, 0).empty());  // another sequence: no new token for it
  REQUIRE(allocate(m, 1, 1) == Slots{2});
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{7}).ok());
  REQUIRE(m.free(1).ok());
  require_error(m.allocate_slots(1, 1).status(), absl::StatusCode::kNotFound, "unknown sequence");
  admit(m, 1, iota_tokens(5));  // the same id, a new sequence
  REQUIRE(allocate(m, 1, 5).size() == 5);
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{7}).ok());
  const Blocks blocks = table(m, 1);
  REQUIRE(blocks.size() == 2);
  REQUIRE(allocate(m, 1, 1) == Slots{int64_t{blocks[1]} * 4 + 1});
  REQUIRE(m.sequence(1)->num_computed_tokens == 6);
  REQUIRE(m.sequence(2)->num_computed_tokens == 3);
}

TEST_CASE("lookahead reserves spare slots without computing them") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(8)});
  admit(m, 1, iota_tokens(3));
  REQUIRE(allocate(m, 1, 3, /*lookahead=*/6) == Slots{0, 1, 2});
  REQUIRE(table(m, 1) == Blocks{0, 1, 2});
  REQUIRE(m.sequence(1)->num_computed_tokens == 3);
  REQUIRE(m.append_tokens(1, iota_tokens(2)).ok());
  REQUIRE(allocate(m, 1, 2) == Slots{3, 4});
  REQUIRE(table(m, 1) == Blocks{0, 1, 2});  // no new block
}

TEST_CASE("a freed prompt's full blocks hit the prefix cache, never the last token") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(8)});
  const std::vector<TokenId> prompt = iota_tokens(10);
  admit(m, 1, prompt);
  allocate(m, 1, 10);
  const Blocks first = table(m, 1);  // 0 1 2
  end_step(m);
  REQUIRE(m.free(1).ok());
  require_valid(m);
  REQUIRE(m.stats().cached_free_blocks == 2);  // two full blocks; block 2 is partial

  admit(m, 2, prompt);
  REQUIRE(*m.match_prefix(2) == 8);
  REQUIRE(table(m, 2) == Blocks{first[0], first[1]});
  // The new block comes from the head of the free queue: block 2, the freed partial
  // block, which holds no hash and went to the head.
  REQUIRE(allocate(m, 2, 2) == Slots{2 * 4, 2 * 4 + 1});
  REQUIRE(m.stats().prefix_query_tokens == 10);  // only sequence 2 looked up
  REQUIRE(m.stats().prefix_hit_tokens == 8);

  // A prompt of exactly two blocks reuses only the first: its last token must be computed.
  admit(m, 3, iota_tokens(8));
  REQUIRE(*m.match_prefix(3) == 4);
  REQUIRE(table(m, 3) == Blocks{first[0]});
  require_valid(m);
}

TEST_CASE("eviction under pressure takes the least recently freed, tail blocks first") {
  KvCacheManager m = make_manager({.block_size = 2, .layer_groups = full_attention(6)});
  admit(m, 1, iota_tokens(6, 0));
  allocate(m, 1, 6);  // blocks 0 1 2, all full and cached
  admit(m, 2, iota_tokens(4, 50));
  allocate(m, 2, 4);  // blocks 3 4
  end_step(m);
  REQUIRE(m.free(1).ok());
  REQUIRE(m.free(2).ok());
  require_valid(m);
  REQUIRE(m.device_pool().value()->free_queue_order() == Blocks{5, 2, 1, 0, 4, 3});
  admit(m, 3, iota_tokens(5, 200));
  allocate(m, 3, 5);  // 3 blocks: 5 (clean), then evicts 2 and 1
  REQUIRE(table(m, 3) == Blocks{5, 2, 1});
  REQUIRE(m.stats().evictions == 2);
  // Sequence 1's first block survived; its second did not.
  admit(m, 4, iota_tokens(6, 0));
  REQUIRE(*m.match_prefix(4) == 2);
  REQUIRE(table(m, 4) == Blocks{0});
  require_valid(m);
}

TEST_CASE("the same tokens with a different cache salt share nothing") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(8)});
  const std::vector<TokenId> prompt = iota_tokens(9);
  admit(m, 1, prompt, {.extra_keys = {1111}});
  allocate(m, 1, 9);
  admit(m, 2, prompt, {.extra_keys = {2222}});
  REQUIRE(*m.match_prefix(2) == 0);
  admit(m, 3, prompt, {.extra_keys = {1111}});
  REQUIRE(*m.match_prefix(3) == 8);
  require_valid(m);
}

TEST_CASE("a forced hash collision is never shared") {
  KvCacheManager m =
      make_manager({.block_size = 4, .hash_fn = constant_hash, .layer_groups = full_attention(8)});
  admit(m, 1, iota_tokens(9, 0));
  allocate(m, 1, 9);
  admit(m, 2, iota_tokens(9, 1000));  // every block hashes the same, contents differ
  REQUIRE(*m.match_prefix(2) == 0);
  allocate(m, 2, 9);
  // With the same contents, the verified block is shared as usual.
  admit(m, 3, iota_tokens(9, 0));
  REQUIRE(*m.match_prefix(3) == 4);
  REQUIRE(table(m, 3)[0] == table(m, 1)[0]);
  require_valid(m);
}

TEST_CASE("fork shares blocks, and appending to a shared partial block copies it once") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(8)});
  admit(m, 1, iota_tokens(6));
  allocate(m, 1, 6);  // blocks 0 (full) 1 (2 tokens)
  end_step(m);
  REQUIRE(m.fork(1, 2).ok());
  require_valid(m);
  REQUIRE(table(m, 2) == Blocks{0, 1});
  REQUIRE(*m.device_pool().value()->ref_count(1) == 2);

  SECTION("the child appends") {
    REQUIRE(m.append_tokens(2, std::vector<TokenId>{9}).ok());
    REQUIRE(allocate(m, 2, 1) == Slots{2 * 4 + 2});
    REQUIRE(table(m, 2) == Blocks{0, 2});
    REQUIRE(m.take_step_ops().copy_on_write == std::vector<BlockCopy>{{1, 2, 2}});
    // The parent now owns block 1 alone: no second copy.
    REQUIRE(m.append_tokens(1, std::vector<TokenId>{8}).ok());
    REQUIRE(allocate(m, 1, 1) == Slots{1 * 4 + 2});
    REQUIRE(m.take_step_ops().copy_on_write.empty());
  }
  SECTION("the parent appends") {
    REQUIRE(m.append_tokens(1, std::vector<TokenId>{8}).ok());
    REQUIRE(allocate(m, 1, 1) == Slots{2 * 4 + 2});
    REQUIRE(table(m, 1) == Blocks{0, 2});
    REQUIRE(table(m, 2) == Blocks{0, 1});
    REQUIRE(m.take_step_ops().copy_on_write == std::vector<BlockCopy>{{1, 2, 2}});
  }
  REQUIRE(m.stats().cow_copies == 1);
  REQUIRE(*m.device_pool().value()->ref_count(0) == 2);  // the full block stays shared
  require_valid(m);
}

// decode_in_place() skips the ref count of a block it found unshared while the pool's
// share epoch holds; a fork moves the epoch.
TEST_CASE("a block written in place is copied once a fork shares it") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(8)});
  admit(m, 1, iota_tokens(5));
  allocate(m, 1, 5);  // blocks 0 (full) 1 (1 token)
  end_step(m);
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{8}).ok());
  REQUIRE(allocate(m, 1, 1) == Slots{1 * 4 + 1});  // in place: block 1 is its own
  end_step(m);
  require_valid(m);
  REQUIRE(m.fork(1, 2).ok());
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{9}).ok());
  REQUIRE(allocate(m, 1, 1) == Slots{2 * 4 + 2});
  REQUIRE(m.take_step_ops().copy_on_write == std::vector<BlockCopy>{{1, 2, 2}});
  REQUIRE(table(m, 1) == Blocks{0, 2});
  REQUIRE(table(m, 2) == Blocks{0, 1});
  // Each now holds its partial block alone and writes it in place.
  REQUIRE(m.append_tokens(2, std::vector<TokenId>{7}).ok());
  REQUIRE(allocate(m, 2, 1) == Slots{1 * 4 + 2});
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{6}).ok());
  REQUIRE(allocate(m, 1, 1) == Slots{2 * 4 + 3});
  REQUIRE(m.take_step_ops().copy_on_write.empty());
  REQUIRE(m.stats().cow_copies == 1);
  require_valid(m);
}

TEST_CASE("full blocks are never copied") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(8)});
  admit(m, 1, iota_tokens(8));
  allocate(m, 1, 8);
  REQUIRE(m.fork(1, 2).ok());
  REQUIRE(m.append_tokens(2, std::vector<TokenId>{1}).ok());
  REQUIRE(allocate(m, 2, 1) == Slots{2 * 4});
  REQUIRE(m.take_step_ops().copy_on_write.empty());
  REQUIRE(m.stats().cow_copies == 0);
  require_valid(m);
}

TEST_CASE("a block named by a pending copy is released only after the copies are taken") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(4)});
  admit(m, 1, iota_tokens(2));
  allocate(m, 1, 2);  // block 0, partial
  end_step(m);
  REQUIRE(m.fork(1, 2).ok());
  REQUIRE(m.append_tokens(2, std::vector<TokenId>{5}).ok());
  allocate(m, 2, 1);        // copy 0 -> 1
  REQUIRE(m.free(1).ok());  // block 0 is the pending copy's source
  require_valid(m);
  REQUIRE(*m.device_pool().value()->ref_count(0) == 1);
  REQUIRE(m.take_step_ops().copy_on_write == std::vector<BlockCopy>{{0, 1, 2}});
  REQUIRE(*m.device_pool().value()->ref_count(0) == 0);
  require_valid(m);
}

TEST_CASE("recompute preemption frees the victim's blocks and calls the hooks") {
  RecordingHooks hooks;
  KvCacheManager m = make_manager(
      {.block_size = 2, .preemption_hooks = &hooks, .layer_groups = full_attention(4)});
  admit(m, 1, iota_tokens(4, 0), {.priority = 1});
  allocate(m, 1, 4);
  admit(m, 2, iota_tokens(3, 50), {.priority = 0});
  allocate(m, 2, 3);  // pool full
  end_step(m);
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{9}).ok());
  REQUIRE(m.allocate_slots(1, 1).status().code() == absl::StatusCode::kResourceExhausted);

  auto slots = m.allocate_slots_or_preempt(1, 1);
  REQUIRE(slots.ok());
  require_valid(m);
  REQUIRE(hooks.calls ==
          std::vector<std::pair<SeqId, PreemptionMode>>{{2, PreemptionMode::kRecompute}});
  REQUIRE(m.sequence(2)->state == SequenceState::kWaiting);
  REQUIRE(m.sequence(2)->num_computed_tokens == 0);
  REQUIRE(m.sequence(2)->tokens.size() == 3);
  REQUIRE(m.stats().preemptions_recompute == 1);
  // Its full block stayed cached: resuming hits it.
  REQUIRE(m.free(1).ok());
  REQUIRE(*m.match_prefix(2) == 2);
  require_valid(m);
}

TEST_CASE("the default victim is the lowest priority, then the latest arrival") {
  RecordingHooks hooks;
  KvCacheManager m = make_manager(
      {.block_size = 1, .preemption_hooks = &hooks, .layer_groups = full_attention(4)});
  admit(m, 10, iota_tokens(1), {.priority = 5});
  admit(m, 11, iota_tokens(1), {.priority = 0});
  admit(m, 12, iota_tokens(1), {.priority = 0});
  admit(m, 13, iota_tokens(1), {.priority = 9});
  for (SeqId id : {10, 11, 12, 13}) allocate(m, id, 1);
  end_step(m);
  REQUIRE(m.append_tokens(13, iota_tokens(3)).ok());
  REQUIRE(m.allocate_slots_or_preempt(13, 3).ok());
  require_valid(m);
  REQUIRE(hooks.calls ==
          std::vector<std::pair<SeqId, PreemptionMode>>{{12, PreemptionMode::kRecompute},
                                                        {11, PreemptionMode::kRecompute},
                                                        {10, PreemptionMode::kRecompute}});
}

TEST_CASE("a custom victim policy decides, and giving up leaves ResourceExhausted") {
  std::vector<SeqId> offered;
  KvCacheManager m = make_manager({.block_size = 1,
                                   .victim_policy = [&](std::span<const SequenceInfo> running,
                                                        SeqId) -> std::optional<Preemption> {
                                     for (const SequenceInfo& info : running)
                                       offered.push_back(info.id);
                                     return std::nullopt;
                                   },
                                   .layer_groups = full_attention(2)});
  admit(m, 1, iota_tokens(1));
  admit(m, 2, iota_tokens(1));
  allocate(m, 1, 1);
  allocate(m, 2, 1);
  end_step(m);
  REQUIRE(m.append_tokens(2, iota_tokens(1)).ok());
  const Snapshot before = snapshot(m, {1, 2});
  require_error(m.allocate_slots_or_preempt(2, 1).status(), absl::StatusCode::kResourceExhausted,
                "need 1 blocks, 0 free of 2");
  REQUIRE(offered == std::vector<SeqId>{1});
  REQUIRE(snapshot(m, {1, 2}) == before);
}

TEST_CASE("swap preemption moves blocks to the host pool and swap_in restores them") {
  RecordingHooks hooks;
  KvCacheManager m = make_manager({.block_size = 2,
                                   .preemption_mode = PreemptionMode::kSwap,
                                   .preemption_hooks = &hooks,
                                   .layer_groups = full_attention(6, 4)});
  admit(m, 1, iota_tokens(5, 0));
  allocate(m, 1, 5);  // blocks 0 1 2 (last holds 1 token)
  admit(m, 2, iota_tokens(6, 50));
  allocate(m, 2, 6);  // blocks 3 4 5
  const Blocks device_before = table(m, 1);
  end_step(m);

  REQUIRE(m.append_tokens(2, iota_tokens(1)).ok());
  REQUIRE(m.allocate_slots_or_preempt(2, 1).ok());  // victim: seq 1, latest arrival? no: seq 1
  require_valid(m);
  REQUIRE(hooks.calls == std::vector<std::pair<SeqId, PreemptionMode>>{{1, PreemptionMode::kSwap}});
  REQUIRE(m.sequence(1)->state == SequenceState::kSwapped);
  const Blocks host(m.sequence(1)->host_blocks.begin(), m.sequence(1)->host_blocks.end());
  REQUIRE(host == Blocks{0, 1, 2});
  REQUIRE(m.stats().used_host_blocks == 3);
  require_error(m.allocate_slots(1, 0).status(), absl::StatusCode::kFailedPrecondition, "swapped");

  StepOps out = m.take_step_ops();
  REQUIRE(out.swap_out == std::vector<BlockCopy>{{device_before[0], 0, 2},
                                                 {device_before[1], 1, 2},
                                                 {device_before[2], 2, 1}});
  REQUIRE(out.swap_in.empty());

  // Device blocks are short until sequence 2 finishes: swap_in fails cleanly.
  const Snapshot before = snapshot(m, {1, 2});
  require_error(m.swap_in(1), absl::StatusCode::kResourceExhausted, "need 3 blocks");
  REQUIRE(snapshot(m, {1, 2}) == before);

  REQUIRE(m.free(2).ok());
  REQUIRE(m.swap_in(1).ok());
  require_valid(m);
  const Blocks device_after = table(m, 1);
  StepOps in = m.take_step_ops();
  REQUIRE(in.swap_in == std::vector<BlockCopy>{{0, device_after[0], 2},
                                               {1, device_after[1], 2},
                                               {2, device_after[2], 1}});
  REQUIRE(m.sequence(1)->state == SequenceState::kRunning);
  REQUIRE(m.sequence(1)->num_computed_tokens == 5);
  REQUIRE(m.sequence(1)->tokens.size() == 5);
  REQUIRE(m.stats().used_host_blocks == 0);
  REQUIRE(m.stats().preemptions_swap == 1);
  REQUIRE(m.stats().blocks_swapped_out == 3);
  REQUIRE(m.stats().blocks_swapped_in == 3);
  // It runs on: the next token lands after the restored ones.
  REQUIRE(m.append_tokens(1, iota_tokens(1)).ok());
  REQUIRE(allocate(m, 1, 1) == Slots{int64_t{device_after[2]} * 2 + 1});
}

TEST_CASE("swap mode falls back to recompute when the host pool is too small") {
  RecordingHooks hooks;
  KvCacheManager m = make_manager({.block_size = 2,
                                   .preemption_mode = PreemptionMode::kSwap,
                                   .preemption_hooks = &hooks,
                                   .layer_groups = full_attention(4, 1)});
  admit(m, 1, iota_tokens(4));
  allocate(m, 1, 4);
  admit(m, 2, iota_tokens(4, 9));
  allocate(m, 2, 4);
  end_step(m);
  REQUIRE(m.append_tokens(1, iota_tokens(1)).ok());
  REQUIRE(m.allocate_slots_or_preempt(1, 1).ok());
  REQUIRE(hooks.calls ==
          std::vector<std::pair<SeqId, PreemptionMode>>{{2, PreemptionMode::kRecompute}});
  end_step(m);
  require_error(m.preempt(1, PreemptionMode::kSwap), absl::StatusCode::kResourceExhausted,
                "need 3 host blocks, 1 free of 1");
  require_valid(m);
}

TEST_CASE("a sequence scheduled in this step is not preempted before its K/V is written") {
  RecordingHooks hooks;
  KvCacheManager m = make_manager({.block_size = 2,
                                   .preemption_mode = PreemptionMode::kSwap,
                                   .preemption_hooks = &hooks,
                                   .layer_groups = full_attention(4, 4)});
  admit(m, 1, iota_tokens(4));
  allocate(m, 1, 4);
  admit(m, 2, iota_tokens(4, 50));
  allocate(m, 2, 4);  // both scheduled in this step; the pool is full
  REQUIRE(m.append_tokens(2, iota_tokens(1)).ok());
  const Snapshot before = snapshot(m, {1, 2});
  require_error(m.preempt(1, PreemptionMode::kSwap), absl::StatusCode::kFailedPrecondition,
                "scheduled in this step");
  require_error(m.preempt(1, PreemptionMode::kRecompute), absl::StatusCode::kFailedPrecondition,
                "scheduled in this step");
  require_error(m.allocate_slots_or_preempt(2, 1).status(), absl::StatusCode::kResourceExhausted,
                "need 1 blocks, 0 free of 4");
  REQUIRE(hooks.calls.empty());
  REQUIRE(snapshot(m, {1, 2}) == before);
  end_step(m);  // the step ran: both may be preempted now
  REQUIRE(m.allocate_slots_or_preempt(2, 1).ok());
  REQUIRE(hooks.calls == std::vector<std::pair<SeqId, PreemptionMode>>{{1, PreemptionMode::kSwap}});
  // A sequence swapped in during this step is not swapped out again before the swap-in ran.
  end_step(m);
  REQUIRE(m.free(2).ok());
  REQUIRE(m.swap_in(1).ok());
  require_error(m.preempt(1, PreemptionMode::kSwap), absl::StatusCode::kFailedPrecondition,
                "scheduled in this step");
  require_valid(m);
}

TEST_CASE("a prefix hit on blocks filled in this step counts as scheduled in this step") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(8, 4)});
  admit(m, 1, iota_tokens(8));
  allocate(m, 1, 8);  // blocks 0 and 1, indexed at once, written by this step's kernels
  admit(m, 2, iota_tokens(9));
  REQUIRE(*m.match_prefix(2) == 8);
  allocate(m, 2, 0);  // running without new tokens
  require_error(m.preempt(2, PreemptionMode::kSwap), absl::StatusCode::kFailedPrecondition,
                "scheduled in this step");
  end_step(m);
  REQUIRE(m.preempt(2, PreemptionMode::kSwap).ok());
  REQUIRE(m.take_step_ops().swap_out == std::vector<BlockCopy>{{0, 0, 4}, {1, 1, 4}});
  require_valid(m);
}

TEST_CASE("copy-on-write never copies tokens this step has not written") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(8)});
  admit(m, 1, iota_tokens(6));
  allocate(m, 1, 6);
  REQUIRE(m.fork(1, 2).ok());  // the child shares the parent's unwritten tokens
  REQUIRE(m.append_tokens(2, iota_tokens(1)).ok());
  const Snapshot before = snapshot(m, {1, 2});
  require_error(m.allocate_slots(2, 1).status(), absl::StatusCode::kFailedPrecondition,
                "copy-on-write of block 1 would copy tokens whose K/V this step has not written");
  REQUIRE(snapshot(m, {1, 2}) == before);
  end_step(m);
  REQUIRE(allocate(m, 2, 1) == Slots{2 * 4 + 2});
  REQUIRE(m.take_step_ops().copy_on_write == std::vector<BlockCopy>{{1, 2, 2}});
}

TEST_CASE("freeing a sequence in the step that filled its blocks keeps them out of the cache") {
  KvEventBuffer events;
  KvCacheManager m =
      make_manager({.block_size = 2, .event_sink = &events, .layer_groups = full_attention(8)});
  admit(m, 1, iota_tokens(4));
  allocate(m, 1, 2);
  end_step(m);                                // block 0 is written
  REQUIRE(allocate(m, 1, 2) == Slots{2, 3});  // block 1 is filled in this step
  REQUIRE(m.free(1).ok());                    // aborted before the step ran
  require_valid(m);
  REQUIRE(*m.device_pool().value()->is_cached(0));
  REQUIRE_FALSE(*m.device_pool().value()->is_cached(1));
  const std::vector<KvEvent> seen = events.take();
  REQUIRE(std::holds_alternative<BlockRemoved>(seen.back()));
  admit(m, 2, iota_tokens(5));
  REQUIRE(*m.match_prefix(2) == 2);
}

TEST_CASE("a lookahead whose block count overflows int32 is refused") {
  KvCacheManager m = make_manager({.block_size = 1, .layer_groups = full_attention(4)});
  admit(m, 1, iota_tokens(1));
  const Snapshot before = snapshot(m, {1});
  require_error(m.allocate_slots(1, 1, std::numeric_limits<int32_t>::max()).status(),
                absl::StatusCode::kInvalidArgument, "slots need 2147483648 blocks; the pool has 4");
  REQUIRE(snapshot(m, {1}) == before);
  require_valid(m);
}

TEST_CASE("block tables and CSR for a batch") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(16)});
  admit(m, 1, iota_tokens(9, 0));
  allocate(m, 1, 9);  // 0 1 2
  admit(m, 2, iota_tokens(4, 50));
  allocate(m, 2, 4, /*lookahead=*/4);  // 3 (4: lookahead, not in the table)
  admit(m, 3, iota_tokens(1, 80));
  allocate(m, 3, 1);  // 5
  const std::vector<SeqId> batch = {2, 1, 3};
  BlockTables tables;
  REQUIRE(m.build_block_tables(batch, &tables).ok());
  REQUIRE(tables.num_seqs == 3);
  REQUIRE(tables.max_blocks == 3);
  REQUIRE(tables.block_size == 4);
  REQUIRE(tables.block_table == std::vector<int32_t>{3, kPaddingBlock, kPaddingBlock,  //
                                                     0, 1, 2,                          //
                                                     5, kPaddingBlock, kPaddingBlock});
  REQUIRE(tables.context_lens == std::vector<int32_t>{4, 9, 1});
  REQUIRE(tables.indptr == std::vector<int32_t>{0, 1, 4, 5});
  REQUIRE(tables.indices == std::vector<int32_t>{3, 0, 1, 2, 5});
  REQUIRE(tables.last_page_len == std::vector<int32_t>{4, 1, 1});
  const BlockTableView view = tables.padded();
  REQUIRE(view.block_table == tables.block_table.data());
  REQUIRE(view.max_blocks == 3);

  // Rebuilding a smaller batch reuses the buffers.
  const int32_t* data = tables.block_table.data();
  REQUIRE(m.build_block_tables(std::vector<SeqId>{3}, &tables).ok());
  REQUIRE(tables.block_table.data() == data);
  REQUIRE(tables.block_table == std::vector<int32_t>{5});

  // Caller-provided buffers: too small is refused before anything is written.
  std::vector<int32_t> small(5, -7), lens(3, -7);
  require_error(m.write_block_tables(batch, 3, small, lens), absl::StatusCode::kInvalidArgument,
                "need 9 table entries");
  REQUIRE(small == std::vector<int32_t>(5, -7));
  std::vector<int32_t> narrow(6), lens2(3);
  require_error(m.write_block_tables(batch, 2, narrow, lens2), absl::StatusCode::kInvalidArgument,
                "sequence 1 needs 3 entries, more than max_blocks 2");
  std::vector<int32_t> indptr(4), indices(4), last(3);
  require_error(m.write_csr_block_tables(batch, indptr, indices, last),
                absl::StatusCode::kInvalidArgument, "indices[5]");
}

TEST_CASE("the watermark holds back admissions but not running sequences") {
  KvCacheManager m =
      make_manager({.block_size = 2, .watermark_blocks = 1, .layer_groups = full_attention(4)});
  admit(m, 1, iota_tokens(4));
  allocate(m, 1, 4);  // 2 blocks, 2 free
  admit(m, 2, iota_tokens(3));
  require_error(m.allocate_slots(2, 3).status(), absl::StatusCode::kResourceExhausted,
                "need 2 blocks + watermark 1, 2 free of 4");
  REQUIRE(m.append_tokens(1, iota_tokens(3)).ok());
  REQUIRE(allocate(m, 1, 3).size() == 3);  // running: may use the last blocks
  REQUIRE(m.stats().free_blocks == 0);
}

TEST_CASE("bad input names the problem and changes nothing") {
  KvCacheManager m =
      make_manager({.block_size = 4, .max_model_len = 12, .layer_groups = full_attention(4, 2)});
  admit(m, 1, iota_tokens(5));
  allocate(m, 1, 5);
  admit(m, 2, iota_tokens(2));
  const std::vector<SeqId> ids = {1, 2, 3};
  const Snapshot before = snapshot(m, ids);

  require_error(m.add_sequence(1, iota_tokens(2)), absl::StatusCode::kAlreadyExists, "sequence 1");
  require_error(m.add_sequence(3, {}), absl::StatusCode::kInvalidArgument, "empty prompt");
  require_error(m.add_sequence(3, iota_tokens(13)), absl::StatusCode::kInvalidArgument,
                "13 tokens exceeds max_model_len 12");
  {
    KvCacheManager small = make_manager({.block_size = 4, .layer_groups = full_attention(2)});
    require_error(small.add_sequence(3, iota_tokens(9)), absl::StatusCode::kInvalidArgument,
                  "needs 3 blocks of 4 tokens; the pool has 2");
  }
  require_error(m.append_tokens(3, iota_tokens(1)), absl::StatusCode::kNotFound,
                "unknown sequence 3");
  require_error(m.append_tokens(1, iota_tokens(8)), absl::StatusCode::kInvalidArgument,
                "5 + 8 tokens exceeds max_model_len 12");
  require_error(m.allocate_slots(3, 1).status(), absl::StatusCode::kNotFound, "unknown sequence 3");
  require_error(m.allocate_slots(1, -1).status(), absl::StatusCode::kInvalidArgument,
                "num_new_tokens -1");
  require_error(m.allocate_slots(1, 1, -2).status(), absl::StatusCode::kInvalidArgument,
                "num_lookahead -2");
  require_error(m.allocate_slots(1, 1).status(), absl::StatusCode::kInvalidArgument,
                "5 computed + 1 new tokens exceeds the sequence's 5 tokens");
  require_error(m.allocate_slots(1, 0, 12).status(), absl::StatusCode::kInvalidArgument,
                "17 slots need 5 blocks; the pool has 4");
  require_error(m.allocate_slots_or_preempt(3, 1).status(), absl::StatusCode::kNotFound,
                "unknown sequence 3");
  require_error(m.match_prefix(3).status(), absl::StatusCode::kNotFound, "unknown sequence 3");
  require_error(m.match_prefix(1).status(), absl::StatusCode::kFailedPrecondition, "running");
  require_error(m.fork(3, 4), absl::StatusCode::kNotFound, "unknown sequence 3");
  require_error(m.fork(1, 2), absl::StatusCode::kAlreadyExists, "child sequence 2 exists");
  require_error(m.free(3), absl::StatusCode::kNotFound, "unknown sequence 3");
  require_error(m.preempt(3, PreemptionMode::kRecompute), absl::StatusCode::kNotFound,
                "unknown sequence 3");
  require_error(m.preempt(2, PreemptionMode::kRecompute), absl::StatusCode::kFailedPrecondition,
                "waiting, not running");
  require_error(m.swap_in(1), absl::StatusCode::kFailedPrecondition, "running, not swapped");
  require_error(m.swap_in(3), absl::StatusCode::kNotFound, "unknown sequence 3");
  require_error(m.sequence(3).status(), absl::StatusCode::kNotFound, "unknown sequence 3");
  BlockTables tables;
  require_error(m.build_block_tables(std::vector<SeqId>{1, 3}, &tables),
                absl::StatusCode::kNotFound, "unknown sequence 3");
  require_error(m.build_block_tables(std::vector<SeqId>{2}, &tables),
                absl::StatusCode::kFailedPrecondition, "sequence 2 is not running");
  REQUIRE(snapshot(m, ids) == before);
  require_valid(m);
}

TEST_CASE("a failed allocation changes nothing") {
  KvCacheManager m = make_manager({.block_size = 2, .layer_groups = full_attention(3)});
  admit(m, 1, iota_tokens(4));
  allocate(m, 1, 4);
  REQUIRE(m.fork(1, 2).ok());
  admit(m, 3, iota_tokens(5, 40));
  const Snapshot before = snapshot(m, {1, 2, 3});
  require_error(m.allocate_slots(3, 5).status(), absl::StatusCode::kResourceExhausted,
                "need 3 blocks, 1 free of 3");
  REQUIRE(snapshot(m, {1, 2, 3}) == before);
  require_valid(m);
}

TEST_CASE("one call's newly filled blocks emit one BlockStored, the next one names its parent") {
  KvEventBuffer events;
  KvCacheManager m =
      make_manager({.block_size = 2, .event_sink = &events, .layer_groups = full_attention(4)});
  admit(m, 1, std::vector<TokenId>{1, 2, 3, 4, 5, 6, 7}, {.extra_keys = {77}});
  allocate(m, 1, 5);
  std::vector<KvEvent> seen = events.take();
  REQUIRE(seen.size() == 1);
  const auto first = std::get<BlockStored>(seen[0]);
  REQUIRE(first.block_hashes.size() == 2);
  REQUIRE(first.token_ids == std::vector<TokenId>{1, 2, 3, 4});
  REQUIRE(first.extra_keys == std::vector<uint64_t>{77});
  REQUIRE_FALSE(first.parent_hash.has_value());
  REQUIRE(*m.device_pool().value()->cached_hash(table(m, 1)[1]) == first.block_hashes.at(1));
  allocate(m, 1, 2);
  seen = events.take();
  REQUIRE(seen.size() == 1);
  const auto& second = std::get<BlockStored>(seen[0]);
  REQUIRE(second.token_ids == std::vector<TokenId>{5, 6});
  REQUIRE(second.parent_hash == first.block_hashes.at(1));

  m.reset_prefix_cache();
  require_valid(m);
  REQUIRE(std::holds_alternative<AllBlocksCleared>(events.take().at(0)));
  admit(m, 2, std::vector<TokenId>{1, 2, 3, 4, 5}, {.extra_keys = {77}});
  REQUIRE(*m.match_prefix(2) == 0);
}

TEST_CASE("prefix caching off never matches and never hashes") {
  KvCacheManager m = make_manager(
      {.block_size = 2, .enable_prefix_caching = false, .layer_groups = full_attention(8)});
  admit(m, 1, iota_tokens(6));
  allocate(m, 1, 6);
  REQUIRE(m.free(1).ok());
  admit(m, 2, iota_tokens(6));
  REQUIRE(*m.match_prefix(2) == 0);
  REQUIRE(m.stats().cached_free_blocks == 0);
  require_valid(m);
}

// --- issue 11: watermark, reset, limits, claim release, duplicates ------------------------

TEST_CASE("a sequence preempted after growing past the watermark comes back alone") {
  // Issue 11 item 1: the re-admission was refused forever ("need 1 blocks + watermark 1,
  // 1 free of 4"), by allocate_slots and allocate_slots_or_preempt alike.
  KvCacheManager m =
      make_manager({.block_size = 4, .watermark_blocks = 1, .layer_groups = full_attention(4)});
  admit(m, 1, iota_tokens(8));
  allocate(m, 1, 8);  // blocks 0 1
  end_step(m);
  REQUIRE(m.append_tokens(1, iota_tokens(8, 200)).ok());
  allocate(m, 1, 8);  // blocks 2 3: running, it may use the watermark
  end_step(m);
  REQUIRE(m.preempt(1, PreemptionMode::kRecompute).ok());
  REQUIRE(*m.match_prefix(1) == 12);
  REQUIRE(allocate(m, 1, 4) == Slots{12, 13, 14, 15});  // nothing else runs: no watermark
  REQUIRE(table(m, 1) == Blocks{0, 1, 2, 3});
  end_step(m);

  // With another sequence running, the watermark holds the admission back again, and
  // allocate_slots_or_preempt makes room by preempting it.
  RecordingHooks hooks;
  KvCacheManager n = make_manager({.block_size = 4,
                                   .watermark_blocks = 1,
                                   .preemption_hooks = &hooks,
                                   .layer_groups = full_attention(4)});
  admit(n, 1, iota_tokens(4));
  allocate(n, 1, 4);  // block 0
  admit(n, 2, iota_tokens(12, 500));
  end_step(n);
  require_error(n.allocate_slots(2, 12).status(), absl::StatusCode::kResourceExhausted,
                "need 3 blocks + watermark 1, 3 free of 4");
  REQUIRE(n.allocate_slots_or_preempt(2, 12).ok());
  REQUIRE(hooks.calls ==
          std::vector<std::pair<SeqId, PreemptionMode>>{{1, PreemptionMode::kRecompute}});
  REQUIRE(table(n, 2) == Blocks{1, 2, 3});
  require_valid(n);
}

TEST_CASE("add_sequence accepts a prompt as large as the pool, whatever the watermark") {
  KvCacheManager m =
      make_manager({.block_size = 4, .watermark_blocks = 2, .layer_groups = full_attention(4)});
  admit(m, 1, iota_tokens(16));
  REQUIRE(allocate(m, 1, 16).size() == 16);  // alone: the whole pool
  require_error(m.add_sequence(2, iota_tokens(17)), absl::StatusCode::kInvalidArgument,
                "add_sequence(seq 2): prompt of 17 tokens needs 5 blocks of 4 tokens; the pool "
                "has 4. Raise num_blocks or shorten the prompt");
}

TEST_CASE("no K/V computed before reset_prefix_cache() is shared after it") {
  // Issue 11 item 2, as reported: a half-filled block indexed when it fills later.
  KvEventBuffer events;
  KvCacheManager m =
      make_manager({.block_size = 4, .event_sink = &events, .layer_groups = full_attention(8)});
  admit(m, 1, std::vector<TokenId>{100, 101});
  allocate(m, 1, 2);
  end_step(m);
  m.reset_prefix_cache();
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{102, 103}).ok());
  allocate(m, 1, 2);  // block 0 fills: computed partly before the reset
  end_step(m);
  REQUIRE(m.append_tokens(1, iota_tokens(4, 104)).ok());
  allocate(m, 1, 4);  // block 1 fills after the reset, after pre-reset K/V
  end_step(m);
  admit(m, 2, iota_tokens(9, 100));
  REQUIRE(*m.match_prefix(2) == 0);
  const std::vector<KvEvent> seen = events.take();
  REQUIRE(seen.size() == 1);  // AllBlocksCleared only: no BlockStored after it
  REQUIRE(std::holds_alternative<AllBlocksCleared>(seen[0]));
  REQUIRE(m.stats().cached_free_blocks + m.device_pool().value()->stats().cached_blocks == 0);

  // Recomputed from scratch, the sequence is cached again.
  REQUIRE(m.preempt(1, PreemptionMode::kRecompute).ok());
  REQUIRE(*m.match_prefix(1) == 0);
  allocate(m, 1, 8);
  end_step(m);
  REQUIRE(m.free(2).ok());
  admit(m, 3, iota_tokens(9, 100));
  REQUIRE(*m.match_prefix(3) == 8);
  require_valid(m);
}

TEST_CASE("a sequence swapped out before a reset is not re-indexed by swap_in") {
  KvEventBuffer events;
  KvCacheManager m =
      make_manager({.block_size = 2, .event_sink = &events, .layer_groups = full_attention(4, 4)});
  admit(m, 1, iota_tokens(4));
  allocate(m, 1, 4);
  end_step(m);
  REQUIRE(m.preempt(1, PreemptionMode::kSwap).ok());
  end_step(m);
  m.reset_prefix_cache();
  events.take();
  REQUIRE(m.swap_in(1).ok());
  end_step(m);
  REQUIRE(events.take().empty());
  REQUIRE(m.fork(1, 2).ok());  // a fork inherits the rule
  REQUIRE(m.append_tokens(2, iota_tokens(2, 9)).ok());
  allocate(m, 2, 2);
  end_step(m);
  REQUIRE(events.take().empty());
  admit(m, 3, iota_tokens(5));
  REQUIRE(*m.match_prefix(3) == 0);
  require_valid(m);
}

TEST_CASE("KvCacheManager::create rejects pools beyond BlockPool's limits") {
  require_error(KvCacheManager::create({.layer_groups = full_attention(INT32_MAX)}).status(),
                absl::StatusCode::kInvalidArgument,
                "num_blocks 2147483647 must be in [0, 16777216]");
  require_error(
      KvCacheManager::create({.block_size = INT32_MAX, .layer_groups = full_attention(4)}).status(),
      absl::StatusCode::kInvalidArgument, "block_size 2147483647 must be in [1, 65536]");
  require_error(KvCacheManager::create({.layer_groups = full_attention(4, INT32_MAX)}).status(),
                absl::StatusCode::kInvalidArgument,
                "num_blocks 2147483647 must be in [0, 16777216]");
}

TEST_CASE("build_block_tables refuses a null output") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(4)});
  admit(m, 1, iota_tokens(2));
  allocate(m, 1, 2);
  require_error(m.build_block_tables(std::vector<SeqId>{1}, nullptr),
                absl::StatusCode::kInvalidArgument, "build_block_tables: out is null");
}

TEST_CASE("a waiting sequence's claim is released before a running sequence is preempted") {
  // Issue 11 item 8: the claim pinned the blocks the running sequence needed, and waiting
  // sequences are no preemption candidates, so allocate_slots_or_preempt failed.
  RecordingHooks hooks;
  KvCacheManager m = make_manager(
      {.block_size = 2, .preemption_hooks = &hooks, .layer_groups = full_attention(4)});
  admit(m, 1, iota_tokens(6));
  allocate(m, 1, 6);  // blocks 0 1 2, full and cached
  end_step(m);
  REQUIRE(m.free(1).ok());
  admit(m, 2, iota_tokens(7));
  REQUIRE(*m.match_prefix(2) == 6);  // claims 0 1 2, waiting
  admit(m, 3, iota_tokens(2, 50));
  allocate(m, 3, 2);  // block 3
  end_step(m);
  REQUIRE(m.append_tokens(3, iota_tokens(1)).ok());
  require_error(m.allocate_slots(3, 1).status(), absl::StatusCode::kResourceExhausted,
                "need 1 blocks, 0 free of 4");
  const auto slots = m.allocate_slots_or_preempt(3, 1);
  REQUIRE(slots.ok());
  REQUIRE(Slots(slots->begin(), slots->end()) == Slots{2 * 2});  // block 2, evicted
  require_valid(m);
  REQUIRE(hooks.calls.empty());
  REQUIRE(hooks.claims == std::vector<SeqId>{2});
  REQUIRE(m.sequence(2)->state == SequenceState::kWaiting);
  REQUIRE(m.sequence(2)->num_computed_tokens == 0);
  REQUIRE(table(m, 2).empty());
  REQUIRE(m.stats().claims_released == 1);
  REQUIRE(m.stats().preemptions_recompute == 0);
  REQUIRE(*m.match_prefix(2) == 4);  // blocks 0 1 are still cached
}

TEST_CASE("release_claim gives a waiting sequence's prefix back") {
  KvCacheManager m = make_manager({.block_size = 2, .layer_groups = full_attention(4)});
  admit(m, 1, iota_tokens(5));
  allocate(m, 1, 5);  // blocks 0 1 2
  end_step(m);
  REQUIRE(m.free(1).ok());
  admit(m, 2, iota_tokens(5));
  REQUIRE(*m.match_prefix(2) == 4);
  REQUIRE(m.stats().free_blocks == 2);
  REQUIRE(m.release_claim(2).ok());
  require_valid(m);
  REQUIRE(m.stats().free_blocks == 4);
  REQUIRE(m.stats().cached_free_blocks == 2);
  REQUIRE(m.device_pool().value()->free_queue_order() == Blocks{2, 3, 1, 0});
  REQUIRE(m.release_claim(2).ok());  // no claim: unchanged
  REQUIRE(m.stats().claims_released == 1);
  REQUIRE(*m.match_prefix(2) == 4);  // may claim again
  allocate(m, 2, 1);
  require_error(m.release_claim(2), absl::StatusCode::kFailedPrecondition,
                "release_claim(seq 2): sequence is running; only a waiting sequence holds a claim");
  require_error(m.release_claim(9), absl::StatusCode::kNotFound, "unknown sequence 9");
}

TEST_CASE("a recomputed duplicate keeps a block-aligned prompt cached when the original goes") {
  // Issue 11 item 9: the prompt's last block is recomputed (its last token must be), into a
  // copy of a cached block that was never indexed; evicting the original lost the content.
  KvEventBuffer events;
  KvCacheManager m =
      make_manager({.block_size = 4, .event_sink = &events, .layer_groups = full_attention(4)});
  admit(m, 1, iota_tokens(8));
  allocate(m, 1, 8);  // blocks 0 1
  end_step(m);
  admit(m, 2, iota_tokens(8));
  REQUIRE(*m.match_prefix(2) == 4);
  allocate(m, 2, 4);  // block 2: a copy of block 1, standing by
  end_step(m);
  REQUIRE(table(m, 2) == Blocks{0, 2});
  REQUIRE(m.device_pool().value()->stats().cached_blocks == 3);
  REQUIRE(m.free(1).ok());  // block 1 goes to the tail; the free queue is 3 1
  events.take();
  admit(m, 3, iota_tokens(8, 900));
  allocate(m, 3, 8);  // blocks 3 and 1: the original is evicted
  REQUIRE(table(m, 3) == Blocks{3, 1});
  for (const KvEvent& e : events.take()) REQUIRE_FALSE(std::holds_alternative<BlockRemoved>(e));
  end_step(m);
  REQUIRE(m.free(2).ok());
  admit(m, 4, iota_tokens(9));
  REQUIRE(*m.match_prefix(4) == 8);
  REQUIRE(table(m, 4) == Blocks{0, 2});
  require_valid(m);
}

}  // namespace
}  // namespace pagedkv
