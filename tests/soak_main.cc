// pagedkv-soak: the property driver (tests/support/manager_ops.h) on every core for a
// while, to find what the fixed-size property tests do not. scripts/soak.sh builds and
// runs it.
//
// Each run decodes seeded random bytes (the property tests' sizes, 200..3200 bytes, about
// 400 operations; the manager and weak-hash profiles in turn, and every third pair of runs
// with layer groups) into manager options and operations, host tier, retention ranges and
// claim releases among them. Every operation is
// compared with the reference model (status, returned values, the whole observable state),
// every step's KV data flow is checked, and check_invariants() runs after every 64th
// operation and at the end of each run. Run r of seed s is the bytes of
// std::mt19937_64(s * 1000003 + r), so any failure replays alone with --seed s --run r
// (PAGEDKV_OPS_TRACE=1 prints its operations; the replay checks invariants after every
// operation, to name the one that broke them). Not a benchmark: the rate it prints is for
// sizing a soak.
//
// usage: pagedkv-soak SECONDS [--seed S] [--threads N] [--run R]
//   exit 0: every run passed; 1: a run failed (its report and how to replay it printed);
//   2: bad arguments.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/manager_ops.h"

namespace {

using pagedkv::KvCacheManager;
using pagedkv::testing::ManagerOpRunner;
using pagedkv::testing::OpProfile;

constexpr int kInvariantsEvery = 64;

struct Args {
  double seconds = 0;
  uint64_t seed = 0;
  int threads = 0;
  int64_t only_run = -1;  // >= 0: replay that run alone
};

[[noreturn]] void usage(const std::string& error) {
  std::fprintf(stderr,
               "pagedkv-soak: %s\nusage: pagedkv-soak SECONDS [--seed S] [--threads N] "
               "[--run R]\n",
               error.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args args;
  args.seed = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count() &
                                    0xffffffff);
  args.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (argc < 2) usage("missing SECONDS");
  char* end = nullptr;
  args.seconds = std::strtod(argv[1], &end);
  if (*end != '\0' || !(args.seconds >= 0)) usage(std::string("SECONDS ") + argv[1]);
  for (int i = 2; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const char* value = argv[i + 1];
    const long long number = std::strtoll(value, &end, 10);
    if (*end != '\0' || number < 0) usage(flag + " " + value + ": expected a number >= 0");
    if (flag == "--seed") {
      args.seed = static_cast<uint64_t>(number);
    } else if (flag == "--threads" && number >= 1 && number <= 1024) {
      args.threads = static_cast<int>(number);
    } else if (flag == "--run") {
      args.only_run = number;
    } else {
      usage("unknown flag or value " + flag + " " + value);
    }
  }
  return args;
}

// Runs 4, 5, 10, 11, ... (every third pair) have layer groups.
bool run_grouped(int64_t run) { return run / 2 % 3 == 2; }

// The bytes of run `run`: as tests/property_test.cc draws them, with the driver's layer-group
// marker first in a grouped run.
std::vector<uint8_t> run_bytes(uint64_t seed, int64_t run) {
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(run));
  std::vector<uint8_t> bytes(200 + rng() % 3000);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  if (run_grouped(run)) bytes[0] = ManagerOpRunner::kGroupsMarker;
  return bytes;
}

OpProfile run_profile(int64_t run) { return run % 2 == 0 ? OpProfile::kManager : OpProfile::kHash; }

struct Totals {
  int64_t runs = 0;
  int64_t ops = 0;
  KvCacheManager::Stats stats;    // sums of the counters that show what the runs reached
  int64_t windowed_released = 0;  // blocks windowed groups released behind the window
  int64_t windowed_hits = 0;      // blocks prefix hits claimed in windowed groups

