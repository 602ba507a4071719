// Property tests of KvCacheManager: seeded random operation sequences, run through the same
// decoder, reference model and checks as the fuzzers (tests/support/manager_ops.h), so that a
// machine without clang still gets the coverage.
//
// Workload modelled: an engine admitting requests with shared and unshared prompts and
// salts, prefix matching, prefill and decode allocation with lookahead, appends, forks for
// parallel sampling, frees, preemption by recompute and by swap, swap-in, steps that take
// the pending copies, prefix-cache resets and block tables, on tiny and odd pool and block
// sizes, with valid and invalid arguments mixed in. After every operation: check_invariants(),
// the reference model (status codes, tables, ref counts, free queue order, hits, counters,
// events) and, after every step, the KV data-flow check. The layer-group cases run the same
// mix on managers of 1 to 3 layer groups (full, sliding window, chunked local, each with
// pools of its own), checked group by group.
//
// Deterministic: each test prints its seed; PAGEDKV_PROPERTY_SEED=<n> reruns with another
// seed, PAGEDKV_PROPERTY_RUNS=<n> changes the number of runs and PAGEDKV_PROPERTY_RUN=<r>
// replays run r alone (PAGEDKV_OPS_TRACE=1 prints its operations). Runs shrink under
// sanitizers. Nothing here is timed.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support/manager_ops.h"
#include "support/sanitizers.h"

