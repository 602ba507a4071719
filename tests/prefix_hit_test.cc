// Tests of KvCacheManager::peek_prefix() (pagedkv/prefix_hit.h): it reports the hit that
// match_prefix() then claims, and the free blocks the claim takes, in every kind of layer
// group, and changes nothing: no reference, no eviction order, no counter.
// check_invariants() runs after every call.
#include "pagedkv/prefix_hit.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/kv_cache_manager.h"
#include "support/manager_test_util.h"

namespace pagedkv {
namespace {

using namespace pagedkv::testing;  // NOLINT: the shared test helpers

// Everything a peek must leave as it was: counters, every pool's free-queue order, and
// the sequences' states, computed tokens and tables.
struct Observed {
  KvCacheManager::Stats stats;
  std::vector<Blocks> free_queues;
  std::vector<std::tuple<SequenceState, int32_t, Blocks>> seqs;
};

Observed observe(const KvCacheManager& m, const std::vector<SeqId>& ids) {
  Observed o{m.stats(), {}, {}};
  for (int32_t g = 0; g < m.num_groups(); ++g) {
    o.free_queues.push_back((*m.device_pool(g))->free_queue_order());
    o.free_queues.push_back((*m.host_pool(g))->free_queue_order());
  }
  for (const SeqId id : ids) {
    for (int32_t g = 0; g < m.num_groups(); ++g) {
      auto v = m.sequence(id, g);
      REQUIRE(v.ok());
      o.seqs.emplace_back(v->state, v->num_computed_tokens,
                          Blocks(v->block_table.begin(), v->block_table.end()));
    }
  }
  return o;
}

void require_unchanged(const Observed& before, const Observed& after) {
  const KvCacheManager::Stats &a = before.stats, &b = after.stats;
  CHECK(a.used_blocks == b.used_blocks);
  CHECK(a.free_blocks == b.free_blocks);
  CHECK(a.cached_free_blocks == b.cached_free_blocks);
  CHECK(a.used_host_blocks == b.used_host_blocks);
  CHECK(a.prefix_query_tokens == b.prefix_query_tokens);
  CHECK(a.prefix_hit_tokens == b.prefix_hit_tokens);
  CHECK(a.evictions == b.evictions);
  CHECK(a.blocks_promoted == b.blocks_promoted);
  CHECK(a.cow_copies == b.cow_copies);
  CHECK(before.free_queues == after.free_queues);
  CHECK(before.seqs == after.seqs);
}

// A prompt of 10 tokens computed and freed: blocks 0 and 1 (of 4 tokens) cached.
KvCacheManager with_cached_prompt(const std::vector<TokenId>& prompt) {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(8)});
  admit(m, 1, prompt);
  REQUIRE(*m.match_prefix(1) == 0);
  allocate(m, 1, static_cast<int32_t>(prompt.size()));
  end_step(m);
  REQUIRE(m.free(1).ok());
  require_valid(m);
  return m;
}

TEST_CASE("peek_prefix reports the hit match_prefix claims, and changes nothing") {
  const std::vector<TokenId> prompt = iota_tokens(10);
  KvCacheManager m = with_cached_prompt(prompt);
  const Blocks free_order = (*m.device_pool())->free_queue_order();
  admit(m, 2, prompt);
  const Observed before = observe(m, {2});

  const absl::StatusOr<PrefixHit> hit = m.peek_prefix(2);
  REQUIRE(hit.ok());
  require_valid(m);
  CHECK(hit->num_tokens == 8);
  CHECK(hit->num_partial_tokens == 0);
  REQUIRE(hit->groups.size() == 1);
  const PrefixHit::Group& g = hit->groups[0];
  CHECK(g.num_free_hits == 2);  // both blocks are free and cached
  CHECK(g.num_new_blocks == 0);
  CHECK(g.blocks_taken() == 2);
  // A second peek sees the same, and neither moved a block in the eviction order.
  const absl::StatusOr<PrefixHit> again = m.peek_prefix(2);
  REQUIRE(again.ok());
  CHECK(again->groups[0].blocks == g.blocks);
  require_unchanged(before, observe(m, {2}));
  CHECK((*m.device_pool())->free_queue_order() == free_order);

  const int32_t free_before = m.stats().free_blocks;
  REQUIRE(*m.match_prefix(2) == hit->num_tokens);
  CHECK(table(m, 2) == g.blocks);
  CHECK(free_before - m.stats().free_blocks == g.blocks_taken());
  require_valid(m);
}