  void add(const ManagerOpRunner& runner) {
    ++runs;
    ops += runner.num_ops();
    for (const ManagerOpRunner::GroupTotals& g : runner.group_totals()) {
      if (g.group.kind == pagedkv::AttentionKind::kFull) continue;
      windowed_released += g.stats.released_blocks;
      windowed_hits += g.stats.hit_blocks;
    }
    const KvCacheManager::Stats s = runner.stats();
    stats.prefix_hit_tokens += s.prefix_hit_tokens;
    stats.evictions += s.evictions;
    stats.cow_copies += s.cow_copies;
    stats.preemptions_recompute += s.preemptions_recompute;
    stats.preemptions_swap += s.preemptions_swap;
    stats.blocks_swapped_in += s.blocks_swapped_in;
    stats.claims_released += s.claims_released;
    stats.blocks_demoted += s.blocks_demoted;
    stats.blocks_promoted += s.blocks_promoted;
    stats.host_evictions += s.host_evictions;
  }
  void add(const Totals& t) {
    runs += t.runs;
    ops += t.ops;
    windowed_released += t.windowed_released;
    windowed_hits += t.windowed_hits;
    stats.prefix_hit_tokens += t.stats.prefix_hit_tokens;
    stats.evictions += t.stats.evictions;
    stats.cow_copies += t.stats.cow_copies;
    stats.preemptions_recompute += t.stats.preemptions_recompute;
    stats.preemptions_swap += t.stats.preemptions_swap;
    stats.blocks_swapped_in += t.stats.blocks_swapped_in;
    stats.claims_released += t.stats.claims_released;
    stats.blocks_demoted += t.stats.blocks_demoted;
    stats.blocks_promoted += t.stats.blocks_promoted;
    stats.host_evictions += t.stats.host_evictions;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  const auto seed_text = std::to_string(args.seed);
  if (args.only_run >= 0) {
    // Replayed alone, with check_invariants() after every operation: a broken invariant
    // is reported at the operation that broke it.
    const std::vector<uint8_t> bytes = run_bytes(args.seed, args.only_run);  // the runner's span
    ManagerOpRunner runner(bytes, run_profile(args.only_run));
    const std::string error = runner.run();
    std::printf("pagedkv-soak: seed %s run %lld: %d operations, %s\n", seed_text.c_str(),
                static_cast<long long>(args.only_run), runner.num_ops(),
                error.empty() ? "passed" : "FAILED");
    if (!error.empty()) std::printf("%s", error.c_str());
    return error.empty() ? 0 : 1;
  }
  std::printf("pagedkv-soak: seed %s, %d threads, %.0f s; check_invariants() every %d operations\n",
              seed_text.c_str(), args.threads, args.seconds, kInvariantsEvery);
  std::fflush(stdout);

  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(args.seconds));
  std::atomic<int64_t> next_run{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;  // guards totals and the failure report
  Totals totals;
  int64_t failed_run = -1;
  std::string failure;
  std::vector<std::thread> threads;
  for (int t = 0; t < args.threads; ++t) {
    threads.emplace_back([&] {
      Totals mine;
      while (!failed.load(std::memory_order_relaxed) &&
             std::chrono::steady_clock::now() < deadline) {
        const int64_t run = next_run.fetch_add(1, std::memory_order_relaxed);
        const std::vector<uint8_t> bytes = run_bytes(args.seed, run);  // the runner's span
        ManagerOpRunner runner(bytes, run_profile(run), kInvariantsEvery);
        const std::string error = runner.run();
        mine.add(runner);
        if (!error.empty()) {
          std::lock_guard lock(mutex);
          if (!failed.exchange(true)) {
            failed_run = run;
            failure = error;
          }
          break;
        }
      }
      std::lock_guard lock(mutex);
      totals.add(mine);
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const KvCacheManager::Stats& s = totals.stats;
  std::printf(
      "pagedkv-soak: %lld operations checked in %lld runs, %.1f s, %.0f operations/s; "
      "failures: %d\n"
      "  reached: prefix hit tokens %lld, evictions %lld, CoW copies %lld, preemptions %lld "
      "recompute / %lld swap, blocks swapped in %lld, claims released %lld, host tier %lld "
      "demoted / %lld promoted / %lld evicted; windowed groups %lld blocks released behind the "
      "window / %lld hit\n",
      static_cast<long long>(totals.ops), static_cast<long long>(totals.runs), seconds,
      static_cast<double>(totals.ops) / std::max(seconds, 1e-9), failed ? 1 : 0,
      static_cast<long long>(s.prefix_hit_tokens), static_cast<long long>(s.evictions),
      static_cast<long long>(s.cow_copies), static_cast<long long>(s.preemptions_recompute),
      static_cast<long long>(s.preemptions_swap), static_cast<long long>(s.blocks_swapped_in),
      static_cast<long long>(s.claims_released), static_cast<long long>(s.blocks_demoted),
      static_cast<long long>(s.blocks_promoted), static_cast<long long>(s.host_evictions),
      static_cast<long long>(totals.windowed_released),
      static_cast<long long>(totals.windowed_hits));
  if (failed) {
    std::printf(
        "FAILED: seed %s run %lld\n%s\nreplay: PAGEDKV_OPS_TRACE=1 %s %g --seed %s --run %lld\n",
        seed_text.c_str(), static_cast<long long>(failed_run), failure.c_str(), argv[0],
        args.seconds, seed_text.c_str(), static_cast<long long>(failed_run));
    return 1;
  }
  return 0;
}
