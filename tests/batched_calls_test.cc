// KvCacheManager::allocate_slots_batch() and append_tokens_batch(): exact slots, statuses
// and preemptions, worked out by hand in the comments.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "support/manager_test_util.h"

namespace pagedkv {
namespace {

using namespace pagedkv::testing;  // NOLINT: the shared test helpers

using Codes = std::vector<absl::StatusCode>;

Codes codes(std::span<const absl::Status> statuses) {
  Codes out;
  for (const absl::Status& s : statuses) out.push_back(s.code());
  return out;
}

Slots slots(const KvCacheManager::SlotBatch& batch) {
  return Slots(batch.slots.begin(), batch.slots.end());
}

TEST_CASE("allocate_slots_batch gives each sequence the slots allocate_slots would") {
  // Block size 4, 8 blocks. Sequence 1 (6 tokens) gets blocks 0-1, sequence 2 (3 tokens)
  // block 2; one decode step then adds token 7 of seq 1 (block 1, offset 2) and token 4 of
  // seq 2 (block 2, offset 3).
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(8)});
  admit(m, 1, iota_tokens(6));
  admit(m, 2, iota_tokens(3, 500));
  const SeqId seqs[] = {1, 2};
  const int32_t prompt_lens[] = {6, 3};
  auto prefill = m.allocate_slots_batch(seqs, prompt_lens);
  REQUIRE(prefill.ok());
  CHECK(slots(*prefill) == Slots{0, 1, 2, 3, 4, 5, 8, 9, 10});
  CHECK(prefill->num_failed == 0);
  CHECK(codes(prefill->statuses) == Codes{absl::StatusCode::kOk, absl::StatusCode::kOk});
  end_step(m);

  const TokenId next[] = {70, 80};
  auto appended = m.append_tokens_batch(seqs, next);
  REQUIRE(appended.ok());
  CHECK(codes(*appended) == Codes{absl::StatusCode::kOk, absl::StatusCode::kOk});
  const int32_t one[] = {1};
  auto decode = m.allocate_slots_batch(seqs, one);
  REQUIRE(decode.ok());
  CHECK(slots(*decode) == Slots{1 * 4 + 2, 2 * 4 + 3});
  CHECK(m.sequence(1)->tokens.back() == 70);
  CHECK(m.sequence(2)->num_computed_tokens == 4);
  require_valid(m);
}

TEST_CASE("allocate_slots_batch reports failures per sequence and fills their slots with -1") {
  // 2 blocks of 4: seq 1 takes both with 8 tokens; seq 2 (4 tokens) finds none free; seq 3
  // is unknown; seq 4 (2 tokens) is asked for a negative count.
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(2)});
  admit(m, 1, iota_tokens(8));
  admit(m, 2, iota_tokens(4, 300));
  admit(m, 4, iota_tokens(2, 400));
  const SeqId seqs[] = {1, 2, 3, 4};
  const int32_t counts[] = {8, 4, 1, -1};
  auto batch = m.allocate_slots_batch(seqs, counts);
  REQUIRE(batch.ok());
  // 8 + 4 + 1 + 0 slots: seq 1's, then -1 for seqs 2 and 3, nothing for the negative count.
  CHECK(slots(*batch) == Slots{0, 1, 2, 3, 4, 5, 6, 7, -1, -1, -1, -1, -1});
  CHECK(codes(batch->statuses) == Codes{absl::StatusCode::kOk, absl::StatusCode::kResourceExhausted,
                                        absl::StatusCode::kNotFound,
                                        absl::StatusCode::kInvalidArgument});
  CHECK(batch->num_failed == 3);
  CHECK(m.sequence(2)->state == SequenceState::kWaiting);
  require_valid(m);
}

