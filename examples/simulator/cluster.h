// File: examples/simulator/cluster.h
//
// Several engines behind a router (issue 25): every engine is the engine model of engine.h
// on a KvCacheManager of its own, with the device and host budgets of a single-engine run,
// and the router sends each request, at its arrival, to one of them:
//   round robin  request i to engine i mod N;
//   KV-aware     the lowest cost, modelled on Dynamo's KV router at its default weights
//                (prefill blocks plus active blocks; overlap_score_weight 1, temperature 0):
//                  cost(e) = new(e) + queued(e) + active(e), in blocks, where
//                  new(e)    = the request's prompt blocks minus the leading ones engine e
//                              caches (device or host tier), as far as a hit can reach;
//                  queued(e) = new blocks of the requests routed to e whose prompt is not
//                              computed yet (the prefill work waiting there);
//                  active(e) = prompt blocks of the requests routed to e and not finished.
//                Ties go to the engine that got the fewest requests, then the lowest index.
// The router knows what an engine caches only from its KV events (kv_events.h), as a KV
// router subscribed to the engines' publishers does (examples/kv_router): BlockStored and
// BlockRemoved per medium keep an index of hashes per engine. It follows a request's
// progress as it would from the engine's responses (first token, completion).
// With a shared tier (shared_tier.h), every block an engine computes is written to one
// store that every engine reads past its own hits, at shared_tier_bytes_per_s each.
// NOTE: the engines are stepped up to each arrival in turn; a step that starts before the
// arrival ends after it, so the router (and, through the store, another engine) may see up
// to one step of an engine's future.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_CLUSTER_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_CLUSTER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine.h"
#include "sim_allocator.h"
#include "trace.h"

namespace pagedkv::sim {

// The most engines a cluster may have.
inline constexpr int32_t kMaxClusterEngines = 1024;

enum class RouterKind { kRoundRobin, kKvAware };

// "round-robin", "kv-aware".
std::string router_name(RouterKind router);

// The router named `name`. Errors: InvalidArgument naming it and the choices.
[[nodiscard]] absl::StatusOr<RouterKind> parse_router(std::string_view name);

struct ClusterOptions {
  int32_t num_engines = 4;
  RouterKind router = RouterKind::kKvAware;
  int64_t shared_tier_blocks = 0;         // capacity of the shared tier; 0: none
  double shared_tier_bytes_per_s = 25e9;  // its bandwidth to one engine
};

struct ClusterResult {
  std::string trace;
  ClusterOptions options;
  int64_t requests = 0;
  int64_t completed = 0;
  int64_t rejected = 0;
  // Tokens of admitted prefills (re-prefills after preemption included), split by where
  // they came from: each engine's device or host tier, the shared tier, or computed.
  int64_t prompt_tokens = 0;
  int64_t device_hit_tokens = 0;
  int64_t host_hit_tokens = 0;
  int64_t shared_hit_tokens = 0;
  int64_t recomputed_tokens = 0;  // prefilled
  // KV-aware: the tokens of the chosen engines' cached prefixes as the router's index showed
  // them when it routed (0 for round robin). Against device_hit_tokens + host_hit_tokens:
  // how much of the hits the router saw coming.
  int64_t routed_cached_tokens = 0;
  double sim_time_s = 0;          // last completion, cluster-wide
  double throughput_rps = 0;      // completed / (last completion - first arrival)
  double mean_latency_s = 0;      // arrival to completion
  double shared_read_time_s = 0;  // step time the engines spent reading the shared tier
  int64_t shared_blocks_written = 0;
  int64_t shared_blocks_evicted = 0;
  std::vector<int64_t> requests_per_engine;  // routed
  std::vector<EngineResult> engines;
};

// Replays `trace` (clamped and scaled already) on options.num_engines engines made from
// `setup` and `engine`, routed by options.router. `setup` must be a paged allocator.
// Errors: InvalidArgument for bad options (naming the value and the limit), the engines'.
[[nodiscard]] absl::StatusOr<ClusterResult> run_cluster(const Trace& trace,
                                                        const AllocatorSetup& setup,
                                                        const EngineOptions& engine,
                                                        const ClusterOptions& options);

// Cluster results as an aligned text table, one row each.
std::string format_cluster_table(const std::vector<ClusterResult>& rows);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_CLUSTER_H_