TEST_CASE("a peeked hit on blocks another sequence holds takes no free block") {
  const std::vector<TokenId> prompt = iota_tokens(10);
  KvCacheManager m = with_cached_prompt(prompt);
  admit(m, 2, prompt);
  REQUIRE(*m.match_prefix(2) == 8);
  allocate(m, 2, 2);  // running, holding the two cached blocks
  end_step(m);
  admit(m, 3, prompt);
  const absl::StatusOr<PrefixHit> hit = m.peek_prefix(3);
  REQUIRE(hit.ok());
  require_valid(m);
  CHECK(hit->num_tokens == 8);
  const Blocks held = table(m, 2);
  CHECK(hit->groups[0].blocks == Blocks(held.begin(), held.begin() + 2));
  CHECK(hit->groups[0].blocks_taken() == 0);
  const int32_t free_before = m.stats().free_blocks;
  REQUIRE(*m.match_prefix(3) == 8);
  CHECK(m.stats().free_blocks == free_before);
  require_valid(m);
}

TEST_CASE(
    "peek_prefix refuses what match_prefix refuses, naming the sequence, and changes "
    "nothing") {
  const std::vector<TokenId> prompt = iota_tokens(10);
  KvCacheManager m = with_cached_prompt(prompt);
  admit(m, 2, prompt);
  REQUIRE(*m.match_prefix(2) == 8);
  const Observed before = observe(m, {2});
  require_error(m.peek_prefix(99).status(), absl::StatusCode::kNotFound, "99");
  // Waiting, but holding its claim: a second match would be refused too.
  require_error(m.peek_prefix(2).status(), absl::StatusCode::kFailedPrecondition,
                "peek_prefix(seq 2)");
  require_unchanged(before, observe(m, {2}));
  require_valid(m);
  allocate(m, 2, 2);
  require_error(m.peek_prefix(2).status(), absl::StatusCode::kFailedPrecondition, "running");
  require_valid(m);
  end_step(m);
  REQUIRE(m.free(2).ok());
  require_valid(m);
}

TEST_CASE("peek_prefix with prefix caching off reports an empty hit for every group") {
  KvCacheManager m = make_manager(
      {.block_size = 4, .enable_prefix_caching = false, .layer_groups = full_attention(8)});
  admit(m, 1, iota_tokens(10));
  const absl::StatusOr<PrefixHit> hit = m.peek_prefix(1);
  REQUIRE(hit.ok());
  CHECK(hit->num_tokens == 0);
  REQUIRE(hit->groups.size() == 1);
  CHECK(hit->groups[0].blocks.empty());
  CHECK(hit->groups[0].blocks_taken() == 0);
  CHECK(m.stats().prefix_query_tokens == 0);
  require_valid(m);
}

// --- every kind of group: random workloads, a peek before every claim ----------------------

struct Profile {
  const char* name;
  KvCacheManager::Options options;
};

std::vector<Profile> profiles() {
  const int32_t bs = 4;
  return {
      {"full attention", {.block_size = bs, .layer_groups = full_attention(24)}},
      {"watermark", {.block_size = bs, .watermark_blocks = 2, .layer_groups = full_attention(24)}},
      {"host tier",
       {.block_size = bs, .enable_host_cache = true, .layer_groups = full_attention(16, 24)}},
      {"partial-block reuse",
       {.block_size = bs, .enable_partial_block_reuse = true, .layer_groups = full_attention(24)}},
      {"sliding window and full",
       {.block_size = bs,
        .layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 32},
                         {.kind = AttentionKind::kSlidingWindow, .window = 6, .num_blocks = 16}}}},
      {"chunked local, host tier",
       {.block_size = bs,
        .enable_host_cache = true,
        .layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 24, .num_host_blocks = 16},
                         {.kind = AttentionKind::kChunkedLocal,
                          .window = 8,
                          .num_blocks = 16,
                          .num_host_blocks = 16}}}},
      {"state group",
       {.block_size = bs,
        .layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 32, .num_host_blocks = 8},
                         {.kind = AttentionKind::kState, .num_blocks = 10}}}},
  };
}

