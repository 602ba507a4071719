// Tests of the prefix cache's host tier (KvCacheManager::Options::enable_host_cache) and of
// retention priorities: demotion on eviction, promotion on a host hit, a hit chain from
// device into host blocks, the host tier's LRU order, the copy-order hazards of the new
// ops, priorities and their expiry. Every expected value is worked out in the comments.
#include <catch2/catch.hpp>

#include <limits>
#include <optional>
#include <variant>
#include <vector>

#include "pagedkv/block_hash.h"
#include "pagedkv/block_pool.h"
#include "pagedkv/kv_cache_manager.h"
#include "support/manager_test_util.h"

namespace pagedkv {
namespace {

using testing::admit;
using testing::allocate;
using testing::Blocks;
using testing::end_step;
using testing::iota_tokens;
using testing::make_manager;
using testing::require_error;
using testing::require_valid;
using testing::table;
using Ops = std::vector<BlockCopy>;

// Block size 4: a prompt of 8 tokens fills two blocks, A0 (tokens 100..103) and A1.
constexpr int32_t kBlockSize = 4;

KvCacheManager make_tiered(int32_t device_blocks, int32_t host_blocks, KvEventBuffer* events) {
  return make_manager({.block_size = kBlockSize,
                       .enable_host_cache = true,
                       .event_sink = events,
                       .layer_groups = full_attention(device_blocks, host_blocks)});
}

// The chained hashes of a prompt's full blocks, as the manager computes them.
std::vector<BlockHash> chain(const std::vector<TokenId>& tokens) {
  std::vector<BlockHash> hashes;
  for (size_t i = 0; i + kBlockSize <= tokens.size(); i += kBlockSize) {
    hashes.push_back(hash_block(hashes.empty() ? nullptr : &hashes.back(),
                                std::span(tokens).subspan(i, kBlockSize), {}));
  }
  return hashes;
}

// Prefills `prompt` as one step and leaves the sequence running.
void prefill(KvCacheManager& m, SeqId seq, const std::vector<TokenId>& prompt) {
  admit(m, seq, prompt);
  const int32_t hit = *m.match_prefix(seq);
  allocate(m, seq, static_cast<int32_t>(prompt.size()) - hit);
  end_step(m);
}

// Prompt A: 8 tokens, blocks A0 (tokens 100..103) and A1. A plus one token can claim both.
const std::vector<TokenId> kPromptA = iota_tokens(8, 100);
std::vector<TokenId> a_plus_one() {
  std::vector<TokenId> prompt = kPromptA;
  prompt.push_back(999);
  return prompt;
}

// Three device blocks: A0 stays cached in block 0 while A1 is demoted into host block 0;
// the device queue is [1 (clean), 0, 2].
KvCacheManager a0_on_device_a1_in_host(int32_t host_blocks, KvEventBuffer* events) {
  KvCacheManager m = make_tiered(/*device_blocks=*/3, host_blocks, events);
  prefill(m, 1, kPromptA);
  REQUIRE(m.free(1).ok());             // device queue [2, 1, 0]: A1 is evicted before A0
  prefill(m, 2, iota_tokens(5, 200));  // takes 2 and 1: A1 demoted to host 0
  REQUIRE(m.free(2).ok());             // block 1 (partial) is clean again, block 2 cached
  REQUIRE(m.device_pool().value()->free_queue_order() == Blocks{1, 0, 2});
  return m;
}

std::optional<BlockHash> host_hash(const KvCacheManager& m, BlockId h) {
  auto hash = m.host_pool().value()->cached_hash(h);
  return hash.ok() ? std::optional(*hash) : std::nullopt;
}

const BlockRemoved& removed(const KvEvent& e) { return std::get<BlockRemoved>(e); }
const BlockStored& stored(const KvEvent& e) { return std::get<BlockStored>(e); }

TEST_CASE("an evicted cached block is demoted to a host block instead of being lost",
          "[host_tier]") {
  KvEventBuffer events;
  KvCacheManager m = make_tiered(/*device_blocks=*/3, /*host_blocks=*/2, &events);
  const std::vector<TokenId> a = iota_tokens(8, 100);
  const std::vector<BlockHash> ha = chain(a);
  prefill(m, 1, a);  // blocks 0, 1 hold A0, A1
  REQUIRE(m.free(1).ok());
  // Released tail first: the cached list is [1, 0] behind the clean block 2.
  REQUIRE(m.device_pool().value()->free_queue_order() == Blocks{2, 1, 0});
  events.take();

  // 12 new tokens take block 2 (clean), then evict 1 (A1) and 0 (A0): both are demoted,
  // into host blocks 0 and 1, in eviction order.
  admit(m, 2, iota_tokens(12, 200));
  allocate(m, 2, 12);
  REQUIRE(table(m, 2) == Blocks{2, 1, 0});
  const KvCacheManager::Stats stats = m.stats();
  CHECK(stats.evictions == 2);
  CHECK(stats.blocks_demoted == 2);
  CHECK(stats.cached_host_blocks == 2);
  CHECK(stats.used_host_blocks == 2);  // held until the engine takes the copies
  CHECK(m.host_pool().value()->free_queue_order().empty());
  CHECK(host_hash(m, 0) == ha[1]);
  CHECK(host_hash(m, 1) == ha[0]);

  // Events: the device loses both, then the host gains each with its parent and tokens.
  const std::vector<KvEvent> e = events.take();
  REQUIRE(e.size() == 5);  // + seq 2's own BlockStored
  CHECK(removed(e[0]).block_hashes == std::vector{ha[1]});
  CHECK(removed(e[0]).medium == Medium::kDevice);
  CHECK(removed(e[1]).block_hashes == std::vector{ha[0]});
  CHECK(stored(e[2]).block_hashes == std::vector{ha[1]});
  CHECK(stored(e[2]).parent_hash == ha[0]);
  CHECK(stored(e[2]).token_ids == iota_tokens(4, 104));
  CHECK(stored(e[2]).medium == Medium::kHost);
  CHECK(stored(e[3]).block_hashes == std::vector{ha[0]});
  CHECK(stored(e[3]).parent_hash == std::nullopt);
  CHECK(stored(e[4]).medium == Medium::kDevice);

  // The demote copies read the evicted device blocks before the step refills them.
  const StepOps swaps = m.take_step_ops();
  CHECK(swaps.demote == Ops{{1, 0, kBlockSize}, {0, 1, kBlockSize}});
  CHECK(swaps.swap_out.empty());
  require_valid(m);
  // Released after the step, in demotion order: host LRU order [0, 1].
  CHECK(m.host_pool().value()->free_queue_order() == Blocks{0, 1});
  CHECK(m.stats().used_host_blocks == 0);
}

TEST_CASE("a host hit is promoted with a copy, counts as a hit and leaves the host tier",
          "[host_tier]") {
  KvEventBuffer events;
  KvCacheManager m = make_tiered(/*device_blocks=*/3, /*host_blocks=*/2, &events);
  const std::vector<TokenId> a = iota_tokens(8, 100);
  const std::vector<BlockHash> ha = chain(a);
  prefill(m, 1, a);
  REQUIRE(m.free(1).ok());
  prefill(m, 2, iota_tokens(12, 200));  // demotes A1 -> host 0, A0 -> host 1
  const std::vector<BlockHash> hb = chain(iota_tokens(12, 200));
  REQUIRE(m.free(2).ok());  // device queue [0, 1, 2]: B2, B1, B0 cached, tail first
  events.take();

  // A + one token: no device hit; A0 in host 1, A1 in host 0 (verified after A0's copy).
  admit(m, 3, a_plus_one());
  REQUIRE(*m.match_prefix(3) == 8);
  // Two device blocks for the copies: 0 and 1, which held B2 and B1. Each trades places
  // with the host block promoted into it (an exchange): B2 goes to host 1, B1 to host 0,
  // and the tier keeps as many blocks as before.
  CHECK(table(m, 3) == Blocks{0, 1});
  KvCacheManager::Stats s = m.stats();
  CHECK(s.prefix_hit_tokens == 8);
  CHECK(s.host_hit_tokens == 8);
  CHECK(s.blocks_promoted == 2);
  CHECK(s.blocks_demoted == 4);  // seq 2's two, and B2 and B1 now
  CHECK(s.cached_host_blocks == 2);
  CHECK(s.host_evictions == 0);
  CHECK(m.device_pool().value()->cached_hash(0).value() == ha[0]);
  CHECK(m.device_pool().value()->cached_hash(1).value() == ha[1]);
  CHECK(host_hash(m, 1) == hb[2]);
  CHECK(host_hash(m, 0) == hb[1]);

  const std::vector<KvEvent> e = events.take();
  REQUIRE(e.size() == 7);
  CHECK(removed(e[0]).block_hashes == std::vector{hb[2]});
  CHECK(removed(e[0]).medium == Medium::kDevice);
  CHECK(removed(e[1]).block_hashes == std::vector{hb[1]});
  CHECK(removed(e[2]).block_hashes == std::vector{ha[0]});
  CHECK(removed(e[2]).medium == Medium::kHost);
  CHECK(stored(e[3]).block_hashes == std::vector{hb[2]});
  CHECK(stored(e[3]).parent_hash == hb[1]);
  CHECK(stored(e[3]).medium == Medium::kHost);
  CHECK(removed(e[4]).block_hashes == std::vector{ha[1]});
  CHECK(stored(e[5]).block_hashes == std::vector{hb[1]});
  CHECK(stored(e[6]).block_hashes == std::vector{ha[0], ha[1]});  // one event for the run
  CHECK(stored(e[6]).medium == Medium::kDevice);

  // The rest of the prompt: one token into a new block, 2, evicting B0, which no host block
  // can take in this step (both are held for the exchanges): dropped.
  CHECK(allocate(m, 3, 1) == testing::Slots{8});
  const StepOps swaps = m.take_step_ops();
  CHECK(swaps.exchange == Ops{{0, 1, kBlockSize}, {1, 0, kBlockSize}});
  CHECK(swaps.promote.empty());
  CHECK(swaps.demote.empty());
  require_valid(m);
  // The host blocks return to the tier after the step, in exchange order.
  CHECK(m.host_pool().value()->free_queue_order() == Blocks{1, 0});
}

TEST_CASE("a prefix hit runs from device blocks into host blocks", "[host_tier]") {
  KvEventBuffer events;
  KvCacheManager m = a0_on_device_a1_in_host(/*host_blocks=*/2, &events);
  const std::vector<BlockHash> ha = chain(kPromptA);
  events.take();

  admit(m, 3, a_plus_one());
  REQUIRE(*m.match_prefix(3) == 8);  // A0 on the device, A1 from the host
  CHECK(table(m, 3) == Blocks{0, 1});
  CHECK(m.stats().host_hit_tokens == 4);
  CHECK(m.stats().prefix_hit_tokens == 8);
  const std::vector<KvEvent> e = events.take();
  REQUIRE(e.size() == 2);
  CHECK(removed(e[0]).block_hashes == std::vector{ha[1]});
  CHECK(removed(e[0]).medium == Medium::kHost);
  CHECK(stored(e[1]).block_hashes == std::vector{ha[1]});
  CHECK(stored(e[1]).parent_hash == ha[0]);
  CHECK(m.take_step_ops().promote == Ops{{0, 1, kBlockSize}});
  require_valid(m);
}

TEST_CASE("the host tier evicts its least recently demoted block first", "[host_tier]") {
  KvEventBuffer events;
  KvCacheManager m = make_tiered(/*device_blocks=*/2, /*host_blocks=*/2, &events);
  // Five one-block prompts pass through the two device blocks: from the third on, each
  // evicts the least recently used one.
  const std::vector<TokenId> prompts[] = {iota_tokens(4, 100), iota_tokens(4, 200),
                                          iota_tokens(4, 300), iota_tokens(4, 400),
                                          iota_tokens(4, 500)};
  for (SeqId seq = 0; seq < 5; ++seq) {
    prefill(m, seq, prompts[seq]);
    REQUIRE(m.free(seq).ok());
  }
  // 100.. went to host 0, 200.. to host 1, then 300.. evicted 100.. (the host's LRU).
  CHECK(m.stats().blocks_demoted == 3);
  CHECK(m.stats().host_evictions == 1);
  CHECK(host_hash(m, 0) == chain(prompts[2])[0]);
  CHECK(host_hash(m, 1) == chain(prompts[1])[0]);
  CHECK(m.host_pool().value()->free_queue_order() == Blocks{1, 0});
  // 100.. is gone from both tiers; 200.. still hits (from the host).
  std::vector<TokenId> p0 = prompts[0];
  p0.push_back(1);
  admit(m, 10, p0);
  CHECK(*m.match_prefix(10) == 0);
  REQUIRE(m.free(10).ok());
  std::vector<TokenId> p1 = prompts[1];
  p1.push_back(1);
  admit(m, 11, p1);
  CHECK(*m.match_prefix(11) == 4);
  CHECK(m.stats().host_hit_tokens == 4);
  require_valid(m);
}

TEST_CASE("host-tier copies never reuse a block a pending copy names", "[host_tier]") {
  KvEventBuffer events;
  const std::vector<TokenId> a = iota_tokens(8, 100);

  SECTION("with fewer free host blocks than evictions, the least recently used are dropped") {
    KvCacheManager m = make_tiered(/*device_blocks=*/2, /*host_blocks=*/1, &events);
    prefill(m, 1, a);
    REQUIRE(m.free(1).ok());
    admit(m, 2, iota_tokens(8, 200));
    allocate(m, 2, 8);  // evicts A1, then A0: one host block, for A0 (more recently used)
    CHECK(m.stats().blocks_demoted == 1);
    CHECK(m.take_step_ops().demote == Ops{{0, 0, kBlockSize}});
    require_valid(m);
  }

  SECTION("a promotion may read a host block demoted in the same step (demote runs first)") {
    KvCacheManager m = make_tiered(/*device_blocks=*/3, /*host_blocks=*/2, &events);
    prefill(m, 1, iota_tokens(4, 100));  // block 0: A0
    REQUIRE(m.free(1).ok());
    prefill(m, 2, iota_tokens(4, 300));  // block 1: C0
    REQUIRE(m.free(2).ok());             // device queue [2, 0, 1]
    admit(m, 4, iota_tokens(8, 200));
    allocate(m, 4, 8);  // takes 2, then evicts A0 from 0: demoted into host 0
    std::vector<TokenId> a5 = iota_tokens(4, 100);
    a5.push_back(999);
    admit(m, 3, a5);
    // A0 is promoted from host 0 into block 1. Host 0 is written by this step's demotion,
    // so it is not exchanged: C0, evicted from block 1, is demoted into host 1.
    REQUIRE(*m.match_prefix(3) == 4);
    CHECK(host_hash(m, 0) == std::nullopt);
    CHECK(host_hash(m, 1) == chain(iota_tokens(4, 300))[0]);
    const StepOps swaps = m.take_step_ops();
    CHECK(swaps.demote == Ops{{0, 0, kBlockSize}, {1, 1, kBlockSize}});
    CHECK(swaps.promote == Ops{{0, 1, kBlockSize}});
    CHECK(swaps.exchange.empty());
    require_valid(m);
  }

  SECTION("a host block an exchange writes is not exchanged again in the same step") {
    // Block size 1: a token is a block.
    KvCacheManager m = make_manager(
        {.block_size = 1, .enable_host_cache = true, .layer_groups = full_attention(4, 4)});
    prefill(m, 1, {10, 11});  // blocks 0 (10) and 1 (11)
    prefill(m, 2, {30});      // block 2 (30)
    REQUIRE(m.free(1).ok());
    REQUIRE(m.free(2).ok());      // cached [11, 10, 30] behind the clean block 3
    prefill(m, 3, {20, 21, 22});  // 3, then evicts 11 and 10: hosts 0 and 1
    REQUIRE(m.free(3).ok());      // cached [30, 22, 21, 20]
    admit(m, 4, {10, 12});
    REQUIRE(*m.match_prefix(4) == 1);  // 10 from host 1 into block 2, whose 30 takes host 1
    allocate(m, 4, 1);                 // block 0, evicting 22: demoted into host 2
    admit(m, 5, {30, 33});
    // 30 is in host 1, which this step's exchange writes: promoted into block 1 after the
    // exchanges, and 21, evicted from block 1, demoted into host 3.
    REQUIRE(*m.match_prefix(5) == 1);
    allocate(m, 5, 1);  // block 3, evicting 20: into host 0, evicting 11 from the tier
    CHECK(table(m, 4) == Blocks{2, 0});
    CHECK(table(m, 5) == Blocks{1, 3});
    CHECK(m.stats().host_evictions == 1);
    const StepOps swaps = m.take_step_ops();
    CHECK(swaps.demote == Ops{{0, 2, 1}, {1, 3, 1}, {3, 0, 1}});
    CHECK(swaps.exchange == Ops{{2, 1, 1}});
    CHECK(swaps.promote == Ops{{1, 1, 1}});
    require_valid(m);
  }

  SECTION("a host block a promotion reads is not reused until the step's copies are taken") {
    KvCacheManager m = a0_on_device_a1_in_host(/*host_blocks=*/1, &events);
    admit(m, 3, a_plus_one());
    REQUIRE(*m.match_prefix(3) == 8);  // A1 promoted from host 0 into device 1
    CHECK(m.host_pool().value()->free_queue_order().empty());
    CHECK(m.stats().used_host_blocks == 1);
    const StepOps ops = m.take_step_ops();
    CHECK(ops.copy_on_write.empty());
    CHECK(ops.promote == Ops{{0, 1, kBlockSize}});
    CHECK(m.host_pool().value()->free_queue_order() == Blocks{0});
    require_valid(m);
  }

  SECTION("a device block a promotion fills is not reused before the step") {
    KvCacheManager m = a0_on_device_a1_in_host(/*host_blocks=*/1, &events);
    admit(m, 3, a_plus_one());
    REQUIRE(*m.match_prefix(3) == 8);
    REQUIRE(m.release_claim(3).ok());
    // Block 1 is the promotion's destination: parked, not in the free queue.
    CHECK(m.device_pool().value()->free_queue_order() == Blocks{2, 0});
    require_valid(m);
    end_step(m);
    // The promotion ran with the step, so A1 stays cached on the device (its host copy
    // left the tier): released after the step at the tail, and hit again from there.
    CHECK(m.device_pool().value()->free_queue_order() == Blocks{2, 0, 1});
    CHECK(*m.device_pool().value()->is_cached(1));
    admit(m, 4, a_plus_one());
    CHECK(*m.match_prefix(4) == 8);
    CHECK(table(m, 4) == Blocks{0, 1});
    CHECK(m.stats().host_hit_tokens == 4);  // the first promotion's only
    require_valid(m);
  }
}

TEST_CASE("reset_prefix_cache empties both tiers with one event", "[host_tier]") {
  KvEventBuffer events;
  KvCacheManager m = make_tiered(/*device_blocks=*/3, /*host_blocks=*/2, &events);
  prefill(m, 1, iota_tokens(8, 100));
  REQUIRE(m.free(1).ok());
  prefill(m, 2, iota_tokens(12, 200));  // both A blocks demoted
  REQUIRE(m.stats().cached_host_blocks == 2);
  events.take();
  m.reset_prefix_cache();
  CHECK(m.stats().cached_host_blocks == 0);
  const std::vector<KvEvent> e = events.take();
  REQUIRE(e.size() == 1);
  CHECK(std::holds_alternative<AllBlocksCleared>(e[0]));
  std::vector<TokenId> a9 = iota_tokens(8, 100);
  a9.push_back(1);
  admit(m, 3, a9);
  CHECK(*m.match_prefix(3) == 0);
  require_valid(m);
}

TEST_CASE("host tier and retention options are validated", "[host_tier]") {
  auto no_host = KvCacheManager::create(
      {.block_size = 4, .enable_host_cache = true, .layer_groups = full_attention(4)});
  require_error(
      no_host.status(), absl::StatusCode::kInvalidArgument,
      "layer_groups[0] (full): enable_host_cache needs num_host_blocks > 0 in every group");
  auto no_caching = KvCacheManager::create({.block_size = 4,
                                            .enable_host_cache = true,
                                            .enable_prefix_caching = false,
                                            .layer_groups = full_attention(4, 2)});
  require_error(no_caching.status(), absl::StatusCode::kInvalidArgument,
                "enable_host_cache needs enable_prefix_caching");

  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(4)});
  const std::vector<TokenId> p = iota_tokens(5);
  require_error(m.add_sequence(1, p, {.retention = {{.priority = 101}}}),
                absl::StatusCode::kInvalidArgument, "priority 101");
  require_error(m.add_sequence(1, p, {.retention = {{.begin = 8, .end = 4}}}),
                absl::StatusCode::kInvalidArgument, "[8, 4)");
  require_error(m.add_sequence(1, p, {.retention = {{.priority = 90, .duration_ms = -1}}}),
                absl::StatusCode::kInvalidArgument, "duration_ms -1");
  CHECK(m.num_sequences() == 0);

