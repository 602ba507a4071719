// Tests of KvCacheManager's hand-offs (pagedkv/kv_handoff.h): an export pins a finished
// sequence's blocks until release_export(); an import admits a sequence whose first tokens
// a transfer fills, counted and cached only by complete_import(), which keeps the longest
// prefix every layer group serves from verified blocks and releases the rest. Exact values
// are worked out in the comments: a fresh pool hands out its clean blocks in id order.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_handoff.h"
#include "support/handoff_ops.h"
#include "support/manager_test_util.h"
#include "support/sanitizers.h"

namespace pagedkv {
namespace {

using namespace pagedkv::testing;  // NOLINT: the shared test helpers

constexpr int32_t kBlockSize = 4;

KvCacheManager manager(EventLog* log, std::vector<LayerGroup> groups = full_attention(8)) {
  return make_manager(
      {.block_size = kBlockSize, .event_sink = log, .layer_groups = std::move(groups)});
}

// The prefill engine's side: seq 1's 10-token prompt computed (blocks 0-2), token 500
// sampled, the step over.
void prefill(KvCacheManager& m, SeqId seq = 1, std::vector<TokenId> prompt = iota_tokens(10)) {
  admit(m, seq, prompt);
  REQUIRE(*m.match_prefix(seq) == 0);
  allocate(m, seq, static_cast<int32_t>(prompt.size()));
  end_step(m);
  REQUIRE(m.append_tokens(seq, std::vector<TokenId>{500}).ok());
}

// The decode engine's side: seq 1 waiting with the prompt and the sampled token.
std::vector<TokenId> with_sampled(std::vector<TokenId> prompt) {
  prompt.push_back(500);
  return prompt;
}

std::vector<BlockId> blocks_of(const KvHandoffGroup& g) { return g.blocks; }

TEST_CASE("an export pins the sequence's blocks until release_export", "[handoff]") {
  EventLog log;
  KvCacheManager m = manager(&log);
  prefill(m);
  const absl::StatusOr<KvExport> out = m.export_sequence(1);
  REQUIRE(out.ok());
  CHECK(out->tokens == iota_tokens(10));
  CHECK(out->block_hashes.size() == 2);
  REQUIRE(out->groups.size() == 1);
  CHECK(out->groups[0].first_entry == 0);
  CHECK(blocks_of(out->groups[0]) == Blocks{0, 1, 2});
  // The sequence is gone; its blocks are held by the pins alone.
  CHECK_FALSE(m.contains(1));
  const BlockPool& pool = **m.device_pool();
  CHECK(pool.num_free_blocks() == 5);
  CHECK(m.stats().pinned_blocks == 3);
  CHECK(m.stats().exported_sequences == 1);
  require_valid(m);
  // Pinned blocks are never evicted: a sequence that takes every free block gets others.
  admit(m, 2, iota_tokens(20, 900));
  const std::vector<TokenId> slots = iota_tokens(20, 12);
  CHECK(allocate(m, 2, 20) == Slots(slots.begin(), slots.end()));
  CHECK(table(m, 2) == Blocks{3, 4, 5, 6, 7});
  require_error(m.export_sequence(2).status(), absl::StatusCode::kFailedPrecondition,
                "the step that writes its K/V has not ended");
  REQUIRE(m.free(2).ok());
  REQUIRE(m.release_export(1).ok());
  CHECK(pool.num_free_blocks() == 8);
  CHECK(m.stats().pinned_blocks == 0);
  // The full blocks stay cached: a new prompt with the same start hits them.
  admit(m, 3, with_sampled(iota_tokens(10)));
  CHECK(*m.match_prefix(3) == 8);
  require_error(m.release_export(1), absl::StatusCode::kNotFound, "no export pinned");
  require_valid(m);
}

TEST_CASE("an export refuses what it cannot hand off and changes nothing", "[handoff]") {
  EventLog log;
  KvCacheManager m = manager(&log);
  require_error(m.export_sequence(7).status(), absl::StatusCode::kNotFound, "7");
  admit(m, 2, iota_tokens(6));
  require_error(m.export_sequence(2).status(), absl::StatusCode::kFailedPrecondition,
                "waiting with 0 computed tokens");
  prefill(m);
  REQUIRE(m.allocate_draft_slots(1, 1, std::vector<TokenId>{501}).ok());
  end_step(m);
  require_error(m.export_sequence(1).status(), absl::StatusCode::kFailedPrecondition,
                "1 draft tokens wait for accept_draft()");
  REQUIRE(m.accept_draft(1, 0).ok());
  REQUIRE(m.export_sequence(1).ok());
  // A new sequence under the same id cannot be exported while the first export is pinned.
  prefill(m, 1, iota_tokens(5, 300));
  require_error(m.export_sequence(1).status(), absl::StatusCode::kAlreadyExists,
                "release_export() first");
  require_valid(m);
}

TEST_CASE("an import counts and caches its tokens only when it completes", "[handoff]") {
  EventLog log;
  KvCacheManager m = manager(&log);
  admit(m, 1, with_sampled(iota_tokens(10)));
  REQUIRE(*m.match_prefix(1) == 0);
  const absl::StatusOr<KvImport> in = m.import_slots(1, 10);
  REQUIRE(in.ok());
  CHECK(in->num_local_tokens == 0);
  CHECK(in->num_tokens == 10);
  REQUIRE(in->groups.size() == 1);
  CHECK(in->groups[0].first_entry == 0);
  CHECK(blocks_of(in->groups[0]) == Blocks{0, 1, 2});
  // Pending: computed for the allocator, but not verified, not attended, not movable.
  CHECK(m.sequence(1)->num_computed_tokens == 10);
  CHECK(log.stored_blocks() == 0);
  CHECK_FALSE(*(*m.device_pool())->is_cached(0));
  BlockTables tables;
  require_error(m.build_block_tables(std::vector<SeqId>{1}, &tables),
                absl::StatusCode::kFailedPrecondition, "10 imported tokens pending");
  require_error(m.allocate_slots(1, 1).status(), absl::StatusCode::kFailedPrecondition,
                "10 imported tokens wait for complete_import()");
  require_error(m.preempt(1, PreemptionMode::kRecompute), absl::StatusCode::kFailedPrecondition,
                "wait for complete_import()");
  require_error(m.fork(1, 2), absl::StatusCode::kFailedPrecondition, "complete_import()");
  require_error(m.complete_import(1, std::vector<int32_t>{3}).status(),
                absl::StatusCode::kFailedPrecondition, "after take_step_ops()");
  require_valid(m);
  end_step(m);
  SECTION("every block verified: all 10 tokens") {
    CHECK(*m.complete_import(1, std::vector<int32_t>{3}) == 10);
    CHECK(log.stored_blocks() == 2);
    CHECK(*(*m.device_pool())->is_cached(1));
    CHECK(m.stats().imported_tokens == 10);
    CHECK(m.stats().discarded_import_tokens == 0);
    // Decoding goes on from the sampled token.
    CHECK(allocate(m, 1, 1) == Slots{10});
  }
  SECTION("block 1 corrupt: block 0's 4 tokens count, the rest is recomputed") {
    CHECK(*m.complete_import(1, std::vector<int32_t>{1}) == 4);
    CHECK(table(m, 1) == Blocks{0});
    CHECK(log.stored_blocks() == 1);
    // Blocks 1 and 2 are free and were never cached.
    CHECK(*(*m.device_pool())->ref_count(1) == 0);
    CHECK_FALSE(*(*m.device_pool())->is_cached(1));
    CHECK(m.stats().imported_tokens == 4);
    CHECK(m.stats().discarded_import_tokens == 6);
    // The engine computes tokens 4-10 like a prefilling sequence, into new blocks 1-2.
    CHECK(allocate(m, 1, 7).size() == 7);
    CHECK(table(m, 1).size() == 3);
  }
  SECTION("nothing verified: waiting again, holding nothing") {
    CHECK(*m.complete_import(1, std::vector<int32_t>{0}) == 0);
    CHECK(m.sequence(1)->state == SequenceState::kWaiting);
    CHECK(m.sequence(1)->num_computed_tokens == 0);
    CHECK((*m.device_pool())->num_free_blocks() == 8);
    CHECK(m.stats().discarded_import_tokens == 10);
  }
  require_error(m.complete_import(1, std::vector<int32_t>{3}).status(),
                absl::StatusCode::kFailedPrecondition, "no import is pending");
  require_valid(m);
}

TEST_CASE("an import past a local prefix hit fills only the entries after it", "[handoff]") {
  EventLog log;
  KvCacheManager m = manager(&log);
  // An earlier request of the same prompt left blocks 0 and 1 cached here.
  prefill(m);
  REQUIRE(m.free(1).ok());
  admit(m, 2, with_sampled(iota_tokens(10)));
  REQUIRE(*m.match_prefix(2) == 8);
  const absl::StatusOr<KvImport> in = m.import_slots(2, 10);
  REQUIRE(in.ok());
  CHECK(in->num_local_tokens == 8);
  REQUIRE(in->groups.size() == 1);
  CHECK(in->groups[0].first_entry == 2);
  REQUIRE(in->groups[0].blocks.size() == 1);
  CHECK(table(m, 2) == Blocks{0, 1, in->groups[0].blocks[0]});
  end_step(m);
  SECTION("the block arrives: 10 tokens, 2 of them imported") {
    CHECK(*m.complete_import(2, std::vector<int32_t>{1}) == 10);
    CHECK(m.stats().imported_tokens == 2);
  }
  SECTION("it does not: the local hit stays, the 2 tokens are recomputed") {
    CHECK(*m.complete_import(2, std::vector<int32_t>{0}) == 8);
    CHECK(table(m, 2) == Blocks{0, 1});
    CHECK(m.stats().imported_tokens == 0);
    CHECK(m.stats().discarded_import_tokens == 2);
    CHECK(allocate(m, 2, 3).size() == 3);
  }
  require_valid(m);
}

TEST_CASE("a windowed group imports its window alone, and a gap in it recomputes all",
          "[handoff]") {
  EventLog log;
  KvCacheManager m =
      manager(&log, {{.kind = AttentionKind::kFull, .num_blocks = 8},
                     {.kind = AttentionKind::kSlidingWindow, .window = 6, .num_blocks = 8}});
  admit(m, 1, with_sampled(iota_tokens(10)));
  REQUIRE(*m.match_prefix(1) == 0);
  const absl::StatusOr<KvImport> in = m.import_slots(1, 10);
  REQUIRE(in.ok());
  REQUIRE(in->groups.size() == 2);
  CHECK(in->groups[0].first_entry == 0);
  CHECK(in->groups[0].blocks.size() == 3);
  // Token 10 attends from token 5: entry 0 is never needed, so it is not held at all.
  CHECK(in->groups[1].first_entry == 1);
  CHECK(in->groups[1].blocks.size() == 2);
  CHECK((*m.device_pool(1))->num_free_blocks() == 6);
  end_step(m);
  SECTION("both arrive: all 10 tokens") {
    CHECK(*m.complete_import(1, std::vector<int32_t>{3, 2}) == 10);
    CHECK(allocate(m, 1, 1) == Slots{10});
  }
  SECTION("the window's last entry is lost: no shorter prefix has its window, so none") {
    CHECK(*m.complete_import(1, std::vector<int32_t>{3, 1}) == 0);
    CHECK(m.sequence(1)->state == SequenceState::kWaiting);
    CHECK((*m.device_pool(0))->num_free_blocks() == 8);
    CHECK((*m.device_pool(1))->num_free_blocks() == 8);
    CHECK(m.stats().discarded_import_tokens == 10);
  }
  require_valid(m);
}

TEST_CASE("a windowed group's import fits a pool smaller than the prompt", "[handoff]") {
  // 10 tokens need 3 entries, the windowed pool has 2 (a window of 4 runs in 2): the
  // import allocates the window's entries only (token 10 attends from token 7: entries 1
  // and 2), so it fits.
  EventLog log;
  KvCacheManager m =
      manager(&log, {{.kind = AttentionKind::kFull, .num_blocks = 8},
                     {.kind = AttentionKind::kSlidingWindow, .window = 4, .num_blocks = 2}});
  admit(m, 1, with_sampled(iota_tokens(10)));
  REQUIRE(*m.match_prefix(1) == 0);
  const absl::StatusOr<KvImport> in = m.import_slots(1, 10);
  REQUIRE(in.ok());
  CHECK(in->groups[1].first_entry == 1);
  CHECK(blocks_of(in->groups[1]) == std::vector<BlockId>{0, 1});
  CHECK((*m.device_pool(1))->num_free_blocks() == 0);
  require_valid(m);
  end_step(m);
  REQUIRE(*m.complete_import(1, std::vector<int32_t>{3, 2}) == 10);
  // Token 10 goes into entry 2: block 2 of the full group, block 1 of the windowed one.
  CHECK(allocate(m, 1, 1) == Slots{2 * 4 + 2});
  CHECK(Slots(m.slot_mapping(1)->begin(), m.slot_mapping(1)->end()) == Slots{1 * 4 + 2});
  require_valid(m);
}

TEST_CASE("a state group's import is whole or not at all", "[handoff]") {
  EventLog log;
  KvCacheManager m = manager(&log, {{.kind = AttentionKind::kFull, .num_blocks = 8},
                                    {.kind = AttentionKind::kState, .num_blocks = 8}});
  admit(m, 1, with_sampled(iota_tokens(10)));
  REQUIRE(*m.match_prefix(1) == 0);
  const absl::StatusOr<KvImport> in = m.import_slots(1, 10);
  REQUIRE(in.ok());
  REQUIRE(in->groups.size() == 2);
  // The state after token 9 travels into the sequence's one slot.
  CHECK(in->groups[1].first_entry == 0);
  CHECK(in->groups[1].blocks.size() == 1);
  end_step(m);
  SECTION("all arrive") { CHECK(*m.complete_import(1, std::vector<int32_t>{3, 1}) == 10); }
  SECTION("the state is lost: the attention blocks alone serve nothing") {
    CHECK(*m.complete_import(1, std::vector<int32_t>{3, 0}) == 0);
  }
  SECTION("an attention block is lost: the state is of token 9, too late for token 8") {
    CHECK(*m.complete_import(1, std::vector<int32_t>{2, 1}) == 0);
    CHECK((*m.device_pool(1))->num_free_blocks() == 8);
  }
  require_valid(m);
}

TEST_CASE("an import refuses bad arguments and changes nothing", "[handoff]") {
  EventLog log;
  KvCacheManager m = manager(&log, full_attention(4));
  admit(m, 2, iota_tokens(8, 900));
  allocate(m, 2, 8);
  end_step(m);
  admit(m, 1, with_sampled(iota_tokens(10)));
  require_error(m.import_slots(1, 0).status(), absl::StatusCode::kInvalidArgument,
                "num_tokens 0 outside (0, 11]");
  require_error(m.import_slots(1, 12).status(), absl::StatusCode::kInvalidArgument,
                "num_tokens 12 outside (0, 11]");
  require_error(m.import_slots(9, 4).status(), absl::StatusCode::kNotFound, "9");
  // 10 tokens need 3 blocks; seq 2 leaves 2 free.
  require_error(m.import_slots(1, 10).status(), absl::StatusCode::kResourceExhausted, "");
  CHECK(m.sequence(1)->state == SequenceState::kWaiting);
  CHECK(m.sequence(1)->num_computed_tokens == 0);
  CHECK((*m.device_pool())->num_free_blocks() == 2);
  REQUIRE(m.free(2).ok());
  require_error(m.complete_import(1, std::vector<int32_t>{1}).status(),
                absl::StatusCode::kFailedPrecondition, "no import is pending");
  const absl::StatusOr<KvImport> in = m.import_slots(1, 8);
  REQUIRE(in.ok());
  const std::vector<BlockId> in_blocks = in->groups[0].blocks;
  require_error(m.import_slots(1, 8).status(), absl::StatusCode::kFailedPrecondition,
                "not waiting");
  end_step(m);
  require_error(m.complete_import(1, std::vector<int32_t>{1, 1}).status(),
                absl::StatusCode::kInvalidArgument, "2 verified counts for 1 layer groups");
  require_error(m.complete_import(1, std::vector<int32_t>{3}).status(),
                absl::StatusCode::kInvalidArgument, "3 verified blocks in group 0 outside [0, 2]");
  require_error(m.complete_import(1, std::vector<int32_t>{-1}).status(),
                absl::StatusCode::kInvalidArgument, "-1 verified blocks");
  CHECK(m.sequence(1)->num_computed_tokens == 8);
  require_valid(m);
  // A cancelled transfer: the engine frees the sequence once no byte can land any more.
  log.stored_blocks();
  REQUIRE(m.free(1).ok());
  CHECK((*m.device_pool())->num_free_blocks() == 4);
  CHECK(log.stored_blocks() == 0);
  CHECK_FALSE(*(*m.device_pool())->is_cached(in_blocks[0]));
  require_valid(m);
}

// Random runs of two engines (support/handoff_ops.h): prompts computed and exported,
// imported past local hits, delivered with lost and corrupt blocks, lost senders and
// cancelled transfers, then decoded with draft steps and preemption; every token a
// sequence attends reads back its own K/V, every state is its own.
TEST_CASE("hand-offs: random runs with faulty transfers never attend a wrong block", "[property]") {
  const char* env = std::getenv("PAGEDKV_PROPERTY_SEED");
  const uint64_t seed = env != nullptr ? std::strtoull(env, nullptr, 10) : 20261206;
  std::mt19937_64 rng(seed);
  HandoffOpsTotals totals;
  const int runs = kSanitized ? 100 : 500;
  for (int run = 0; run < runs; ++run) {
    std::vector<uint8_t> bytes(800);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    const std::string error = run_handoff_ops(bytes, &totals);
    INFO("seed " << seed << " run " << run);
    REQUIRE(error == "");
  }
  std::printf(
      "property test (hand-offs): seed %llu, %lld steps: %lld exports, %lld imports (%lld "
      "whole, %lld partial: %lld tokens recomputed), %lld blocks lost or corrupt, %lld "
      "senders lost, %lld imports cancelled; %lld drafts, %lld accepted; %lld preemptions\n",
      static_cast<unsigned long long>(seed), static_cast<long long>(totals.steps),
      static_cast<long long>(totals.exports), static_cast<long long>(totals.imports),
      static_cast<long long>(totals.complete_imports),
      static_cast<long long>(totals.partial_imports),
      static_cast<long long>(totals.recomputed_tokens),
      static_cast<long long>(totals.faulty_blocks), static_cast<long long>(totals.lost_senders),
      static_cast<long long>(totals.cancelled_imports), static_cast<long long>(totals.drafts),
      static_cast<long long>(totals.accepted), static_cast<long long>(totals.preemptions));
  CHECK(totals.complete_imports > 0);
  CHECK(totals.partial_imports > 0);
  CHECK(totals.recomputed_tokens > 0);
  CHECK(totals.lost_senders > 0);
  CHECK(totals.cancelled_imports > 0);
  CHECK(totals.accepted > 0);
  CHECK(totals.accepted < totals.drafts);
  CHECK(totals.preemptions > 0);
}

}  // namespace
}  // namespace pagedkv
