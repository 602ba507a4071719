// Tests of the ghost lists that the adaptive eviction policy and the host tier share
// (src/pool/ghost_lists.h): order, moves between lists, counts, stale entries.
#include <catch2/catch.hpp>

#include <cstdint>

#include "pool/ghost_lists.h"

namespace pagedkv::internal {
namespace {

TEST_CASE("ghost lists: a re-added key moves to its new list and is counted once", "[ghost]") {
  GhostLists<uint64_t, 2> ghosts;
  ghosts.add(7, 0);
  ghosts.add(8, 0);
  ghosts.add(7, 1);
  CHECK(ghosts.size(0) == 1);
  CHECK(ghosts.size(1) == 1);
  REQUIRE(ghosts.check_invariants().ok());
  // The stale entry of 7 in list 0 is skipped: list 0's oldest ghost is 8.
  ghosts.pop_oldest(0);
  CHECK(ghosts.size(0) == 0);
  CHECK(ghosts.take(8) == std::nullopt);
  CHECK(ghosts.take(7) == 1);
  CHECK(ghosts.size(1) == 0);
  REQUIRE(ghosts.check_invariants().ok());
}

TEST_CASE("ghost lists: oldest first, and many re-adds keep the order bounded", "[ghost]") {
  GhostLists<uint64_t, 1> ghosts;
  for (uint64_t round = 0; round < 100; ++round) {
    for (uint64_t key = 0; key < 4; ++key) ghosts.add(key, 0);
  }
  CHECK(ghosts.size(0) == 4);
  REQUIRE(ghosts.check_invariants().ok());
  ghosts.pop_oldest(0);
  CHECK(ghosts.take(0) == std::nullopt);  // key 0 was the oldest
  CHECK(ghosts.take(3) == 0);
  ghosts.clear();
  CHECK(ghosts.size(0) == 0);
  CHECK(ghosts.take(1) == std::nullopt);
  REQUIRE(ghosts.check_invariants().ok());
}

}  // namespace
}  // namespace pagedkv::internal