  auto bad_admission = KvCacheManager::create({.block_size = 4,
                                               .enable_host_cache = true,
                                               .host_admission = static_cast<HostAdmission>(2),
                                               .layer_groups = full_attention(4, 2)});
  require_error(bad_admission.status(), absl::StatusCode::kInvalidArgument, "host_admission 2");
}

// --- host admission ---------------------------------------------------------------------------

KvCacheManager make_admitting(int32_t device_blocks, int32_t host_blocks) {
  return make_manager({.block_size = kBlockSize,
                       .enable_host_cache = true,
                       .host_admission = HostAdmission::kReused,
                       .layer_groups = full_attention(device_blocks, host_blocks)});
}

TEST_CASE("admission kReused drops blocks never reused and demotes them once they come back",
          "[host_tier][admission]") {
  KvCacheManager m = make_admitting(/*device_blocks=*/3, /*host_blocks=*/4);
  prefill(m, 1, kPromptA);  // A0, A1 in blocks 0, 1
  REQUIRE(m.free(1).ok());  // queue [2 (clean), 1 (A1), 0 (A0)]

  // B0..B2 take block 2 and evict A1, A0: never hit, so dropped; their hashes are ghosts.
  prefill(m, 2, iota_tokens(12, 200));
  KvCacheManager::Stats s = m.stats();
  CHECK(s.evictions == 2);
  CHECK(s.blocks_not_admitted == 2);
  CHECK(s.blocks_demoted == 0);
  CHECK(s.cached_host_blocks == 0);
  CHECK(m.take_step_ops().demote.empty());
  REQUIRE(m.free(2).ok());  // table {2, 1, 0} freed tail first: queue [0 (B2), 1 (B1), 2 (B0)]

  // A again: no hit anywhere; its blocks evict B2 and B1 (dropped, ghosts too) and are
  // computed while A0 and A1 are ghosts: both count as reused.
  admit(m, 3, kPromptA);
  CHECK(*m.match_prefix(3) == 0);
  allocate(m, 3, 8);
  end_step(m);
  s = m.stats();
  CHECK(s.blocks_not_admitted == 4);
  CHECK(s.ghost_hits == 2);
  REQUIRE(m.free(3).ok());  // queue [2 (B0), 1 (A1), 0 (A0)]

  // C0..C2 evict B0 (dropped) and then A1, A0, which are demoted into host blocks 0 and 1.
  prefill(m, 4, iota_tokens(12, 300));
  s = m.stats();
  CHECK(s.evictions == 7);
  CHECK(s.blocks_not_admitted == 5);
  CHECK(s.blocks_demoted == 2);
  CHECK(s.cached_host_blocks == 2);
  const std::vector<BlockHash> ha = chain(kPromptA);
  CHECK(host_hash(m, 0) == ha[1]);
  CHECK(host_hash(m, 1) == ha[0]);
  require_valid(m);
}

