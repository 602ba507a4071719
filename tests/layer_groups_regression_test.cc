// Regressions the decode loop's hybrid model (--model swa) found in KvCacheManager's layer
// groups, each reduced to the fewest calls that show it.
#include <catch2/catch.hpp>

#include "pagedkv/kv_cache_manager.h"
#include "support/manager_test_util.h"

namespace pagedkv {
namespace {

using testing::allocate;
using testing::end_step;
using testing::iota_tokens;
using testing::make_manager;
using testing::require_valid;

// A sliding-window sequence swapped out after its window moved on, then swapped back in:
// preempt() sets num_offered_blocks to 0, so swap_in()'s offer_computed_blocks() offers
// the windowed table from entry 0, whose released entries (before first_held) hold
// kNoBlock: the windowed device pool caches "block -1", writing its per-block state and
// hash index out of bounds (check_invariants() then reports "num_standby 2 but 1 counted"
// here; in the decode loop "index entry points at invalid id -1" or "index entry for block
// 16 does not match the block's hash", and the heap is corrupted). The decode loop hit it
// with `--model swa` at its first swap-in. offer_computed_blocks() now offers a windowed
// table's held entries only.
TEST_CASE("swap_in of a windowed sequence offers only its held blocks to the index",
          "[layer_groups]") {
  KvCacheManager m = make_manager(
      {.block_size = 4,
       .layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 16, .num_host_blocks = 16},
                        {.kind = AttentionKind::kSlidingWindow,
                         .window = 4,
                         .num_blocks = 16,
                         .num_host_blocks = 16}}});
  REQUIRE(m.add_sequence(1, iota_tokens(12)).ok());
  allocate(m, 1, 12);  // 3 full blocks in each group
  end_step(m);
  const TokenId next = 7;
  REQUIRE(m.append_tokens(1, {&next, 1}).ok());
  allocate(m, 1, 1);  // token 12 attends to [9, 12]: entries 0 and 1 released
  end_step(m);
  absl::StatusOr<SequenceView> window = m.sequence(1, 1);
  REQUIRE(window.ok());
  REQUIRE(window->first_held_block == 2);
  REQUIRE(m.preempt(1, PreemptionMode::kSwap).ok());
  require_valid(m);
  end_step(m);
  REQUIRE(m.swap_in(1).ok());
  require_valid(m);  // failed before the fix: the index held an entry for block -1
}

}  // namespace
}  // namespace pagedkv
