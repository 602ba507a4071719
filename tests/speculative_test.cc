// Tests of KvCacheManager's speculative decoding: slots for a step's draft tokens, which
// count as computed for the step but are never cached, announced or checkpointed until
// accept_draft() keeps the accepted ones and rolls the rest back. Exact values are worked out
// in the comments: a fresh pool hands out its clean blocks in id order.
#include <catch2/catch.hpp>

#include <vector>

#include "pagedkv/kv_cache_manager.h"
#include "support/manager_test_util.h"

namespace pagedkv {
namespace {

using namespace pagedkv::testing;  // NOLINT: the shared test helpers

// A sequence of 10 computed tokens (blocks 0-2 of 4 tokens) that just sampled token 10.
KvCacheManager decoding(EventLog* log, KvCacheManager::Options options = {}) {
  options.block_size = 4;
  options.event_sink = log;
  if (options.layer_groups.empty()) options.layer_groups = full_attention(8);
  KvCacheManager m = make_manager(std::move(options));
  admit(m, 1, iota_tokens(10));
  allocate(m, 1, 10);
  end_step(m);
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{500}).ok());
  return m;
}

TEST_CASE("drafts get slots and count as computed, but are never cached before they are accepted",
          "[speculative]") {
  EventLog log;
  KvCacheManager m = decoding(&log);
  CHECK(log.stored_blocks() == 2);  // blocks 0 and 1
  const std::vector<TokenId> draft = {501, 502, 503};
  // Token 10 and the drafts at 11-13: block 2's last two slots, then block 3.
  auto slots = m.allocate_draft_slots(1, 1, draft);
  REQUIRE(slots.ok());
  CHECK(Slots(slots->begin(), slots->end()) == Slots{10, 11, 12, 13});
  CHECK(table(m, 1) == Blocks{0, 1, 2, 3});
  const SequenceView v = *m.sequence(1);
  CHECK(v.num_computed_tokens == 14);
  CHECK(v.num_draft_tokens == 3);
  CHECK(v.tokens.size() == 14);
  // Block 2 is full (tokens 8-11) but holds draft 501: neither cached nor announced.
  CHECK(log.stored_blocks() == 0);
  CHECK_FALSE(*(*m.device_pool())->is_cached(2));
  CHECK(m.stats().draft_tokens == 3);
  require_valid(m);
}

TEST_CASE("accept_draft keeps the accepted drafts and releases what held only rejected ones",
          "[speculative]") {
  const std::vector<TokenId> draft = {501, 502, 503};
  SECTION("one accepted: block 3 held only rejected drafts") {
    EventLog log;
    KvCacheManager m = decoding(&log);
    REQUIRE(m.allocate_draft_slots(1, 1, draft).ok());
    require_error(m.accept_draft(1, 1), absl::StatusCode::kFailedPrecondition,
                  "the step that writes its drafts' K/V has not ended");
    end_step(m);
    log.stored_blocks();
    REQUIRE(m.accept_draft(1, 1).ok());
    const SequenceView v = *m.sequence(1);
    CHECK(v.num_computed_tokens == 12);
    CHECK(v.num_draft_tokens == 0);
    CHECK(std::vector<TokenId>(v.tokens.begin() + 10, v.tokens.end()) ==
          std::vector<TokenId>{500, 501});
    CHECK(table(m, 1) == Blocks{0, 1, 2});
    // Block 2 (8-11) is verified now: cached and announced. Block 3 is clean and free.
    CHECK(log.stored_blocks() == 1);
    CHECK(*(*m.device_pool())->is_cached(2));
    CHECK(*(*m.device_pool())->ref_count(3) == 0);
    CHECK_FALSE(*(*m.device_pool())->is_cached(3));
    CHECK(m.stats().accepted_draft_tokens == 1);
    // Decoding goes on from token 12, into block 3 again.
    REQUIRE(m.append_tokens(1, std::vector<TokenId>{600}).ok());
    CHECK(allocate(m, 1, 1) == Slots{12});
  }
  SECTION("all accepted: every slot stays") {
    EventLog log;
    KvCacheManager m = decoding(&log);
    REQUIRE(m.allocate_draft_slots(1, 1, draft).ok());
    end_step(m);
    REQUIRE(m.accept_draft(1, 3).ok());
    CHECK(m.sequence(1)->num_computed_tokens == 14);
    CHECK(table(m, 1) == Blocks{0, 1, 2, 3});
  }
  SECTION("none accepted: back to the sampled token") {
    EventLog log;
    KvCacheManager m = decoding(&log);
    REQUIRE(m.allocate_draft_slots(1, 1, draft).ok());
    end_step(m);
    log.stored_blocks();
    REQUIRE(m.accept_draft(1, 0).ok());
    CHECK(m.sequence(1)->num_computed_tokens == 11);
    CHECK(m.sequence(1)->tokens.size() == 11);
    CHECK(table(m, 1) == Blocks{0, 1, 2});
    CHECK(log.stored_blocks() == 0);  // block 2 holds 3 verified tokens: not full
    CHECK_FALSE(*(*m.device_pool())->is_cached(2));
  }
}