TEST_CASE("admission kReused demotes device hits and promoted host hits",
          "[host_tier][admission]") {
  KvCacheManager m = make_admitting(/*device_blocks=*/3, /*host_blocks=*/4);
  prefill(m, 1, kPromptA);
  REQUIRE(m.free(1).ok());
  // A plus one token hits A0 and A1 on the device: reused.
  prefill(m, 2, a_plus_one());
  CHECK(m.stats().prefix_hit_tokens == 8);
  REQUIRE(m.free(2).ok());
  // 12 new tokens evict all three blocks: A0 and A1 are demoted, the third (A's partial
  // block was freed clean, so the first taken) is not cached.
  prefill(m, 3, iota_tokens(12, 200));
  KvCacheManager::Stats s = m.stats();
  CHECK(s.blocks_demoted == 2);
  CHECK(s.blocks_not_admitted == 0);
  REQUIRE(m.free(3).ok());

  // A plus one again: both blocks are host hits, promoted into new device blocks, which
  // count as reused: evicting them demotes them again (into host blocks free by then).
  prefill(m, 4, a_plus_one());
  s = m.stats();
  CHECK(s.blocks_promoted == 2);
  CHECK(s.host_hit_tokens == 8);
  REQUIRE(m.free(4).ok());
  prefill(m, 5, iota_tokens(12, 300));
  s = m.stats();
  CHECK(s.blocks_demoted == 4);
  CHECK(s.blocks_not_admitted == 3);  // B0..B2, never hit
  require_valid(m);
}

