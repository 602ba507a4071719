// Tests of KvCacheManager's state groups (AttentionKind::kState): a state slot per started
// sequence, checkpoint saves at the prompt's end and at branch points, restores on prefix
// hits, forks, preemption, the order of the ops within a step and the checkpoints'
// eviction classes. Exact values are worked out in the comments: a fresh pool hands out
// its clean blocks (slots) in id order, and freed clean ones go back to the head of the
// free queue.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/kv_cache_manager.h"
#include "support/manager_test_util.h"
#include "support/sanitizers.h"
#include "support/state_ops.h"

namespace pagedkv {
namespace {

using namespace pagedkv::testing;  // NOLINT: the shared test helpers

constexpr int32_t kFull = 0;  // group indices of the managers below
constexpr int32_t kState = 1;

// A full-attention group of `blocks` 4-token blocks and a state group of `slots` slots.
KvCacheManager with_state(int32_t blocks, int32_t slots, KvCacheManager::Options options = {}) {
  options.block_size = 4;
  options.layer_groups = {
      {.kind = AttentionKind::kFull, .num_blocks = blocks, .num_host_blocks = 8},
      {.kind = AttentionKind::kState, .num_blocks = slots, .num_host_blocks = 2}};
  return make_manager(std::move(options));
}

// Tokens first, first + 1, ... of `n` tokens.
std::vector<TokenId> run(TokenId first, int n) { return iota_tokens(n, first); }

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The state slot of a running sequence, as a kernel gets it.
int32_t state_slot(const KvCacheManager& m, SeqId seq) {
  int32_t slot = -1;
  const SeqId seqs[] = {seq};
  REQUIRE(m.write_state_slots(seqs, kState, {&slot, 1}).ok());
  return slot;
}

// The slots of any sequence's state group table: one once it has started or claimed.
Blocks state_table(const KvCacheManager& m, SeqId seq) {
  auto view = m.sequence(seq, kState);
  REQUIRE(view.ok());
  return Blocks(view->block_table.begin(), view->block_table.end());
}

TEST_CASE("a sequence takes a state slot at admission and saves its prompt's end", "[state]") {
  KvCacheManager m = with_state(16, 8);
  admit(m, 1, run(100, 10));
  allocate(m, 1, 10);
  // Slot 0 for the sequence; its 10-token prompt ends its last full block at 8 tokens, so
  // slot 1 takes the checkpoint there. No slot mapping in a state group.
  CHECK(state_slot(m, 1) == 0);
  const absl::StatusOr<std::span<const int64_t>> state_slots = m.slot_mapping(kState);
  REQUIRE(state_slots.ok());
  CHECK(state_slots->size() == 10);
  for (const int64_t s : *state_slots) CHECK(s == -1);
  CHECK(m.slot_mapping(kFull)->front() == 0);
  BlockTables tables;
  const SeqId seqs[] = {1};
  require_error(m.build_block_tables(seqs, &tables, kState), absl::StatusCode::kInvalidArgument,
                "state group");
  const StepOps ops = m.take_step_ops();
  CHECK(ops.save_state ==
        std::vector<StateSave>{{.seq = 1, .position = 8, .src = 0, .dst = 1, .group = kState}});
  CHECK(ops.copy_state.empty());
  CHECK(m.group_stats(kState)->checkpoints_saved == 1);
  CHECK(m.group_stats(kState)->used_blocks == 1);         // the checkpoint is free once saved
  CHECK(m.group_stats(kState)->cached_free_blocks == 1);  // and cached
  require_valid(m);
}

TEST_CASE("a prefix hit ends at a checkpoint and restores it", "[state]") {
  KvCacheManager m = with_state(16, 8);
  admit(m, 1, run(100, 10));
  allocate(m, 1, 10);
  end_step(m);  // the checkpoint at 8 tokens is saved by this step's computation
  REQUIRE(m.free(1).ok());
  // The same 8 tokens, then others: the full group holds blocks 0 and 1, the state group
  // a checkpoint after them.
  admit(m, 2, concat(run(100, 8), run(200, 4)));
  CHECK(*m.match_prefix(2) == 8);
  // free(1) returned slot 0 clean to the head of the free queue: the restore takes it.
  CHECK(state_table(m, 2) == Blocks{0});
  allocate(m, 2, 4);
  const StepOps ops = m.take_step_ops();
  CHECK(ops.copy_state ==
        std::vector<BlockCopy>{{.src = 1, .dst = 0, .num_tokens = 4, .group = kState}});
  CHECK(m.group_stats(kState)->checkpoints_restored == 1);
  CHECK(m.stats().prefix_hit_tokens == 8);
  require_valid(m);
}

TEST_CASE("checkpoints are events of the state group: stored when saved, removed when evicted",
          "[state]") {
  KvEventBuffer events;
  KvCacheManager m = with_state(16, 3, {.event_sink = &events});
  admit(m, 1, run(100, 10));
  allocate(m, 1, 10);
  end_step(m);
  REQUIRE(m.free(1).ok());
  // The full group stores blocks 0 and 1; the state group the checkpoint after block 1:
  // its hash, block 0's as parent, block 1's tokens, and the group (1, state).
  std::vector<KvEvent> got = events.take();
  REQUIRE(got.size() == 2);
  const auto& full = std::get<BlockStored>(got[0]);
  const auto& checkpoint = std::get<BlockStored>(got[1]);
  CHECK(full.group == EventGroup{.index = kFull, .kind = AttentionKind::kFull});
  REQUIRE(full.block_hashes.size() == 2);
  CHECK(checkpoint.group == EventGroup{.index = kState, .kind = AttentionKind::kState});
  CHECK(checkpoint.block_hashes == std::vector<BlockHash>{full.block_hashes[1]});
  CHECK(checkpoint.parent_hash == full.block_hashes[0]);
  CHECK(checkpoint.token_ids == run(104, 4));
  // Two more prompts of their own take the 3 slots (a running slot and a checkpoint
  // each): the first checkpoint, least recently used, is evicted.
  for (const SeqId seq : {2, 3}) {
    admit(m, seq, run(100 * seq + 1000, 8));
    allocate(m, seq, 8);
    end_step(m);
    REQUIRE(m.free(seq).ok());
  }
  bool removed = false;
  for (const KvEvent& e : events.take()) {
    const auto* r = std::get_if<BlockRemoved>(&e);
    if (r == nullptr || r->group->index != kState) continue;
    CHECK(r->block_hashes == std::vector<BlockHash>{full.block_hashes[1]});
    removed = true;
  }
  CHECK(removed);
  require_valid(m);
}

TEST_CASE("a checkpoint saved in this step is restored only after it", "[state]") {
  KvCacheManager m = with_state(16, 8);
  admit(m, 1, run(100, 10));
  allocate(m, 1, 10);
  // Same step: the blocks are shared (their K/V is written before attention reads it),
  // the state is not: its save runs during this step's computation, after the copies.
  admit(m, 2, concat(run(100, 8), run(200, 4)));
  CHECK(*m.match_prefix(2) == 0);
  REQUIRE(m.release_claim(2).ok());
  end_step(m);
  CHECK(*m.match_prefix(2) == 8);
  require_valid(m);
}

TEST_CASE("a prompt that branches from a cached one saves a checkpoint at the branch", "[state]") {
  KvCacheManager m = with_state(32, 8);
  const std::vector<TokenId> system = run(100, 8);  // two blocks
  // Turn one: the prompt's end, 12 tokens, is its only checkpoint.
  admit(m, 1, concat(system, run(200, 6)));
  allocate(m, 1, 14);
  CHECK(m.take_step_ops().save_state.size() == 1);
  REQUIRE(m.free(1).ok());
  // Another user after the same system prompt: the full group holds its two blocks, but no
  // checkpoint ends there, so no hit; the branch point (8 tokens) and the prompt's end (12)
  // are saved.
  admit(m, 2, concat(system, run(300, 6)));
  CHECK(*m.match_prefix(2) == 0);
  allocate(m, 2, 14);
  const StepOps ops = m.take_step_ops();
  REQUIRE(ops.save_state.size() == 2);
  CHECK(ops.save_state[0].position == 8);
  CHECK(ops.save_state[1].position == 12);
  REQUIRE(m.free(2).ok());
  // A third user hits the system prompt.
  admit(m, 3, concat(system, run(400, 6)));
  CHECK(*m.match_prefix(3) == 8);
  require_valid(m);
}

TEST_CASE("a fork copies its parent's state slot once the parent's state is computed", "[state]") {
  KvCacheManager m = with_state(16, 4);
  admit(m, 1, run(100, 6));
  allocate(m, 1, 6);  // slot 0; a checkpoint at 4 tokens in slot 1
  require_error(m.fork(1, 2), absl::StatusCode::kFailedPrecondition, "fork after the step");
  end_step(m);
  REQUIRE(m.fork(1, 2).ok());
  // Slot 1 holds the checkpoint (cached, free) behind the clean slots 2 and 3: the child
  // takes slot 2.
  CHECK(state_slot(m, 2) == 2);
  const StepOps ops = m.take_step_ops();
  CHECK(ops.copy_state ==
        std::vector<BlockCopy>{{.src = 0, .dst = 2, .num_tokens = 4, .group = kState}});
  require_valid(m);
}

TEST_CASE("preemption drops or swaps the state slot", "[state]") {
  KvCacheManager m = with_state(16, 4);
  admit(m, 1, run(100, 3));
  allocate(m, 1, 3);  // slot 0; no full block, no checkpoint
  end_step(m);
  SECTION("swap copies it to a host slot and back") {
    REQUIRE(m.preempt(1, PreemptionMode::kSwap).ok());
    StepOps ops = m.take_step_ops();
    CHECK(ops.swap_out ==
          std::vector<BlockCopy>{{.src = 0, .dst = 0, .num_tokens = 3, .group = kFull},
                                 {.src = 0, .dst = 0, .num_tokens = 4, .group = kState}});
    CHECK(m.group_stats(kState)->used_blocks == 0);
    REQUIRE(m.swap_in(1).ok());
    ops = m.take_step_ops();
    CHECK(ops.swap_in ==
          std::vector<BlockCopy>{{.src = 0, .dst = 0, .num_tokens = 3, .group = kFull},
                                 {.src = 0, .dst = 0, .num_tokens = 4, .group = kState}});
    CHECK(state_slot(m, 1) == 0);
  }
  SECTION("recompute frees it: the sequence starts again from the zero state") {
    REQUIRE(m.preempt(1, PreemptionMode::kRecompute).ok());
    CHECK(m.group_stats(kState)->used_blocks == 0);
    allocate(m, 1, 3);
    CHECK(state_slot(m, 1) == 0);
  }
  require_valid(m);
}

TEST_CASE("within a step a restored state is saved again from the sequence's slot", "[state]") {
  KvCacheManager m = with_state(32, 8);
  admit(m, 1, run(100, 9));
  allocate(m, 1, 9);  // slot 0, checkpoint at 8 tokens in slot 1
  end_step(m);
  REQUIRE(m.free(1).ok());
  // A longer prompt after the same 8 tokens: hit at 8 (restore slot 1 into slot 0), then
  // its computation reaches its own prompt end at 16 (save slot 0 into slot 2). The
  // engine runs the restore with the step's copies, the save during the computation.
  admit(m, 2, concat(run(100, 8), run(200, 9)));
  CHECK(*m.match_prefix(2) == 8);
  allocate(m, 2, 9);
  StepOps ops = m.take_step_ops();
  CHECK(ops.copy_state ==
        std::vector<BlockCopy>{{.src = 1, .dst = 0, .num_tokens = 4, .group = kState}});
  CHECK(ops.save_state ==
        std::vector<StateSave>{{.seq = 2, .position = 16, .src = 0, .dst = 2, .group = kState}});
  require_valid(m);
}

TEST_CASE("slots named by the step's state ops are not reused before it ends", "[state]") {
  // Two slots: the sequence's and its checkpoint's.
  KvCacheManager m = with_state(16, 2);
  admit(m, 1, run(100, 5));
  allocate(m, 1, 5);  // slot 0; checkpoint at 4 tokens into slot 1
  // Freed before the step ends (an abort): the pending save still reads slot 0 and
  // writes slot 1, so neither is free for another sequence in this step.
  REQUIRE(m.free(1).ok());
  admit(m, 2, run(300, 5));
  require_error(m.allocate_slots(2, 5).status(), absl::StatusCode::kResourceExhausted,
                "state slot");
  require_valid(m);
  end_step(m);
  allocate(m, 2, 5);
  // Slot 0 came back clean (first), slot 1 cached: the sequence takes 0, and its own
  // checkpoint at 4 tokens evicts the old one from slot 1.
  CHECK(state_slot(m, 2) == 0);
  CHECK(m.take_step_ops().save_state ==
        std::vector<StateSave>{{.seq = 2, .position = 4, .src = 0, .dst = 1, .group = kState}});
  require_valid(m);
}

TEST_CASE("checkpoints are evicted least recently used first", "[state]") {
  KvCacheManager m = with_state(64, 8);
  // Three prompts, each alone; each leaves a checkpoint at its last full block's end: A at
  // 1 block, B at 4 blocks, D at 2 blocks, freed in that order.
  auto checkpoint_of = [&](SeqId seq, std::vector<TokenId> prompt) {
    admit(m, seq, prompt);
    allocate(m, seq, static_cast<int32_t>(prompt.size()));
    const StepOps ops = m.take_step_ops();
    REQUIRE(ops.save_state.size() == 1);
    REQUIRE(m.free(seq).ok());
    return ops.save_state[0].dst;
  };
  const BlockId a = checkpoint_of(1, run(100, 5));
  const BlockId b = checkpoint_of(2, run(300, 17));
  const BlockId d = checkpoint_of(3, run(700, 9));
  // C hits A's checkpoint: it goes back to the tail once the step's restore has run.
  admit(m, 4, concat(run(100, 4), run(500, 5)));
  CHECK(*m.match_prefix(4) == 4);
  end_step(m);
  std::vector<BlockId> cached;
  for (const BlockId slot : m.device_pool(kState).value()->free_queue_order()) {
    if (*m.device_pool(kState).value()->is_cached(slot)) cached.push_back(slot);
  }
  CHECK(cached == std::vector<BlockId>{b, d, a});
  require_valid(m);
}

// --- the host tier -----------------------------------------------------------------------
//
// with_state() gives the state group 2 host slots; with enable_host_cache they are its
// host tier. Checkpoint slots below: a prompt of its own of 8 or 10 tokens takes slot 0
// for the sequence (clean, at the head once freed) and the next free slot for its
// checkpoint at 8 tokens; the full group's 16 blocks never evict.

// Prompt `prompt` alone, computed in one step, then freed: returns its checkpoint's slot.
BlockId checkpoint_alone(KvCacheManager& m, SeqId seq, const std::vector<TokenId>& prompt,
                         StepOps* ops = nullptr) {
  admit(m, seq, prompt);
  allocate(m, seq, static_cast<int32_t>(prompt.size()));
  const StepOps taken = m.take_step_ops();
  REQUIRE(taken.save_state.size() == 1);
  REQUIRE(m.free(seq).ok());
  if (ops != nullptr) *ops = taken;
  return taken.save_state[0].dst;
}

TEST_CASE("an evicted checkpoint is demoted and a hit restores it from the host tier",
          "[state][host]") {
  KvEventBuffer events;
  KvCacheManager m = with_state(16, 3, {.enable_host_cache = true, .event_sink = &events});
  // A's checkpoint (8 tokens) in slot 1, B's in slot 2: the pool's 3 slots are taken.
  CHECK(checkpoint_alone(m, 1, run(100, 10)) == 1);
  CHECK(checkpoint_alone(m, 2, run(300, 8)) == 2);
  (void)events.take();
  // C's checkpoint evicts A's, the least recently used: demoted into host slot 0 first in
  // the step (the save into slot 1 runs during the computation).
  StepOps ops;
  CHECK(checkpoint_alone(m, 3, run(500, 8), &ops) == 1);
  CHECK(ops.demote ==
        std::vector<BlockCopy>{{.src = 1, .dst = 0, .num_tokens = 4, .group = kState}});
  CHECK(ops.save_state ==
        std::vector<StateSave>{{.seq = 3, .position = 8, .src = 0, .dst = 1, .group = kState}});
  // Events: the device checkpoint removed, its host copy stored under the same hash.
  std::vector<BlockHash> removed_device;
  std::vector<BlockHash> stored_host;
  for (const KvEvent& e : events.take()) {
    if (const auto* r = std::get_if<BlockRemoved>(&e); r != nullptr && r->group->index == kState) {
      if (r->medium == Medium::kDevice) removed_device = r->block_hashes;
    }
    if (const auto* b = std::get_if<BlockStored>(&e); b != nullptr && b->group->index == kState) {
      if (b->medium == Medium::kHost) stored_host = b->block_hashes;
    }
  }
  REQUIRE(removed_device.size() == 1);
  CHECK(stored_host == removed_device);
  CHECK(m.group_stats(kState)->blocks_demoted == 1);
  CHECK(m.group_stats(kState)->cached_host_blocks == 1);
  // D continues A's 8 tokens: the full group's blocks are on the device, A's checkpoint
  // only in the host tier, verified there. The restore copies host slot 0 straight into
  // D's slot (0, clean at the head): a promote, no copy_state.
  admit(m, 4, concat(run(100, 8), run(200, 4)));
  CHECK(*m.match_prefix(4) == 8);
  CHECK(state_table(m, 4) == Blocks{0});
  // D's own prompt end (12 tokens) evicts B's checkpoint (slot 2) into host slot 1.
  allocate(m, 4, 4);
  ops = m.take_step_ops();
  CHECK(ops.demote ==
        std::vector<BlockCopy>{{.src = 2, .dst = 1, .num_tokens = 4, .group = kState}});
  CHECK(ops.copy_state.empty());
  CHECK(ops.promote ==
        std::vector<BlockCopy>{{.src = 0, .dst = 0, .num_tokens = 4, .group = kState}});
  CHECK(ops.save_state ==
        std::vector<StateSave>{{.seq = 4, .position = 12, .src = 0, .dst = 2, .group = kState}});
  // The restore leaves A's checkpoint in the tier. Both host slots the step's copies name
  // go back to the tier's LRU order when it ends, in the order they were released: the
  // restore's (at the match) before the demotion's (at the allocation).
  CHECK(*m.host_pool(kState).value()->is_cached(0));
  CHECK(m.host_pool(kState).value()->free_queue_order() == std::vector<BlockId>{0, 1});
  const KvCacheManager::GroupStats stats = *m.group_stats(kState);
  CHECK(stats.checkpoints_restored == 1);
  CHECK(stats.blocks_promoted == 1);
  CHECK(stats.blocks_demoted == 2);
  CHECK(stats.cached_host_blocks == 2);
  CHECK(m.stats().prefix_hit_tokens == 8);
  require_valid(m);
  // E's checkpoint evicts C's (slot 1) from the device; its demotion evicts the tier's
  // least recently used checkpoint, A's in host slot 0: BlockRemoved on the host.
  REQUIRE(m.free(4).ok());
  (void)events.take();
  CHECK(checkpoint_alone(m, 5, run(700, 8), &ops) == 1);
  CHECK(ops.demote ==
        std::vector<BlockCopy>{{.src = 1, .dst = 0, .num_tokens = 4, .group = kState}});
  int host_removed = 0;
  for (const KvEvent& e : events.take()) {
    const auto* r = std::get_if<BlockRemoved>(&e);
    host_removed += r != nullptr && r->group->index == kState && r->medium == Medium::kHost;
  }
  CHECK(host_removed == 1);
  CHECK(m.group_stats(kState)->host_evictions == 1);
  require_valid(m);
}

TEST_CASE("a checkpoint demoted in this step is restored from the host in the same step",
          "[state][host]") {
  KvCacheManager m = with_state(16, 3, {.enable_host_cache = true});
  CHECK(checkpoint_alone(m, 1, run(100, 10)) == 1);
  CHECK(checkpoint_alone(m, 2, run(300, 8)) == 2);
  // C's checkpoint evicts A's into host slot 0 in this step; D then hits it there. The
  // demotion runs before the promotion that reads host slot 0, both before the saves.
  admit(m, 3, run(500, 8));
  allocate(m, 3, 8);  // slot 0; checkpoint into slot 1, A's demoted
  admit(m, 4, concat(run(100, 8), run(200, 4)));
  CHECK(*m.match_prefix(4) == 8);
  CHECK(state_table(m, 4) == Blocks{2});  // evicts B's checkpoint, demoted into host slot 1
  const StepOps ops = m.take_step_ops();
  CHECK(ops.demote ==
        std::vector<BlockCopy>{{.src = 1, .dst = 0, .num_tokens = 4, .group = kState},
                               {.src = 2, .dst = 1, .num_tokens = 4, .group = kState}});
  CHECK(ops.promote ==
        std::vector<BlockCopy>{{.src = 0, .dst = 2, .num_tokens = 4, .group = kState}});
  CHECK(ops.copy_state.empty());
  require_valid(m);
}

TEST_CASE("HostAdmission::kReused demotes only checkpoints restored since their save",
          "[state][host]") {
  KvCacheManager m =
      with_state(16, 4, {.enable_host_cache = true, .host_admission = HostAdmission::kReused});
  CHECK(checkpoint_alone(m, 1, run(100, 10)) == 1);
  // B restores A's checkpoint on the device (evidence of reuse) and saves its own prompt
  // end (12 tokens) into slot 2, never restored.
  admit(m, 2, concat(run(100, 8), run(200, 4)));
  CHECK(*m.match_prefix(2) == 8);
  allocate(m, 2, 4);
  StepOps ops = m.take_step_ops();
  CHECK(ops.copy_state ==
        std::vector<BlockCopy>{{.src = 1, .dst = 0, .num_tokens = 4, .group = kState}});
  REQUIRE(ops.save_state.size() == 1);
  CHECK(ops.save_state[0].dst == 2);
  REQUIRE(m.free(2).ok());
  CHECK(checkpoint_alone(m, 3, run(500, 8)) == 3);  // the last clean slot
  // Free queue: 0 (clean), then the checkpoints 1 (A), 2 (B), 3 (C), least recent first.
  // D's checkpoint evicts A's: restored, so demoted.
  CHECK(checkpoint_alone(m, 4, run(700, 8), &ops) == 1);
  CHECK(ops.demote ==
        std::vector<BlockCopy>{{.src = 1, .dst = 0, .num_tokens = 4, .group = kState}});
  // E's evicts B's: never restored, dropped.
  CHECK(checkpoint_alone(m, 5, run(900, 8), &ops) == 2);
  CHECK(ops.demote.empty());
  const KvCacheManager::GroupStats stats = *m.group_stats(kState);
  CHECK(stats.blocks_demoted == 1);
  CHECK(stats.blocks_not_admitted == 1);
  require_valid(m);
}

TEST_CASE("reset_prefix_cache drops the host tier's checkpoints", "[state][host]") {
  KvCacheManager m = with_state(16, 3, {.enable_host_cache = true});
  CHECK(checkpoint_alone(m, 1, run(100, 10)) == 1);
  CHECK(checkpoint_alone(m, 2, run(300, 8)) == 2);
  CHECK(checkpoint_alone(m, 3, run(500, 8)) == 1);  // A's demoted
  CHECK(m.group_stats(kState)->cached_host_blocks == 1);
  m.reset_prefix_cache();
  CHECK(m.group_stats(kState)->cached_host_blocks == 0);
  admit(m, 4, concat(run(100, 8), run(200, 4)));
  CHECK(*m.match_prefix(4) == 0);
  require_valid(m);
}

TEST_CASE("state groups are validated", "[state]") {
  KvCacheManager::Options options{.block_size = 4};
  SECTION("not first") {
    options.layer_groups = {{.kind = AttentionKind::kState, .num_blocks = 4},
                            {.kind = AttentionKind::kFull, .num_blocks = 4}};
    require_error(KvCacheManager::create(options).status(), absl::StatusCode::kInvalidArgument,
                  "first group must be an attention group");
  }
  SECTION("no window") {
    options.layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 4},
                            {.kind = AttentionKind::kState, .window = 8, .num_blocks = 4}};
    require_error(KvCacheManager::create(options).status(), absl::StatusCode::kInvalidArgument,
                  "must be 0 for a state group");
  }
  SECTION("no partial-block reuse") {
    options.enable_partial_block_reuse = true;
    options.layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 4},
                            {.kind = AttentionKind::kState, .num_blocks = 4}};
    require_error(KvCacheManager::create(options).status(), absl::StatusCode::kInvalidArgument,
                  "partial_block_reuse");
  }
  SECTION("state slots of a state group only") {
    KvCacheManager m = with_state(8, 4);
    admit(m, 1, run(100, 3));
    allocate(m, 1, 3);
    int32_t slot = -1;
    const SeqId seqs[] = {1};
    require_error(m.write_state_slots(seqs, kFull, {&slot, 1}), absl::StatusCode::kInvalidArgument,
                  "need a state group");
    CHECK(slot == -1);
  }
}