TEST_CASE("a draft step refuses what it cannot do and changes nothing", "[speculative]") {
  EventLog log;
  KvCacheManager m = decoding(&log, {.layer_groups = full_attention(4)});
  const std::vector<TokenId> draft = {501, 502};
  require_error(m.allocate_draft_slots(1, 0, draft).status(), absl::StatusCode::kInvalidArgument,
                "need the sequence's 1 uncomputed tokens (at least 1)");
  require_error(m.allocate_draft_slots(1, 1, {}).status(), absl::StatusCode::kInvalidArgument,
                "at least 1 draft");
  require_error(m.accept_draft(1, 0), absl::StatusCode::kFailedPrecondition, "holds no drafts");
  // 11 tokens + 6 drafts need 5 blocks; the pool has 4.
  const std::vector<TokenId> long_draft(6, 7);
  require_error(m.allocate_draft_slots(1, 1, long_draft).status(),
                absl::StatusCode::kInvalidArgument, "17 slots need 5 blocks; the pool has 4");
  CHECK(m.sequence(1)->tokens.size() == 11);
  CHECK(m.sequence(1)->num_draft_tokens == 0);
  // With drafts waiting, the sequence takes no other step.
  REQUIRE(m.allocate_draft_slots(1, 1, draft).ok());
  require_error(m.allocate_draft_slots(1, 1, draft).status(), absl::StatusCode::kFailedPrecondition,
                "2 draft tokens wait for accept_draft()");
  require_error(m.append_tokens(1, std::vector<TokenId>{9}), absl::StatusCode::kFailedPrecondition,
                "append_tokens(seq 1): 2 draft tokens wait");
  require_error(m.allocate_slots(1, 0).status(), absl::StatusCode::kFailedPrecondition,
                "allocate_slots(seq 1): 2 draft tokens wait");
  require_error(m.fork(1, 2), absl::StatusCode::kFailedPrecondition, "fork(seq 1)");
  end_step(m);
  require_error(m.preempt(1, PreemptionMode::kRecompute), absl::StatusCode::kFailedPrecondition,
                "preempt(seq 1): 2 draft tokens wait");
  require_error(m.accept_draft(1, 3), absl::StatusCode::kInvalidArgument,
                "num_accepted 3 outside [0, 2]");
  REQUIRE(m.accept_draft(1, 2).ok());
  require_valid(m);
  // Every token is computed now: drafts need the next sampled token before them.
  require_error(m.allocate_draft_slots(1, 1, std::vector<TokenId>{9}).status(),
                absl::StatusCode::kInvalidArgument, "need the sequence's 0 uncomputed tokens");
  // free() takes a sequence with drafts too.
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{600}).ok());
  REQUIRE(m.allocate_draft_slots(1, 1, std::vector<TokenId>{601}).ok());
  REQUIRE(m.free(1).ok());
  CHECK((*m.device_pool())->num_free_blocks() == 4);
  require_valid(m);
}