// --- retention priorities -------------------------------------------------------------------

TEST_CASE("a higher retention priority outlives LRU order, and equal priorities stay LRU",
          "[retention]") {
  KvCacheManager m = make_manager({.block_size = kBlockSize, .layer_groups = full_attention(3)});
  // A system prompt (block A0) kept at priority 90, then two other prompts.
  admit(m, 1, iota_tokens(5, 100), {.retention = {{.begin = 0, .end = 4, .priority = 90}}});
  allocate(m, 1, 5);  // blocks 0 (A0, full) and 1
  end_step(m);
  REQUIRE(m.free(1).ok());
  CHECK(m.device_pool().value()->retention_priority(0).value() == 90);
  prefill(m, 2, iota_tokens(4, 200));  // block 1 (clean first)
  REQUIRE(m.free(2).ok());
  prefill(m, 3, iota_tokens(4, 300));  // block 2
  REQUIRE(m.free(3).ok());
  // Least recently used first is A0, but priority 90 sorts after the default's list.
  CHECK(m.device_pool().value()->free_queue_order() == Blocks{1, 2, 0});
  prefill(m, 4, iota_tokens(8, 400));  // two blocks: evicts 1 and 2, keeps A0
  std::vector<TokenId> a5 = iota_tokens(4, 100);
  a5.push_back(7);
  admit(m, 5, a5);
  CHECK(*m.match_prefix(5) == 4);
  // A hit takes A0 out of the free queue: its priority is the default again until a
  // holder sets one.
  CHECK(m.device_pool().value()->retention_priority(0).value() == kDefaultRetentionPriority);
  require_valid(m);
}