namespace pagedkv::testing {
namespace {

constexpr int kSanitizerDivisor = kSanitized ? 16 : 1;

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::strtoull(value, nullptr, 10) : fallback;
}

struct Totals {
  int64_t ops = 0;
  int64_t runs_created = 0;
  KvCacheManager::Stats stats;
  // Runs with layer groups: how many had 2 and 3 groups, windowed groups of each kind, and
  // what the windowed groups did.
  int64_t runs_by_groups[4] = {};
  int64_t sliding_groups = 0;
  int64_t chunked_groups = 0;
  int64_t windowed_released = 0;
  int64_t windowed_hits = 0;
  int64_t windowed_evictions = 0;
  int64_t windowed_demoted = 0;
  int64_t windowed_promoted = 0;
};

// Runs `runs` random byte strings (200..3200 bytes each, about 400 operations) through the
// decoder, with layer groups when `groups` and speculative decoding when `speculative` (the
// first bytes are then the driver's markers); stops at the first failure and reports it
// with the seed and run index.
Totals run_random(OpProfile profile, uint64_t default_seed, int default_runs, bool groups,
                  bool speculative = false) {
  const uint64_t seed = env_or("PAGEDKV_PROPERTY_SEED", default_seed);
  const int runs = static_cast<int>(
      env_or("PAGEDKV_PROPERTY_RUNS", std::max(1, default_runs / kSanitizerDivisor)));
  std::printf("property test%s: seed %llu, %d runs (PAGEDKV_PROPERTY_SEED to change)\n",
              groups ? " (layer groups)" : "", static_cast<unsigned long long>(seed), runs);
  // PAGEDKV_PROPERTY_RUN=<r> replays run r alone (with PAGEDKV_OPS_TRACE=1: its operations).
  const int only = static_cast<int>(env_or("PAGEDKV_PROPERTY_RUN", ~uint64_t{0}));
  Totals totals;
  for (int run = only >= 0 ? only : 0; run < (only >= 0 ? only + 1 : runs); ++run) {
    std::mt19937_64 rng((seed * 1000003 + run) ^ (groups ? 0x5bd1e995u : 0u));
    std::vector<uint8_t> bytes(200 + rng() % 3000);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    if (speculative) bytes.insert(bytes.begin(), ManagerOpRunner::kSpeculativeMarker);
    if (groups) bytes[speculative ? 1 : 0] = ManagerOpRunner::kGroupsMarker;
    ManagerOpRunner runner(bytes, profile);
    const std::string error = runner.run();
    INFO("seed " << seed << " run " << run << " (" << bytes.size() << " bytes"
                 << (groups ? ", layer groups" : "") << ")");
    REQUIRE(error == "");
    totals.ops += runner.num_ops();
    const std::vector<ManagerOpRunner::GroupTotals> group_totals = runner.group_totals();
    if (groups) ++totals.runs_by_groups[group_totals.size()];
    for (const ManagerOpRunner::GroupTotals& g : group_totals) {
      if (g.group.kind == AttentionKind::kFull) continue;
      ++(g.group.kind == AttentionKind::kSlidingWindow ? totals.sliding_groups
                                                       : totals.chunked_groups);
      totals.windowed_released += g.stats.released_blocks;
      totals.windowed_hits += g.stats.hit_blocks;
      totals.windowed_evictions += g.stats.evictions;
      totals.windowed_demoted += g.stats.blocks_demoted;
      totals.windowed_promoted += g.stats.blocks_promoted;
    }
    const KvCacheManager::Stats s = runner.stats();
    totals.runs_created += s.num_blocks > 0;
    totals.stats.prefix_hit_tokens += s.prefix_hit_tokens;
    totals.stats.partial_hit_tokens += s.partial_hit_tokens;
    totals.stats.evictions += s.evictions;
    totals.stats.cow_copies += s.cow_copies;
    totals.stats.preemptions_recompute += s.preemptions_recompute;
    totals.stats.preemptions_swap += s.preemptions_swap;
    totals.stats.blocks_swapped_in += s.blocks_swapped_in;
    totals.stats.claims_released += s.claims_released;
    totals.stats.blocks_demoted += s.blocks_demoted;
    totals.stats.blocks_promoted += s.blocks_promoted;
    totals.stats.host_evictions += s.host_evictions;
    totals.stats.blocks_not_admitted += s.blocks_not_admitted;
    totals.stats.ghost_hits += s.ghost_hits;
    totals.stats.recent_ghost_hits += s.recent_ghost_hits;
    totals.stats.frequent_ghost_hits += s.frequent_ghost_hits;
    totals.stats.draft_tokens += s.draft_tokens;
    totals.stats.accepted_draft_tokens += s.accepted_draft_tokens;
  }
  std::printf(
      "property test: %lld operations; prefix hit tokens %lld, evictions %lld, CoW copies %lld, "
      "preemptions %lld recompute / %lld swap, blocks swapped in %lld, claims released %lld, "
      "host tier: %lld demoted, %lld promoted, %lld host evictions, %lld not admitted, %lld "
      "ghost hits; adaptive eviction: %lld recent and %lld frequent ghost hits\n",
      static_cast<long long>(totals.ops), static_cast<long long>(totals.stats.prefix_hit_tokens),
      static_cast<long long>(totals.stats.evictions),
      static_cast<long long>(totals.stats.cow_copies),
      static_cast<long long>(totals.stats.preemptions_recompute),
      static_cast<long long>(totals.stats.preemptions_swap),
      static_cast<long long>(totals.stats.blocks_swapped_in),
      static_cast<long long>(totals.stats.claims_released),
      static_cast<long long>(totals.stats.blocks_demoted),
      static_cast<long long>(totals.stats.blocks_promoted),
      static_cast<long long>(totals.stats.host_evictions),
      static_cast<long long>(totals.stats.blocks_not_admitted),
      static_cast<long long>(totals.stats.ghost_hits),
      static_cast<long long>(totals.stats.recent_ghost_hits),
      static_cast<long long>(totals.stats.frequent_ghost_hits));
  if (groups) {
    std::printf(
        "property test (layer groups): runs created with 1 / 2 / 3 groups: %lld / %lld / %lld; "
        "partial-block hit tokens %lld; windowed groups: %lld sliding, %lld chunked; they "
        "released %lld blocks behind the window, hit %lld, evicted %lld, demoted %lld, promoted "
        "%lld\n",
        static_cast<long long>(totals.runs_by_groups[1]),
        static_cast<long long>(totals.runs_by_groups[2]),
        static_cast<long long>(totals.runs_by_groups[3]),
        static_cast<long long>(totals.stats.partial_hit_tokens),
        static_cast<long long>(totals.sliding_groups),
        static_cast<long long>(totals.chunked_groups),
        static_cast<long long>(totals.windowed_released),
        static_cast<long long>(totals.windowed_hits),
        static_cast<long long>(totals.windowed_evictions),
        static_cast<long long>(totals.windowed_demoted),
        static_cast<long long>(totals.windowed_promoted));
  }
  return totals;
}

// The random mix must reach every mechanism, or the properties above hold vacuously.
void require_reached_everything(const Totals& t) {
  if (std::getenv("PAGEDKV_PROPERTY_RUN") != nullptr) return;  // one run replayed
  CHECK(t.ops >= 1000);
  CHECK(t.stats.prefix_hit_tokens > 0);
  CHECK(t.stats.evictions > 0);
  CHECK(t.stats.cow_copies > 0);
  CHECK(t.stats.preemptions_recompute > 0);
  CHECK(t.stats.preemptions_swap > 0);
  CHECK(t.stats.blocks_swapped_in > 0);
  CHECK(t.stats.claims_released > 0);
  CHECK(t.stats.blocks_demoted > 0);
  CHECK(t.stats.blocks_promoted > 0);
  CHECK(t.stats.host_evictions > 0);
  CHECK(t.stats.blocks_not_admitted > 0);
  CHECK(t.stats.ghost_hits > 0);
  CHECK(t.stats.recent_ghost_hits > 0);
  CHECK(t.stats.frequent_ghost_hits > 0);
}

// ... and, with layer groups, runs of 1, 2 and 3 groups, both windowed kinds, windowed
// groups releasing blocks behind the window, hitting and evicting; in unsanitized builds
// also the rest, the host tier of windowed groups among it (the sixteenth of the runs a
// sanitized build makes reaches windowed promotions too rarely to require them).
void require_reached_groups(const Totals& t) {
  if (std::getenv("PAGEDKV_PROPERTY_RUN") != nullptr) return;  // one run replayed
  if (!kSanitized) {
    require_reached_everything(t);
    CHECK(t.windowed_demoted > 0);
    CHECK(t.windowed_promoted > 0);
  }
  CHECK(t.ops >= 1000);
  CHECK(t.stats.prefix_hit_tokens > 0);
  CHECK(t.stats.partial_hit_tokens > 0);
  CHECK(t.stats.evictions > 0);
  CHECK(t.stats.cow_copies > 0);
  CHECK(t.stats.preemptions_recompute > 0);
  CHECK(t.stats.preemptions_swap > 0);
  CHECK(t.runs_by_groups[1] > 0);
  CHECK(t.runs_by_groups[2] > 0);
  CHECK(t.runs_by_groups[3] > 0);
  CHECK(t.sliding_groups > 0);
  CHECK(t.chunked_groups > 0);
  CHECK(t.windowed_released > 0);
  CHECK(t.windowed_hits > 0);
  CHECK(t.windowed_evictions > 0);
}

TEST_CASE("random operation sequences agree with the reference model and keep invariants",
          "[property]") {
  require_reached_everything(
      run_random(OpProfile::kManager, /*default_seed=*/20261129, 1000, /*groups=*/false));
}

TEST_CASE("with weak injected hashes no sequence ever reads another prefix's KV", "[property]") {
  require_reached_everything(
      run_random(OpProfile::kHash, /*default_seed=*/5, 1000, /*groups=*/false));
}

TEST_CASE("random operation sequences on layer groups agree with the reference model",
          "[property]") {
  require_reached_groups(
      run_random(OpProfile::kManager, /*default_seed=*/20261202, 600, /*groups=*/true));
}

TEST_CASE("with layer groups and weak injected hashes no group ever shares a collision",
          "[property]") {
  require_reached_groups(run_random(OpProfile::kHash, /*default_seed=*/21, 600, /*groups=*/true));
}

// Speculative decoding's drafts and verdicts on one group and on several: drafts given
// slots, accepted, and rolled back (fewer accepted than drafted).
TEST_CASE("drafts, their verdicts and rollbacks agree with the reference model", "[property]") {
  for (const bool groups : {false, true}) {
    const Totals totals = run_random(OpProfile::kManager, /*default_seed=*/20261206, 300, groups,
                                     /*speculative=*/true);
    std::printf("property test (speculative%s): %lld draft tokens, %lld accepted\n",
                groups ? ", layer groups" : "", static_cast<long long>(totals.stats.draft_tokens),
                static_cast<long long>(totals.stats.accepted_draft_tokens));
    CHECK(totals.stats.accepted_draft_tokens > 0);
    CHECK(totals.stats.accepted_draft_tokens < totals.stats.draft_tokens);
  }
}

TEST_CASE("an empty or truncated input decodes to a valid, checked run", "[property]") {
  for (size_t size = 0; size < 40; ++size) {
    std::vector<uint8_t> bytes(size, 0xA5);
    INFO("size " << size);
    REQUIRE(run_manager_ops(bytes, OpProfile::kManager) == "");
    REQUIRE(run_manager_ops(bytes, OpProfile::kHash) == "");
    if (size > 0) bytes[0] = ManagerOpRunner::kGroupsMarker;  // with layer groups
    REQUIRE(run_manager_ops(bytes, OpProfile::kManager) == "");
    REQUIRE(run_manager_ops(bytes, OpProfile::kHash) == "");
  }
}

}  // namespace
}  // namespace pagedkv::testing