TEST_CASE("a state group keeps the state of the last accepted draft", "[speculative]") {
  EventLog log;
  KvCacheManager m =
      decoding(&log, {.layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 8},
                                       {.kind = AttentionKind::kState, .num_blocks = 8}}});
  // The sequence's slot is 0, its prompt-end checkpoint (8 tokens) slot 1.
  const absl::StatusOr<std::span<const int64_t>> slots =
      m.allocate_draft_slots(1, 1, std::vector<TokenId>{501, 502, 503});
  REQUIRE(slots.ok());
  // The sampled token's state is updated in place; each draft's goes to a slot of its own.
  const absl::StatusOr<std::span<const int64_t>> state = m.slot_mapping(1);
  REQUIRE(state.ok());
  CHECK(Slots(state->begin(), state->end()) == Slots{-1, 2, 3, 4});
  end_step(m);
  SECTION("two accepted: the slot after draft 2") {
    REQUIRE(m.accept_draft(1, 2).ok());
    CHECK(*m.sequence(1, 1)->block_table.data() == 3);
    CHECK((*m.device_pool(1))->num_free_blocks() == 7);  // slot 3 alone is in use
  }
  SECTION("none accepted: its own slot") {
    REQUIRE(m.accept_draft(1, 0).ok());
    CHECK(*m.sequence(1, 1)->block_table.data() == 0);
    CHECK((*m.device_pool(1))->num_free_blocks() == 7);
  }
  require_valid(m);
}

TEST_CASE("a windowed group's drafts roll back like a full group's", "[speculative]") {
  EventLog log;
  KvCacheManager m = decoding(
      &log,
      {.layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 8},
                        {.kind = AttentionKind::kSlidingWindow, .window = 6, .num_blocks = 8}}});
  // Token 10 attends from 5: entry 0 goes before the step's slots are given.
  REQUIRE(m.allocate_draft_slots(1, 1, std::vector<TokenId>{501, 502, 503}).ok());
  CHECK(m.sequence(1, 1)->first_held_block == 1);
  end_step(m);
  REQUIRE(m.accept_draft(1, 1).ok());
  const SequenceView window = *m.sequence(1, 1);
  CHECK(std::vector<BlockId>(window.block_table.begin(), window.block_table.end()) ==
        Blocks{kNoBlock, 1, 2});
  require_valid(m);
}

// Seqs 1 and 2 (prompts of 10 and 7 tokens) computed, each with a sampled token appended.
KvCacheManager two_decoding(EventLog* log) {
  KvCacheManager m =
      make_manager({.block_size = 4,
                    .event_sink = log,
                    .layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 16},
                                     {.kind = AttentionKind::kState, .num_blocks = 8}}});
  admit(m, 1, iota_tokens(10));
  admit(m, 2, iota_tokens(7, 300));
  allocate(m, 1, 10);
  allocate(m, 2, 7);
  end_step(m);
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{500}).ok());
  REQUIRE(m.append_tokens(2, std::vector<TokenId>{600}).ok());
  return m;
}