// Four cached blocks of one token, 0 <- 1 <- 2 <- 3, freed in id order; block 1 retained at
// priority 90 for 10 ms on the clock `now`: the free queue is 0, 2, 3 (default list), 1.
BlockPool four_cached_blocks_one_retained(const int64_t& now) {
  auto pool = BlockPool::create({.num_blocks = 4, .block_size = 1, .clock = [&] { return now; }});
  REQUIRE(pool.ok());
  BlockId blocks[4];
  REQUIRE(pool->allocate(blocks).ok());
  REQUIRE(blocks[0] == 0);
  BlockHash parent;
  for (BlockId b = 0; b < 4; ++b) {
    const TokenId token = 10 + b;
    const BlockHash hash{static_cast<uint64_t>(b + 1), 0};
    REQUIRE(pool->cache_full_block(b, hash, b == 0 ? kNoBlock : b - 1, b == 0 ? nullptr : &parent,
                                   {&token, 1}, {})
                .value());
    parent = hash;
  }
  REQUIRE(pool->set_retention(1, 90, /*duration_ms=*/10).ok());
  // Freed one by one in id order: 0, 2, 3 in the default list, 1 in priority 90's.
  for (const BlockId b : blocks) REQUIRE(pool->free({&b, 1}).ok());
  REQUIRE(pool->free_queue_order() == Blocks{0, 2, 3, 1});
  return *std::move(pool);
}

