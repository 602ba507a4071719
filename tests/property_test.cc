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
// events) and, after every step, the KV data-flow check.
//
// Deterministic: each test prints its seed; PAGEDKV_PROPERTY_SEED=<n> reruns with another
// seed and PAGEDKV_PROPERTY_RUNS=<n> changes the number of runs. Runs shrink under
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
};

// Runs `runs` random byte strings (200..3200 bytes each, about 400 operations) through the
// decoder; stops at the first failure and reports it with the seed and run index.
Totals run_random(OpProfile profile, uint64_t default_seed, int default_runs) {
  const uint64_t seed = env_or("PAGEDKV_PROPERTY_SEED", default_seed);
  const int runs = static_cast<int>(
      env_or("PAGEDKV_PROPERTY_RUNS", std::max(1, default_runs / kSanitizerDivisor)));
  std::printf("property test: seed %llu, %d runs (PAGEDKV_PROPERTY_SEED to change)\n",
              static_cast<unsigned long long>(seed), runs);
  Totals totals;
  for (int run = 0; run < runs; ++run) {
    std::mt19937_64 rng(seed * 1000003 + run);
    std::vector<uint8_t> bytes(200 + rng() % 3000);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    ManagerOpRunner runner(bytes, profile);
    const std::string error = runner.run();
    INFO("seed " << seed << " run " << run << " (" << bytes.size() << " bytes)");
    REQUIRE(error == "");
    totals.ops += runner.num_ops();
    const KvCacheManager::Stats s = runner.stats();
    totals.runs_created += s.num_blocks > 0;
    totals.stats.prefix_hit_tokens += s.prefix_hit_tokens;
    totals.stats.evictions += s.evictions;
    totals.stats.cow_copies += s.cow_copies;
    totals.stats.preemptions_recompute += s.preemptions_recompute;
    totals.stats.preemptions_swap += s.preemptions_swap;
    totals.stats.blocks_swapped_in += s.blocks_swapped_in;
    totals.stats.claims_released += s.claims_released;
    totals.stats.blocks_demoted += s.blocks_demoted;
    totals.stats.blocks_promoted += s.blocks_promoted;
    totals.stats.host_evictions += s.host_evictions;
  }
  std::printf(
      "property test: %lld operations; prefix hit tokens %lld, evictions %lld, CoW copies %lld, "
      "preemptions %lld recompute / %lld swap, blocks swapped in %lld, claims released %lld, "
      "host tier: %lld demoted, %lld promoted, %lld host evictions\n",
      static_cast<long long>(totals.ops), static_cast<long long>(totals.stats.prefix_hit_tokens),
      static_cast<long long>(totals.stats.evictions),
      static_cast<long long>(totals.stats.cow_copies),
      static_cast<long long>(totals.stats.preemptions_recompute),
      static_cast<long long>(totals.stats.preemptions_swap),
      static_cast<long long>(totals.stats.blocks_swapped_in),
      static_cast<long long>(totals.stats.claims_released),
      static_cast<long long>(totals.stats.blocks_demoted),
      static_cast<long long>(totals.stats.blocks_promoted),
      static_cast<long long>(totals.stats.host_evictions));
  return totals;
}

// The random mix must reach every mechanism, or the properties above hold vacuously.
void require_reached_everything(const Totals& t) {
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
}

TEST_CASE("random operation sequences agree with the reference model and keep invariants",
          "[property]") {
  require_reached_everything(run_random(OpProfile::kManager, /*default_seed=*/20261129, 1000));
}

TEST_CASE("with weak injected hashes no sequence ever reads another prefix's KV", "[property]") {
  require_reached_everything(run_random(OpProfile::kHash, /*default_seed=*/5, 1000));
}

TEST_CASE("an empty or truncated input decodes to a valid, checked run", "[property]") {
  for (size_t size = 0; size < 40; ++size) {
    std::vector<uint8_t> bytes(size, 0xA5);
    INFO("size " << size);
    REQUIRE(run_manager_ops(bytes, OpProfile::kManager) == "");
    REQUIRE(run_manager_ops(bytes, OpProfile::kHash) == "");
  }
}

}  // namespace
}  // namespace pagedkv::testing