TEST_CASE("a batched speculative step equals the single calls, sequence by sequence",
          "[speculative]") {
  EventLog single_log;
  EventLog batch_log;
  KvCacheManager single = two_decoding(&single_log);
  KvCacheManager batch = two_decoding(&batch_log);
  const std::vector<TokenId> draft1 = {501, 502, 503};
  const std::vector<TokenId> draft2 = {601};
  // The single calls, each group's slots kept as the batch lays them out.
  Slots single_slots;
  Slots single_state;
  for (const auto& [seq, draft] : {std::pair{SeqId{1}, draft1}, std::pair{SeqId{2}, draft2}}) {
    const auto slots = single.allocate_draft_slots(seq, 1, draft);
    REQUIRE(slots.ok());
    single_slots.insert(single_slots.end(), slots->begin(), slots->end());
    const auto state = single.slot_mapping(1);
    single_state.insert(single_state.end(), state->begin(), state->end());
  }
  // Seq 9 does not exist and seq 2 is listed twice: both fail on their own, with -1 slots.
  const std::vector<SeqId> seqs = {1, 9, 2, 2};
  const std::vector<TokenId> drafts = {501, 502, 503, 700, 601, 602};
  const std::vector<int32_t> indptr = {0, 3, 4, 5, 6};
  const auto got = batch.allocate_draft_slots_batch(seqs, std::vector<int32_t>{1}, drafts, indptr);
  REQUIRE(got.ok());
  CHECK(got->num_failed == 2);
  CHECK(got->statuses[1].code() == absl::StatusCode::kNotFound);
  CHECK(got->statuses[3].code() == absl::StatusCode::kFailedPrecondition);  // drafts wait
  // The single calls' slots with -1 entries for seq 9 (1 + 1) and seq 2's second entry.
  const auto with_failed = [](const Slots& singles) {
    Slots out(singles.begin(), singles.begin() + 4);
    for (const int64_t part : {-1, -1}) out.push_back(part);
    out.insert(out.end(), singles.begin() + 4, singles.end());
    for (const int64_t part : {-1, -1}) out.push_back(part);
    return out;
  };
  CHECK(Slots(got->slots.begin(), got->slots.end()) == with_failed(single_slots));
  const auto state = batch.batch_slot_mapping(1);
  CHECK(Slots(state->begin(), state->end()) == with_failed(single_state));
  end_step(single);
  end_step(batch);
  // The verdicts: seq 1 keeps one draft, seq 2 all; seq 9 fails alone.
  REQUIRE(single.accept_draft(1, 1).ok());
  REQUIRE(single.accept_draft(2, 1).ok());
  const auto verdicts =
      batch.accept_draft_batch(std::vector<SeqId>{1, 9, 2}, std::vector<int32_t>{1, 0, 1});
  REQUIRE(verdicts.ok());
  CHECK((*verdicts)[0].ok());
  CHECK((*verdicts)[1].code() == absl::StatusCode::kNotFound);
  CHECK((*verdicts)[2].ok());
  for (const SeqId seq : {1, 2}) {
    for (int32_t g = 0; g < 2; ++g) {
      const SequenceView a = *single.sequence(seq, g);
      const SequenceView b = *batch.sequence(seq, g);
      CHECK(std::vector<TokenId>(a.tokens.begin(), a.tokens.end()) ==
            std::vector<TokenId>(b.tokens.begin(), b.tokens.end()));
      CHECK(std::vector<BlockId>(a.block_table.begin(), a.block_table.end()) ==
            std::vector<BlockId>(b.block_table.begin(), b.block_table.end()));
      CHECK(a.num_computed_tokens == b.num_computed_tokens);
    }
  }
  CHECK(single.stats().accepted_draft_tokens == batch.stats().accepted_draft_tokens);
  CHECK(single_log.stored_blocks() == batch_log.stored_blocks());
  require_valid(batch);
}

TEST_CASE("batched draft calls refuse malformed batches and change nothing", "[speculative]") {
  EventLog log;
  KvCacheManager m = two_decoding(&log);
  const std::vector<SeqId> seqs = {1, 2};
  const std::vector<TokenId> drafts = {501, 601};
  require_error(m.allocate_draft_slots_batch(seqs, std::vector<int32_t>{1, 1, 1}, drafts,
                                             std::vector<int32_t>{0, 1, 2})
                    .status(),
                absl::StatusCode::kInvalidArgument,
                "allocate_draft_slots_batch: 3 num_new_tokens for 2 sequences");
  require_error(m.allocate_draft_slots_batch(seqs, std::vector<int32_t>{1}, drafts,
                                             std::vector<int32_t>{0, 2})
                    .status(),
                absl::StatusCode::kInvalidArgument,
                "allocate_draft_slots_batch: 2 indptr entries for 2 sequences");
  require_error(m.allocate_draft_slots_batch(seqs, std::vector<int32_t>{1}, drafts,
                                             std::vector<int32_t>{0, 2, 1})
                    .status(),
                absl::StatusCode::kInvalidArgument,
                "indptr[1:3] = [2, 1] is not a range of the 2 tokens");
  require_error(m.allocate_draft_slots_batch(seqs, std::vector<int32_t>{1 << 30}, drafts,
                                             std::vector<int32_t>{0, 1, 2})
                    .status(),
                absl::StatusCode::kInvalidArgument,
                "allocate_draft_slots_batch(seq 1): num_new_tokens 1073741824 exceeds");
  require_error(m.accept_draft_batch(seqs, std::vector<int32_t>{0}).status(),
                absl::StatusCode::kInvalidArgument, "1 num_accepted for 2 sequences");
  CHECK(m.sequence(1)->tokens.size() == 11);
  CHECK(m.sequence(1)->num_draft_tokens == 0);
  CHECK(m.stats().draft_tokens == 0);
  require_valid(m);
}

}  // namespace
}  // namespace pagedkv