TEST_CASE("an expired retention returns the block to its LRU place", "[retention]") {
  int64_t now = 0;
  BlockPool pool_value = four_cached_blocks_one_retained(now);
  BlockPool* pool = &pool_value;

  BlockId out;
  SECTION("before the duration passes, block 1 keeps its priority") {
    now = 9;
    REQUIRE(pool->allocate({&out, 1}).ok());
    CHECK(out == 0);
    CHECK(pool->free_queue_order() == Blocks{2, 3, 1});
    CHECK(pool->retention_priority(1).value() == 90);
  }
  SECTION("after it, block 1 sits between 0 and 2, where its release put it") {
    now = 10;
    REQUIRE(pool->allocate({&out, 1}).ok());
    CHECK(out == 0);
    CHECK(pool->free_queue_order() == Blocks{1, 2, 3});
    CHECK(pool->retention_priority(1).value() == kDefaultRetentionPriority);
  }
  CHECK(pool->check_invariants().ok());
}

TEST_CASE("retention expiry holds for any clock value, saturating at the end of time",
          "[retention]") {
  // Freed at `start` with 10 ms to go: kept at start + 9, expired at start + 10; a clock
  // 5 ms from INT64_MAX saturates the expiry to INT64_MAX instead of wrapping below now.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const int64_t start :
       {std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{0}, kMax - 5}) {
    INFO("clock starts at " << start);
    int64_t now = start;
    BlockPool pool = four_cached_blocks_one_retained(now);
    const bool saturated = start > kMax - 10;
    BlockId out = kNoBlock;
    now = saturated ? kMax - 1 : start + 9;
    REQUIRE(pool.allocate({&out, 1}).ok());
    CHECK(out == 0);
    CHECK(pool.retention_priority(1).value() == 90);
    now = saturated ? kMax : start + 10;
    REQUIRE(pool.allocate({&out, 1}).ok());
    CHECK(out == 1);  // expired: back at its LRU place, before 2 (kept, 2 would come first)
    CHECK(pool.check_invariants().ok());
  }
}

