#include "cluster.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fmt/format.h"
#include "report.h"
#include "tokens.h"

namespace pagedkv::sim {
namespace {

// One engine's KV events: they keep the router's index of what the engine caches, and
// write the blocks it computes through to the shared tier (when there is one).
class EngineEventFeed final : public KvEventSink {
 public:
  explicit EngineEventFeed(SharedTier* shared_tier) : shared_tier_(shared_tier) {}

  void on_event(const KvEvent& event) override {
    if (const auto* stored = std::get_if<BlockStored>(&event)) {
      for (const BlockHash& h : stored->block_hashes) media_[h] |= bit(stored->medium);
      if (shared_tier_ != nullptr && stored->medium == Medium::kDevice) {
        shared_tier_->stage(stored->block_hashes);
      }
    } else if (const auto* removed = std::get_if<BlockRemoved>(&event)) {
      for (const BlockHash& h : removed->block_hashes) {
        auto it = media_.find(h);
        if (it != media_.end() && (it->second &= ~bit(removed->medium)) == 0) media_.erase(it);
      }
    } else {
      media_.clear();  // AllBlocksCleared
    }
  }

  // The number of leading `hashes` the engine caches in either medium.
  int32_t cached_prefix_blocks(std::span<const BlockHash> hashes) const {
    int32_t n = 0;
    while (n < static_cast<int32_t>(hashes.size()) && media_.contains(hashes[n])) ++n;
    return n;
  }

 private:
  static uint8_t bit(Medium medium) { return static_cast<uint8_t>(1u << static_cast<int>(medium)); }

  SharedTier* shared_tier_;
  absl::flat_hash_map<BlockHash, uint8_t> media_;  // a bit per Medium holding the block
};

// A request the router sent to an engine and has not seen finish.
struct Routed {
  int32_t request = 0;
  int64_t new_blocks = 0;  // prompt blocks the engine did not cache when it was routed
  int64_t blocks = 0;      // prompt blocks
};

// The KV-aware rule of cluster.h, from the engines' events and the requests' progress.
class KvAwareRouter {
 public:
  KvAwareRouter(std::span<const std::unique_ptr<EngineEventFeed>> feeds, int32_t block_size)
      : feeds_(feeds), block_size_(block_size), active_(feeds.size()) {}

  int32_t route(const Trace& trace, int32_t request,
                std::span<const std::unique_ptr<EngineModel>> engines,
                std::span<const int64_t> routed_counts) {
    const Request& req = trace.requests[request];
    const int64_t blocks = (req.input_length + block_size_ - 1) / block_size_;
    const std::vector<BlockHash> hashes = prefix_block_hashes(
        prompt_tokens(req, request), block_size_, (req.input_length - 1) / block_size_);
    int32_t best = 0;
    int64_t best_cost = std::numeric_limits<int64_t>::max();
    int64_t best_new = 0;
    for (int32_t e = 0; e < static_cast<int32_t>(engines.size()); ++e) {
      std::erase_if(active_[e], [&](const Routed& r) {
        return engines[e]->phase(r.request) == RequestPhase::kDone;
      });
      const int64_t new_blocks = blocks - feeds_[e]->cached_prefix_blocks(hashes);
      int64_t cost = new_blocks;
      for (const Routed& r : active_[e]) {
        cost += r.blocks;
        if (engines[e]->phase(r.request) == RequestPhase::kQueued) cost += r.new_blocks;
      }
      if (cost < best_cost || (cost == best_cost && routed_counts[e] < routed_counts[best])) {
        best = e;
        best_cost = cost;
        best_new = new_blocks;
      }
    }
    active_[best].push_back({.request = request, .new_blocks = best_new, .blocks = blocks});
    cached_tokens_seen_ += (blocks - best_new) * block_size_;
    return best;
  }

  // The tokens of the chosen engines' cached prefixes, as the index showed them.
  int64_t cached_tokens_seen() const { return cached_tokens_seen_; }

 private:
  std::span<const std::unique_ptr<EngineEventFeed>> feeds_;
  int32_t block_size_;
  std::vector<std::vector<Routed>> active_;  // per engine
  int64_t cached_tokens_seen_ = 0;
};

absl::Status check_options(const AllocatorSetup& setup, const ClusterOptions& options) {
  if (options.num_engines < 1 || options.num_engines > kMaxClusterEngines) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster: ", options.num_engines, " engines; need 1 to ", kMaxClusterEngines));
  }
  if (options.shared_tier_blocks < 0 || !(options.shared_tier_bytes_per_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster: shared tier of ", options.shared_tier_blocks, " blocks at ",
        options.shared_tier_bytes_per_s, " bytes/s; need >= 0 blocks and > 0 bytes/s"));
  }
  if (setup.config.kind != AllocatorKind::kPagedPrefix || setup.hybrid) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster: engines need paged+prefix without hybrid pools, got ",
                     allocator_name(setup.config)));
  }
  return absl::OkStatus();
}