// Random runs of add, match, allocate (chunks and decode steps, with preemption), fork,
// preempt in both modes, swap in, free, release of claims and flushes (with and without
// the host tier), each step's ops
// run by a simulated engine whose states are fingerprints of the tokens they cover
// (support/state_ops.h): no sequence ever starts a step with another prefix's state.
TEST_CASE("state groups: random runs keep every sequence's state its own", "[property]") {
  const char* env = std::getenv("PAGEDKV_PROPERTY_SEED");
  const uint64_t seed = env != nullptr ? std::strtoull(env, nullptr, 10) : 20261202;
  std::mt19937_64 rng(seed);
  StateOpsTotals totals;
  // Under the sanitizers (with every call's invariant check) 2,000 runs take minutes.
  const int runs = testing::kSanitized ? 400 : 2000;
  for (int run = 0; run < runs; ++run) {
    std::vector<uint8_t> bytes(600);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    if (run % 4 == 3) bytes.insert(bytes.begin(), 254);  // with draft steps
    const std::string error = run_state_ops(bytes, &totals);
    INFO("seed " << seed << " run " << run);
    REQUIRE(error == "");
  }
  std::printf(
      "property test (state groups): seed %llu, %lld operations in %lld steps: %lld "
      "checkpoints saved, %lld restored (%lld tokens, %lld from the host tier), %lld "
      "demoted, %lld forks, %lld swaps; %lld drafts, %lld accepted\n",
      static_cast<unsigned long long>(seed), static_cast<long long>(totals.operations),
      static_cast<long long>(totals.steps), static_cast<long long>(totals.saves),
      static_cast<long long>(totals.restores), static_cast<long long>(totals.restored_tokens),
      static_cast<long long>(totals.host_restores), static_cast<long long>(totals.demotes),
      static_cast<long long>(totals.forks), static_cast<long long>(totals.swaps),
      static_cast<long long>(totals.drafts), static_cast<long long>(totals.accepted));
  CHECK(totals.restores > 0);
  CHECK(totals.accepted > 0);
  CHECK(totals.accepted < totals.drafts);
  CHECK(totals.saves > 0);
  CHECK(totals.demotes > 0);
  CHECK(totals.host_restores > 0);
}

}  // namespace
}  // namespace pagedkv