TEST_CASE("a lower retention priority is evicted first, and holders raise a block's priority",
          "[retention]") {
  auto pool = BlockPool::create({.num_blocks = 3, .block_size = 1});
  REQUIRE(pool.ok());
  BlockId blocks[3];
  REQUIRE(pool->allocate(blocks).ok());
  for (BlockId b = 0; b < 3; ++b) {
    const TokenId token = b;
    const BlockHash hash{static_cast<uint64_t>(b + 1), 0};
    REQUIRE(pool->cache_full_block(b, hash, kNoBlock, nullptr, {&token, 1}, {}).value());
  }
  // Block 0 is shared by two holders: one gives it 20, the other 90; block 2 gets 20 alone.
  REQUIRE(pool->touch(0).ok());
  REQUIRE(pool->set_retention(0, 20, 0).ok());
  REQUIRE(pool->set_retention(0, 90, 0).ok());
  REQUIRE(pool->set_retention(2, 20, 0).ok());
  CHECK(pool->retention_priority(0).value() == 90);
  CHECK(pool->retention_priority(1).value() == kDefaultRetentionPriority);
  CHECK(pool->retention_priority(2).value() == 20);
  const BlockId order[] = {2, 1, 0, 0};  // 0 twice: both of its references
  REQUIRE(pool->free(order).ok());
  // Priority 20 first (2), then the default (1), then 90 (0), whatever the release order.
  CHECK(pool->free_queue_order() == testing::Blocks{2, 1, 0});
  BlockId out;
  REQUIRE(pool->allocate({&out, 1}).ok());
  CHECK(out == 2);
  CHECK(pool->check_invariants().ok());
}

TEST_CASE("set_retention validates its arguments and keeps the higher priority", "[retention]") {
  auto pool = BlockPool::create({.num_blocks = 2, .block_size = 1});
  REQUIRE(pool.ok());
  require_error(pool->set_retention(0, 90, 0), absl::StatusCode::kFailedPrecondition,
                "block 0 is free");
  BlockId b;
  REQUIRE(pool->allocate({&b, 1}).ok());
  require_error(pool->set_retention(2, 90, 0), absl::StatusCode::kInvalidArgument,
                "block 2 outside [0, 2)");
  require_error(pool->set_retention(b, -1, 0), absl::StatusCode::kInvalidArgument, "priority -1");
  require_error(pool->set_retention(b, 50, -5), absl::StatusCode::kInvalidArgument,
                "duration_ms -5");
  REQUIRE(pool->set_retention(b, 80, 0).ok());
  REQUIRE(pool->set_retention(b, 60, 0).ok());  // lower: ignored
  CHECK(pool->retention_priority(b).value() == 80);
}

}  // namespace
}  // namespace pagedkv
