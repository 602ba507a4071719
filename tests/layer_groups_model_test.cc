// Hand-built layer-group cases run on KvCacheManager and on the reference model
// (tests/support/reference_model.h) in lockstep: the hit rule across groups in the corners
// that random operations reach rarely (a later windowed group cutting the hit so that an
// earlier one must be asked again; windowed entries promoted from the host tier), with the
// expected values worked out by hand, so that the model is checked too.
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/layer_group.h"
#include "support/reference_model.h"

namespace pagedkv::testing {
namespace {

// The manager and the model, driven by the same calls.
struct Lockstep {
  explicit Lockstep(KvCacheManager::Options options)
      : manager(*KvCacheManager::create(options)), model(options) {}

  void add(SeqId id, std::span<const TokenId> prompt, SequenceOptions options = {}) {
    REQUIRE(manager.add_sequence(id, prompt, options).ok());
    REQUIRE(model.add_sequence(id, prompt, options.priority, options.extra_keys,
                               options.retention) == absl::StatusCode::kOk);
  }
  int32_t match(SeqId id) {
    const absl::StatusOr<int32_t> got = manager.match_prefix(id);
    REQUIRE(got.ok());
    const auto [code, expected] = model.match_prefix(id);
    REQUIRE(code == absl::StatusCode::kOk);
    CHECK(*got == expected);
    return *got;
  }
  void allocate(SeqId id, int32_t n) {
    REQUIRE(manager.allocate_slots(id, n).ok());
    REQUIRE(model.allocate_slots(id, n, 0).first == absl::StatusCode::kOk);
  }
  void free(SeqId id) {
    REQUIRE(manager.free(id).ok());
    REQUIRE(model.free(id) == absl::StatusCode::kOk);
  }
  void step() {
    const StepOps got = manager.take_step_ops();
    const StepOps expected = model.take_step_ops();
    CHECK(got.demote == expected.demote);
    CHECK(got.promote == expected.promote);
    CHECK(got.exchange == expected.exchange);
  }
  // Every group's table of `id` and every group's counters agree.
  void check(SeqId id) {
    REQUIRE(manager.check_invariants().ok());
    for (int32_t g = 0; g < manager.num_groups(); ++g) {
      INFO("group " << g);
      const SequenceView view = *manager.sequence(id, g);
      CHECK(std::vector<BlockId>(view.block_table.begin(), view.block_table.end()) ==
            model.find(id)->table(g));
      CHECK(view.first_held_block == model.find(id)->tables[g].first_held);
      const KvCacheManager::GroupStats a = *manager.group_stats(g);
      const KvCacheManager::GroupStats b = model.group_stats(g);
      CHECK(a.used_blocks == b.used_blocks);
      CHECK(a.cached_free_blocks == b.cached_free_blocks);
      CHECK(a.evictions == b.evictions);
      CHECK(a.hit_blocks == b.hit_blocks);
      CHECK(a.blocks_demoted == b.blocks_demoted);
      CHECK(a.blocks_promoted == b.blocks_promoted);
    }
  }

  KvCacheManager manager;
  ReferenceModel model;
};

// Block size 2. Group 0: a sliding window of 2 tokens (a hit of p blocks needs entry p - 1).
// Group 1: chunks of 4 tokens (an even p needs no entry, an odd p entry p - 1). Group 2:
// full. Sequence 1 computes 13 tokens and is freed with retention priorities that make
// entry 3 the first block evicted and entry 4 the second; sequence 2 (6 other tokens) then
// takes 3 blocks of every pool, which evicts entry 3 in group 0 (2 clean blocks there) and
// entries 3 and 4 in group 1 (1 clean block), and nothing in group 2.
Lockstep evicted_middle(bool host_tier) {
  const int32_t host = host_tier ? 8 : 0;
  Lockstep s({.block_size = 2,
              .enable_host_cache = host_tier,
              .layer_groups = {
                  {.kind = AttentionKind::kSlidingWindow,
                   .window = 2,
                   .num_blocks = 8,
                   .num_host_blocks = host},
                  {.kind = AttentionKind::kChunkedLocal,
                   .window = 4,
                   .num_blocks = 7,
                   .num_host_blocks = host},
                  {.kind = AttentionKind::kFull, .num_blocks = 16, .num_host_blocks = host}}});
  const TokenId text[] = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23};
  s.add(1, text,
        {.retention = {{.begin = 0, .end = 13, .priority = 90},
                       {.begin = 6, .end = 8, .priority = 0},
                       {.begin = 8, .end = 10, .priority = 20}}});
  s.allocate(1, 13);
  s.step();
  s.free(1);
  const TokenId other[] = {1, 2, 3, 4, 5, 6};
  s.add(2, other);
  s.allocate(2, 6);
  s.step();
  s.check(2);
  CHECK(s.manager.group_stats(0)->evictions == 1);
  CHECK(s.manager.group_stats(1)->evictions == 2);
  CHECK(s.manager.group_stats(2)->evictions == 0);
  // Sequence 3 asks for the first 11 tokens again: at most 5 blocks, all in group 2.
  s.add(3, std::span<const TokenId>(text).first(11));
  return s;
}

TEST_CASE("a windowed group that cuts the hit makes the groups before it answer again",
          "[layer_groups]") {
  // Round 1: group 0 serves 5 blocks (entry 4 is there), group 1 cuts to 4 (entry 4 is
  // gone; 4 needs no entry). Round 2: group 0 cannot serve 4 (entry 3 is gone) and cuts to
  // 3 (entry 2), which group 1 serves (entry 2). One round would claim 4 blocks with group
  // 0's entry 3 missing.
  Lockstep s = evicted_middle(/*host_tier=*/false);
  CHECK(s.match(3) == 6);
  s.check(3);
  CHECK(s.manager.sequence(3, 0)->first_held_block == 2);
  CHECK(s.manager.sequence(3, 1)->first_held_block == 2);
  CHECK(s.manager.group_stats(0)->hit_blocks == 1);
  CHECK(s.manager.group_stats(1)->hit_blocks == 1);
  CHECK(s.manager.group_stats(2)->hit_blocks == 3);
}

TEST_CASE("windowed entries in the host tier come back by promotion and keep the hit",
          "[layer_groups]") {
  // With the tier the evicted entries were demoted: group 1 promotes its entry 4, and the
  // hit keeps all 5 blocks (group 0 needs only entry 4, which it holds on the device).
  Lockstep s = evicted_middle(/*host_tier=*/true);
  CHECK(s.manager.group_stats(0)->blocks_demoted == 1);
  CHECK(s.manager.group_stats(1)->blocks_demoted == 2);
  CHECK(s.match(3) == 10);
  s.check(3);
  CHECK(s.manager.group_stats(0)->blocks_promoted == 0);
  CHECK(s.manager.group_stats(1)->blocks_promoted == 1);
  CHECK(s.manager.group_stats(2)->blocks_promoted == 0);
  const StepOps ops = s.manager.take_step_ops();
  REQUIRE(ops.promote.size() + ops.exchange.size() == 1);
  CHECK((ops.promote.empty() ? ops.exchange[0].group : ops.promote[0].group) == 1);
}

}  // namespace
}  // namespace pagedkv::testing