// The cluster's figures from its engines' results.
void add_up(const std::vector<EngineResult>& engines, const Trace& trace, ClusterResult& out) {
  double latency_sum = 0;
  for (const EngineResult& r : engines) {
    out.completed += r.completed;
    out.rejected += r.rejected;
    out.prompt_tokens += r.prefix_query_tokens;
    out.device_hit_tokens += r.prefix_hit_tokens - r.prefix_host_hit_tokens;
    out.host_hit_tokens += r.prefix_host_hit_tokens;
    out.shared_hit_tokens += r.prefix_shared_hit_tokens;
    out.shared_read_time_s += r.shared_read_time_s;
    out.sim_time_s = std::max(out.sim_time_s, r.sim_time_s);
    latency_sum += r.mean_latency_s * static_cast<double>(r.completed);
  }
  out.recomputed_tokens =
      out.prompt_tokens - out.device_hit_tokens - out.host_hit_tokens - out.shared_hit_tokens;
  const double span = out.sim_time_s - (trace.requests.empty() ? 0 : trace.requests[0].arrival_s);
  out.throughput_rps = span > 0 ? static_cast<double>(out.completed) / span : 0;
  out.mean_latency_s = out.completed > 0 ? latency_sum / static_cast<double>(out.completed) : 0;
}

}  // namespace

std::string router_name(RouterKind router) {
  return router == RouterKind::kRoundRobin ? "round-robin" : "kv-aware";
}

absl::StatusOr<RouterKind> parse_router(std::string_view name) {
  for (RouterKind kind : {RouterKind::kRoundRobin, RouterKind::kKvAware}) {
    if (name == router_name(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("router '", std::string(name), "': must be round-robin or kv-aware"));
}

absl::StatusOr<ClusterResult> run_cluster(const Trace& trace, const AllocatorSetup& setup,
                                          const EngineOptions& engine,
                                          const ClusterOptions& options) {
  if (absl::Status s = check_options(setup, options); !s.ok()) return s;
  std::optional<SharedTier> shared_tier;
  if (options.shared_tier_blocks > 0) shared_tier.emplace(options.shared_tier_blocks);
  EngineOptions engine_options = engine;
  engine_options.shared_tier = shared_tier ? &*shared_tier : nullptr;
  engine_options.shared_tier_bytes_per_s = options.shared_tier_bytes_per_s;

  std::vector<std::unique_ptr<EngineEventFeed>> feeds;
  std::vector<std::unique_ptr<EngineModel>> engines;
  for (int32_t e = 0; e < options.num_engines; ++e) {
    feeds.push_back(std::make_unique<EngineEventFeed>(engine_options.shared_tier));
    AllocatorSetup engine_setup = setup;
    engine_setup.event_sink = feeds.back().get();
    absl::StatusOr<std::unique_ptr<EngineModel>> model =
        EngineModel::create(trace, engine_setup, engine_options);
    if (!model.ok()) return model.status();
    engines.push_back(*std::move(model));
  }
  ClusterResult result;
  result.trace = trace.name;
  result.options = options;
  result.requests = static_cast<int64_t>(trace.requests.size());
  result.requests_per_engine.assign(options.num_engines, 0);
  KvAwareRouter kv_aware(feeds, setup.config.block_size);
  for (int32_t r = 0; r < static_cast<int32_t>(trace.requests.size()); ++r) {
    for (const std::unique_ptr<EngineModel>& model : engines) {
      if (absl::Status s = model->run_until(trace.requests[r].arrival_s); !s.ok()) return s;
    }
    const int32_t e = options.router == RouterKind::kRoundRobin
                          ? r % options.num_engines
                          : kv_aware.route(trace, r, engines, result.requests_per_engine);
    engines[e]->submit(r);
    ++result.requests_per_engine[e];
  }
  for (const std::unique_ptr<EngineModel>& model : engines) {
    absl::StatusOr<EngineResult> drained = model->drain();
    if (!drained.ok()) return drained.status();
    result.engines.push_back(*std::move(drained));
  }
  result.routed_cached_tokens = kv_aware.cached_tokens_seen();
  if (shared_tier) {
    result.shared_blocks_written = shared_tier->blocks_written();
    result.shared_blocks_evicted = shared_tier->blocks_evicted();
  }
  add_up(result.engines, trace, result);
  return result;
}

std::string format_cluster_table(const std::vector<ClusterResult>& rows) {
  std::string out = fmt::format(
      "{:<26} {:>3} {:<12} {:>19} {:>14} {:>13} {:>13} {:>13} {:>14} {:>13} {:>7} {:>8} {:>7} "
      "{:>9}\n",
      "trace", "N", "router", "shared tier", "prompt tok", "device hit", "host hit", "shared hit",
      "recomputed", "routed hit", "req/s", "latency", "read s", "req/eng");
  for (const ClusterResult& r : rows) {
    const std::string shared = r.options.shared_tier_blocks == 0
                                   ? "none"
                                   : fmt::format("{} blk @{:g}GB/s", r.options.shared_tier_blocks,
                                                 r.options.shared_tier_bytes_per_s / 1e9);
    const auto [min_it, max_it] =
        std::minmax_element(r.requests_per_engine.begin(), r.requests_per_engine.end());
    out += fmt::format(
        "{:<26} {:>3} {:<12} {:>19} {:>14} {:>13} {:>13} {:>13} {:>14} {:>13} {:>7.3f} {:>7.1f}s "
        "{:>7.1f} {:>9}\n",
        r.trace, r.options.num_engines, router_name(r.options.router), shared,
        commas(r.prompt_tokens), commas(r.device_hit_tokens), commas(r.host_hit_tokens),
        commas(r.shared_hit_tokens), commas(r.recomputed_tokens), commas(r.routed_cached_tokens),
        r.throughput_rps, r.mean_latency_s, r.shared_read_time_s,
        fmt::format("{}/{}", *max_it, *min_it));
  }
  return out;
}

}  // namespace pagedkv::sim