// Prompts from a few shared prefixes, so that hits of every length come up.
std::vector<TokenId> random_prompt(std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, 3), len(1, 18), tail(0, 9);
  std::vector<TokenId> prompt = iota_tokens(len(rng), 1000 * (pick(rng) + 1));
  const int extra = tail(rng);
  for (int i = 0; i < extra; ++i) prompt.push_back(static_cast<TokenId>(tail(rng)));
  return prompt;
}

TEST_CASE(
    "in every kind of group, match_prefix claims what peek_prefix reported, taking "
    "the blocks it said") {
  for (const Profile& profile : profiles()) {
    INFO(profile.name);
    KvCacheManager m = make_manager(profile.options);
    std::mt19937 rng(20261201);
    std::vector<SeqId> running;
    int64_t hits = 0, taken = 0;
    for (SeqId seq = 1; seq <= 300; ++seq) {
      const std::vector<TokenId> prompt = random_prompt(rng);
      admit(m, seq, prompt);
      const Observed before = observe(m, {seq});
      const absl::StatusOr<PrefixHit> hit = m.peek_prefix(seq);
      REQUIRE(hit.ok());
      require_valid(m);
      require_unchanged(before, observe(m, {seq}));
      REQUIRE(std::ssize(hit->groups) == m.num_groups());
      std::vector<int32_t> free_before;
      for (int32_t g = 0; g < m.num_groups(); ++g) {
        free_before.push_back((*m.group_stats(g)).free_blocks);
      }
      const absl::StatusOr<int32_t> claimed = m.match_prefix(seq);
      REQUIRE(claimed.ok());
      require_valid(m);
      REQUIRE(*claimed == hit->num_tokens);
      hits += *claimed > 0;
      for (int32_t g = 0; g < m.num_groups(); ++g) {
        INFO("group " << g);
        const PrefixHit::Group& pg = hit->groups[g];
        CHECK(free_before[g] - (*m.group_stats(g)).free_blocks == pg.blocks_taken());
        taken += pg.blocks_taken();
        const Blocks held = table(m, seq, g);
        if ((*m.layer_group(g)).kind == AttentionKind::kState) continue;
        // Device hits are the claim's blocks; the others (promotions, window) are new.
        REQUIRE(held.size() >= pg.blocks.size());
        for (size_t i = 0; i < pg.blocks.size(); ++i) {
          if (pg.blocks[i] != kNoBlock) CHECK(held[i] == pg.blocks[i]);
        }
      }
      const int32_t todo = static_cast<int32_t>(prompt.size()) - *claimed;
      if (m.allocate_slots(seq, todo).ok()) {
        running.push_back(seq);
      } else {
        REQUIRE(m.free(seq).ok());
      }
      require_valid(m);
      end_step(m);
      // Finish some: their blocks stay cached for later hits, and pressure evicts.
      while (std::ssize(running) > 3 || (!running.empty() && rng() % 3 == 0)) {
        const size_t i = rng() % running.size();
        REQUIRE(m.free(running[i]).ok());
        running.erase(running.begin() + static_cast<int64_t>(i));
        require_valid(m);
      }
    }
    // The workload hits, promotes, reuses partial blocks and restores checkpoints where
    // the profile has them, so the checks above are not vacuous.
    CHECK(hits > 30);
    CHECK(taken > 30);
    const KvCacheManager::Stats stats = m.stats();
    if (profile.options.enable_host_cache) CHECK(stats.blocks_promoted > 0);
    if (profile.options.enable_partial_block_reuse) CHECK(stats.partial_hit_tokens > 0);
    for (int32_t g = 0; g < m.num_groups(); ++g) {
      if ((*m.layer_group(g)).kind == AttentionKind::kState) {
        CHECK((*m.group_stats(g)).checkpoints_restored > 0);
      }
    }
  }
}

}  // namespace
}  // namespace pagedkv