TEST_CASE(
    "allocate_slots_batch with preempt never re-admits a sequence an earlier entry preempted") {
  // 3 blocks of 4. Seqs 1 and 2 run with 4 tokens each (blocks 0 and 1), seq 3 (8 tokens)
  // waits. In one batch, seq 3 needs 2 blocks: 1 free, so the default policy preempts the
  // latest arrival among the others, seq 2 (recompute), freeing block 1. Seq 2 is next in
  // the batch: it fails with FailedPrecondition instead of taking blocks back.
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(3)});
  admit(m, 1, iota_tokens(4));
  admit(m, 2, iota_tokens(4, 200));
  const SeqId first[] = {1, 2};
  const int32_t four[] = {4};
  REQUIRE(m.allocate_slots_batch(first, four)->num_failed == 0);
  end_step(m);
  admit(m, 3, iota_tokens(8, 300));
  const SeqId seqs[] = {3, 2};
  const int32_t counts[] = {8, 4};
  auto batch = m.allocate_slots_batch(seqs, counts, /*num_lookahead=*/0, /*preempt=*/true);
  REQUIRE(batch.ok());
  CHECK(codes(batch->statuses) ==
        Codes{absl::StatusCode::kOk, absl::StatusCode::kFailedPrecondition});
  CHECK(batch->statuses[1].message() ==
        "allocate_slots_batch(seq 2): preempted by an earlier sequence of this batch");
  // Seq 3: clean block 2 first, then block 1 that seq 2 left (cached at the tail).
  CHECK(slots(*batch) == Slots{8, 9, 10, 11, 4, 5, 6, 7, -1, -1, -1, -1});
  CHECK(m.sequence(2)->state == SequenceState::kWaiting);
  CHECK(m.stats().preemptions_recompute == 1);
  require_valid(m);

  SECTION("a later batch admits it again") {
    end_step(m);
    REQUIRE(m.free(3).ok());
    const SeqId again[] = {2};
    auto later = m.allocate_slots_batch(again, four);
    REQUIRE(later.ok());
    CHECK(later->num_failed == 0);
  }
}

TEST_CASE("batched calls refuse mismatched sizes and change nothing") {
  KvCacheManager m = make_manager({.block_size = 4, .layer_groups = full_attention(4)});
  admit(m, 1, iota_tokens(4));
  admit(m, 2, iota_tokens(4, 200));
  const SeqId seqs[] = {1, 2};
  const int32_t three_counts[] = {1, 1, 1};
  auto batch = m.allocate_slots_batch(seqs, three_counts);
  CHECK(batch.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(batch.status().message() ==
        "allocate_slots_batch: 3 num_new_tokens for 2 sequences; give one per sequence or one "
        "for all");
  const int32_t huge[] = {1, INT32_MAX};  // sized before any call would be 16 GiB of slots
  CHECK(m.allocate_slots_batch(seqs, huge).status().message() ==
        "allocate_slots_batch(seq 2): num_new_tokens 2147483647 exceeds max_model_len 1048576");
  const TokenId one_token[] = {5};
  CHECK(m.append_tokens_batch(seqs, one_token).status().code() ==
        absl::StatusCode::kInvalidArgument);
  const TokenId tokens[] = {5, 6, 7};
  const int32_t short_indptr[] = {0, 1};
  CHECK(m.append_tokens_batch(seqs, tokens, short_indptr).status().message() ==
        "append_tokens_batch: 2 indptr entries for 2 sequences");
  const int32_t bad_indptr[] = {0, 2, 4};
  CHECK(m.append_tokens_batch(seqs, tokens, bad_indptr).status().message() ==
        "append_tokens_batch: indptr[1:3] = [2, 4] is not a range of the 3 tokens");
  CHECK(m.sequence(1)->tokens.size() == 4);
  CHECK(m.sequence(2)->tokens.size() == 4);
  CHECK(m.sequence(1)->state == SequenceState::kWaiting);
  require_valid(m);
}

TEST_CASE("append_tokens_batch appends ranges given by indptr, each sequence on its own") {
  KvCacheManager m =
      make_manager({.block_size = 4, .max_model_len = 6, .layer_groups = full_attention(4)});
  admit(m, 1, iota_tokens(4));
  admit(m, 2, iota_tokens(4, 200));
  const SeqId seqs[] = {1, 2, 9};
  // Seq 1 gets 2 tokens (6: at max_model_len), seq 2 would reach 7 (refused), seq 9 is
  // unknown and gets none.
  const TokenId tokens[] = {10, 11, 20, 21, 22};
  const int32_t indptr[] = {0, 2, 5, 5};
  auto statuses = m.append_tokens_batch(seqs, tokens, indptr);
  REQUIRE(statuses.ok());
  CHECK(codes(*statuses) == Codes{absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument,
                                  absl::StatusCode::kNotFound});
  CHECK(std::vector<TokenId>(m.sequence(1)->tokens.begin(), m.sequence(1)->tokens.end()) ==
        std::vector<TokenId>{100, 101, 102, 103, 10, 11});
  CHECK(m.sequence(2)->tokens.size() == 4);
  require_valid(m);
}

}  // namespace
}  // namespace pagedkv
