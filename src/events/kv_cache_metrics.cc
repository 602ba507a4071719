// KvCacheMetrics: prometheus-cpp gauges and counters fed from the Stats structs.
#include "pagedkv/kv_cache_metrics.h"

#include <prometheus/check_names.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <array>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pagedkv {
namespace internal {

// Counters only move forward: each update() adds the growth since the last one.
class MonotonicCounter {
 public:
  explicit MonotonicCounter(prometheus::Counter& counter) : counter_(&counter) {}
  void advance_to(int64_t total) {
    if (total > last_) counter_->Increment(static_cast<double>(total - last_));
    last_ = std::max(last_, total);
  }

 private:
  prometheus::Counter* counter_;
  int64_t last_ = 0;
};

// vLLM's KVCacheSpecKind value of a layer group's kind, as the KV events send it.
const char* kind_label(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kFull:
      return "full_attention";
    case AttentionKind::kSlidingWindow:
      return "sliding_window";
    case AttentionKind::kChunkedLocal:
      return "chunked_local_attention";
    case AttentionKind::kState:
      return "mamba";  // vLLM's MambaSpec
  }
  return "unknown";
}

// The outcomes of a fetched block: the label of its remote_blocks series and its count in
// RemoteTierStats.
struct RemoteBlockOutcome {
  const char* label;
  int64_t RemoteTierStats::*blocks;
};
constexpr std::array<RemoteBlockOutcome, 6> kRemoteBlockOutcomes = {{
    {"found", &RemoteTierStats::found_blocks},
    {"missing", &RemoteTierStats::missing_blocks},
    {"corrupt", &RemoteTierStats::corrupt_blocks},
    {"foreign", &RemoteTierStats::foreign_blocks},
    {"other", &RemoteTierStats::other_blocks},
    {"error", &RemoteTierStats::error_blocks},
}};

// The series of one layer group (labels group and kind).
struct GroupSeries {
  prometheus::Gauge* usage;
  prometheus::Gauge* num_blocks;
  prometheus::Gauge* used_blocks;
  prometheus::Gauge* cached_free_blocks;
  prometheus::Gauge* cached_host_blocks;
  MonotonicCounter hit_blocks, released_blocks, evictions, host_evictions, demoted, promoted;
};

struct MetricsState {
  explicit MetricsState(const KvCacheMetrics::Options& options)
      : prefix(options.prefix),
        num_threads(options.num_threads),
        request_timeout_ms(options.request_timeout_ms),
        labels(options.model_name.empty() ? prometheus::Labels{}
                                          : prometheus::Labels{{"model_name", options.model_name}}),
        registry(std::make_shared<prometheus::Registry>()),
        usage(gauge("kv_cache_usage_perc", "KV-cache usage: used device blocks / all, 0..1")),
        num_blocks(gauge("kv_cache_num_blocks", "Device KV blocks in the pool")),
        used_blocks(gauge("kv_cache_used_blocks", "Device KV blocks held by sequences")),
        cached_free_blocks(
            gauge("kv_cache_cached_free_blocks", "Free device blocks still holding cached KV")),
        host_usage(gauge("kv_cache_host_usage_perc", "Host (swap) blocks used / all, 0..1")),
        cached_host_blocks(
            gauge("kv_cache_cached_host_blocks", "Host blocks holding the host tier's cached KV")),
        prefix_queries(
            counter("prefix_cache_queries", "Prefix cache queries, in prompt tokens looked up")),
        prefix_hits(counter("prefix_cache_hits", "Prefix cache hits, in prompt tokens found")),
        preemptions_recompute(
            counter("num_preemptions", "Preempted sequences", {{"mode", "recompute"}})),
        preemptions_swap(counter("num_preemptions", "Preempted sequences", {{"mode", "swap"}})),
        evictions(counter("num_evictions", "Cached blocks evicted to reuse them")),
        cow_copies(counter("num_cow_copies", "Copy-on-write block copies")),
        swapped_out(counter("num_blocks_swapped_out", "Blocks copied to the host pool")),
        swapped_in(counter("num_blocks_swapped_in", "Blocks copied back from the host pool")),
        host_hits(counter("prefix_cache_host_hits",
                          "Prefix cache hits found in the host tier, in prompt tokens")),
        demoted(counter("num_blocks_demoted", "Evicted cached blocks copied to the host tier")),
        promoted(counter("num_blocks_promoted", "Host-tier hits copied back to the device")),
        host_evictions(counter("num_host_evictions", "Host-tier blocks evicted to reuse them")),
        not_admitted(counter("num_blocks_not_admitted",
                             "Evicted cached blocks the host tier's admission rule dropped")),
        ghost_hits(counter("num_ghost_hits",
                           "Blocks computed while their hash was a ghost of the host tier")),
        recent_ghost_hits(counter("num_eviction_ghost_hits",
                                  "Blocks cached while their hash was a ghost of the adaptive "
                                  "eviction policy, by the list it was evicted from",
                                  {{"list", "recent"}})),
        frequent_ghost_hits(counter("num_eviction_ghost_hits",
                                    "Blocks cached while their hash was a ghost of the adaptive "
                                    "eviction policy, by the list it was evicted from",
                                    {{"list", "frequent"}})),
        partial_hits(counter("prefix_cache_partial_hits",
                             "Prefix cache hits reused from part of a cached block, in tokens")),
        group_usage(gauge_family("kv_cache_group_usage_perc",
                                 "A layer group's KV-cache usage: used device blocks / all, 0..1")),
        group_num_blocks(
            gauge_family("kv_cache_group_num_blocks", "Device KV blocks in a layer group's pool")),
        group_used_blocks(gauge_family("kv_cache_group_used_blocks",
                                       "Device KV blocks of a layer group held by sequences")),
        group_cached_free_blocks(
            gauge_family("kv_cache_group_cached_free_blocks",
                         "Free device blocks of a layer group still holding cached KV")),
        group_cached_host_blocks(
            gauge_family("kv_cache_group_cached_host_blocks",
                         "Host blocks of a layer group holding its host tier's cached KV")),
        group_hit_blocks(counter_family("kv_cache_group_hit_blocks",
                                        "Blocks prefix hits claimed from a layer group's cache")),
        group_released_blocks(
            counter_family("kv_cache_group_released_blocks",
                           "Blocks a windowed layer group released behind its window")),
        group_evictions(counter_family("kv_cache_group_evictions",
                                       "Cached blocks of a layer group evicted to reuse them")),
        group_host_evictions(counter_family("kv_cache_group_host_evictions",
                                            "Host-tier blocks of a layer group evicted")),
        group_demoted(
            counter_family("kv_cache_group_blocks_demoted",
                           "Evicted cached blocks of a layer group copied to its host tier")),
        group_promoted(counter_family("kv_cache_group_blocks_promoted",
                                      "Host-tier hits of a layer group copied back to the device")),
        events_published(counter("kv_events_published", "KV events sent to subscribers")),
        events_dropped_hwm(
            counter("kv_events_dropped", "KV events dropped", {{"reason", "subscriber_hwm"}})),
        events_dropped_queue(
            counter("kv_events_dropped", "KV events dropped", {{"reason", "publisher_queue"}})),
        replay_requests(counter("kv_events_replay_requests", "Replay requests served")),
        snapshot_requests(counter("kv_events_snapshot_requests", "Snapshot requests served")),
        requests_refused(counter("kv_events_requests_refused",
                                 "Replay or snapshot requests refused (one pending per peer, "
                                 "or too many pending)")),
        stalled_peers_dropped(counter("kv_events_stalled_peers_dropped",
                                      "Replies given up because the peer did not read")),
        remote_lookups(counter("remote_lookups", "Remote-tier lookups sent to the store")),
        remote_lookup_blocks(counter("remote_lookup_blocks", "Blocks remote lookups asked for")),
        remote_blocks(remote_block_counters()),
        remote_timed_out(
            counter("remote_lookups_timed_out", "Lookups admitted with gets still in flight")),
        remote_loaded_tokens(
            counter("prefix_cache_remote_hits", "Prompt tokens loaded from the remote tier")),
        remote_written_blocks(counter("remote_written_blocks", "Blocks written to the store")),
        remote_write_failures(
            counter("remote_write_failures", "Block writes that failed or were dropped")),
        remote_bytes_read(counter("remote_bytes_read", "Value bytes fetched from the store")),
        remote_bytes_written(counter("remote_bytes_written", "Value bytes stored")),
        remote_dropped_puts(
            counter("remote_dropped_puts", "Store put requests dropped on a full queue")),
        remote_store_errors(counter("remote_store_errors", "Keys the store failed")),
        remote_reconnects(counter("remote_reconnects", "Store connections re-established")),
        remote_latency(prometheus::BuildHistogram()
                           .Name(prefix + "remote_request_latency_seconds")
                           .Help("Store request latency, enqueue to completion")
                           .Register(*registry)
                           .Add(labels, latency_bounds())) {}

  static prometheus::Histogram::BucketBoundaries latency_bounds() {
    prometheus::Histogram::BucketBoundaries bounds;
    for (const int64_t us : kRemoteLatencyBoundsUs) bounds.push_back(static_cast<double>(us) / 1e6);
    return bounds;
  }

  prometheus::Gauge& gauge(const std::string& name, const std::string& help) {
    return prometheus::BuildGauge().Name(prefix + name).Help(help).Register(*registry).Add(labels);
  }

  prometheus::Family<prometheus::Gauge>& gauge_family(const std::string& name,
                                                      const std::string& help) {
    return prometheus::BuildGauge().Name(prefix + name).Help(help).Register(*registry);
  }

  prometheus::Family<prometheus::Counter>& counter_family(const std::string& name,
                                                          const std::string& help) {
    return prometheus::BuildCounter().Name(prefix + name + "_total").Help(help).Register(*registry);
  }

  // The series of group `index` of kind `kind`, added at its first update: a manager with
  // other groups (a new one) gets series of its own.
  GroupSeries& group_series(int32_t index, AttentionKind kind) {
    const auto key = std::make_pair(index, kind);
    auto it = groups.find(key);
    if (it != groups.end()) return it->second;
    prometheus::Labels all = labels;
    all.emplace("group", std::to_string(index));
    all.emplace("kind", kind_label(kind));
    GroupSeries series{&group_usage.Add(all),
                       &group_num_blocks.Add(all),
                       &group_used_blocks.Add(all),
                       &group_cached_free_blocks.Add(all),
                       &group_cached_host_blocks.Add(all),
                       MonotonicCounter(group_hit_blocks.Add(all)),
                       MonotonicCounter(group_released_blocks.Add(all)),
                       MonotonicCounter(group_evictions.Add(all)),
                       MonotonicCounter(group_host_evictions.Add(all)),
                       MonotonicCounter(group_demoted.Add(all)),
                       MonotonicCounter(group_promoted.Add(all))};
    return groups.emplace(key, series).first->second;
  }

  // remote_blocks{outcome}, one series per entry of kRemoteBlockOutcomes, in its order.
  std::vector<MonotonicCounter> remote_block_counters() {
    std::vector<MonotonicCounter> counters;
    counters.reserve(kRemoteBlockOutcomes.size());
    for (const RemoteBlockOutcome& outcome : kRemoteBlockOutcomes) {
      counters.push_back(
          counter("remote_blocks", "Fetched blocks, by outcome", {{"outcome", outcome.label}}));
    }
    return counters;
  }

  MonotonicCounter counter(const std::string& name, const std::string& help,
                           const prometheus::Labels& extra = {}) {
    prometheus::Labels all = labels;
    all.insert(extra.begin(), extra.end());
    // "_total" as prometheus_client (vLLM) writes counters. Families are keyed by name: a
    // second Register() of the same name returns the first.
    return MonotonicCounter(prometheus::BuildCounter()
                                .Name(prefix + name + "_total")
                                .Help(help)
                                .Register(*registry)
                                .Add(all));
  }

  std::string prefix;
  int32_t num_threads;
  int32_t request_timeout_ms;
  prometheus::Labels labels;
  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Gauge& usage;
  prometheus::Gauge& num_blocks;
  prometheus::Gauge& used_blocks;
  prometheus::Gauge& cached_free_blocks;
  prometheus::Gauge& host_usage;
  prometheus::Gauge& cached_host_blocks;
  MonotonicCounter prefix_queries, prefix_hits, preemptions_recompute, preemptions_swap, evictions,
      cow_copies, swapped_out, swapped_in, host_hits, demoted, promoted, host_evictions,
      not_admitted, ghost_hits, recent_ghost_hits, frequent_ghost_hits, partial_hits;
  prometheus::Family<prometheus::Gauge>&group_usage, &group_num_blocks, &group_used_blocks,
      &group_cached_free_blocks, &group_cached_host_blocks;
  prometheus::Family<prometheus::Counter>&group_hit_blocks, &group_released_blocks,
      &group_evictions, &group_host_evictions, &group_demoted, &group_promoted;
  std::map<std::pair<int32_t, AttentionKind>, GroupSeries> groups;
  MonotonicCounter events_published, events_dropped_hwm, events_dropped_queue, replay_requests,
      snapshot_requests, requests_refused, stalled_peers_dropped;
  MonotonicCounter remote_lookups, remote_lookup_blocks;
  std::vector<MonotonicCounter> remote_blocks;  // indexed as kRemoteBlockOutcomes
  MonotonicCounter remote_timed_out, remote_loaded_tokens, remote_written_blocks,
      remote_write_failures, remote_bytes_read, remote_bytes_written, remote_dropped_puts,
      remote_store_errors, remote_reconnects;
  prometheus::Histogram& remote_latency;
  RemoteKvStats last_store;  // the histogram's buckets and sum at the last update
  std::unique_ptr<prometheus::Exposer> exposer;
};

}  // namespace internal

absl::StatusOr<std::unique_ptr<KvCacheMetrics>> KvCacheMetrics::create(Options options) {
  const std::string probe = options.prefix + "kv_cache_usage_perc";
  if (!prometheus::CheckMetricName(probe)) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheMetrics: prefix \"", options.prefix,
                                                   "\" gives the invalid metric name ", probe));
  }
  if (options.num_threads < 1 || options.num_threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvCacheMetrics: num_threads ", options.num_threads, " is not in 1..", kMaxThreads));
  }
  if (options.request_timeout_ms < 1 || options.request_timeout_ms > kMaxTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheMetrics: request_timeout_ms ",
                                                   options.request_timeout_ms, " is not in 1..",
                                                   kMaxTimeoutMs));
  }
  return std::unique_ptr<KvCacheMetrics>(
      new KvCacheMetrics(std::make_unique<internal::MetricsState>(options)));
}

KvCacheMetrics::KvCacheMetrics(std::unique_ptr<internal::MetricsState> state)
    : state_(std::move(state)) {}

KvCacheMetrics::~KvCacheMetrics() = default;

absl::Status KvCacheMetrics::serve(const std::string& bind_address) {
  if (state_->exposer) {
    return absl::FailedPreconditionError(absl::StrCat("KvCacheMetrics::serve(", bind_address,
                                                      "): already serving on port ", port()));
  }
  try {
    // civetweb's options. Keep-alive stays off (civetweb's default): each scrape's
    // connection closes after its answer, so none holds a worker between scrapes.
    auto exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", bind_address, "num_threads", std::to_string(state_->num_threads),
        "request_timeout_ms", std::to_string(state_->request_timeout_ms)});
    exposer->RegisterCollectable(state_->registry);
    state_->exposer = std::move(exposer);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("KvCacheMetrics::serve: cannot bind ", bind_address, ": ", e.what()));
  }
  return absl::OkStatus();
}

int KvCacheMetrics::port() const {
  if (!state_->exposer) return 0;
  const std::vector<int> ports = state_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void KvCacheMetrics::update(const KvCacheManager::Stats& s) {
  internal::MetricsState& m = *state_;
  m.usage.Set(s.num_blocks > 0 ? static_cast<double>(s.used_blocks) / s.num_blocks : 0.0);
  m.num_blocks.Set(s.num_blocks);
  m.used_blocks.Set(s.used_blocks);
  m.cached_free_blocks.Set(s.cached_free_blocks);
  m.host_usage.Set(
      s.num_host_blocks > 0 ? static_cast<double>(s.used_host_blocks) / s.num_host_blocks : 0.0);
  m.prefix_queries.advance_to(s.prefix_query_tokens);
  m.prefix_hits.advance_to(s.prefix_hit_tokens);
  m.preemptions_recompute.advance_to(s.preemptions_recompute);
  m.preemptions_swap.advance_to(s.preemptions_swap);
  m.evictions.advance_to(s.evictions);
  m.cow_copies.advance_to(s.cow_copies);
  m.swapped_out.advance_to(s.blocks_swapped_out);
  m.swapped_in.advance_to(s.blocks_swapped_in);
  m.cached_host_blocks.Set(s.cached_host_blocks);
  m.host_hits.advance_to(s.host_hit_tokens);
  m.demoted.advance_to(s.blocks_demoted);
  m.promoted.advance_to(s.blocks_promoted);
  m.host_evictions.advance_to(s.host_evictions);
  m.not_admitted.advance_to(s.blocks_not_admitted);
  m.ghost_hits.advance_to(s.ghost_hits);
  m.recent_ghost_hits.advance_to(s.recent_ghost_hits);
  m.frequent_ghost_hits.advance_to(s.frequent_ghost_hits);
  m.partial_hits.advance_to(s.partial_hit_tokens);
}

void KvCacheMetrics::update(const KvCacheManager& manager) {
  update(manager.stats());
  for (int32_t g = 0; g < manager.num_groups(); ++g) {
    const KvCacheManager::GroupStats s = *manager.group_stats(g);
    internal::GroupSeries& m = state_->group_series(g, manager.layer_group(g)->kind);
    m.usage->Set(s.num_blocks > 0 ? static_cast<double>(s.used_blocks) / s.num_blocks : 0.0);
    m.num_blocks->Set(s.num_blocks);
    m.used_blocks->Set(s.used_blocks);
    m.cached_free_blocks->Set(s.cached_free_blocks);
    m.cached_host_blocks->Set(s.cached_host_blocks);
    m.hit_blocks.advance_to(s.hit_blocks);
    m.released_blocks.advance_to(s.released_blocks);
    m.evictions.advance_to(s.evictions);
    m.host_evictions.advance_to(s.host_evictions);
    m.demoted.advance_to(s.blocks_demoted);
    m.promoted.advance_to(s.blocks_promoted);
  }
}

void KvCacheMetrics::update(const KvEventPublisher::Stats& s) {
  internal::MetricsState& m = *state_;
  m.events_published.advance_to(s.events_published);
  m.events_dropped_hwm.advance_to(s.events_dropped_hwm);
  m.events_dropped_queue.advance_to(s.events_dropped_queue);
  m.replay_requests.advance_to(s.replay_requests);
  m.snapshot_requests.advance_to(s.snapshot_requests);
  m.requests_refused.advance_to(s.requests_refused);
  m.stalled_peers_dropped.advance_to(s.stalled_peers_dropped);
}

void KvCacheMetrics::update(const RemoteTierStats& t, const RemoteKvStats& s) {
  internal::MetricsState& m = *state_;
  m.remote_lookups.advance_to(t.lookups);
  m.remote_lookup_blocks.advance_to(t.lookup_blocks);
  for (size_t i = 0; i < internal::kRemoteBlockOutcomes.size(); ++i) {
    m.remote_blocks[i].advance_to(t.*internal::kRemoteBlockOutcomes[i].blocks);
  }
  m.remote_timed_out.advance_to(t.timed_out);
  m.remote_loaded_tokens.advance_to(t.loaded_tokens);
  m.remote_written_blocks.advance_to(t.written_blocks);
  m.remote_write_failures.advance_to(t.write_failures);
  m.remote_bytes_read.advance_to(s.bytes_read);
  m.remote_bytes_written.advance_to(s.bytes_written);
  m.remote_dropped_puts.advance_to(s.dropped_puts);
  m.remote_store_errors.advance_to(s.errors);
  m.remote_reconnects.advance_to(s.reconnects);
  // The store's histogram is cumulative: observe the growth of each bucket since last time.
  std::vector<double> growth(s.latency_histogram.size());
  bool grew = false;
  for (size_t i = 0; i < growth.size(); ++i) {
    const int64_t d = s.latency_histogram[i] - m.last_store.latency_histogram[i];
    growth[i] = static_cast<double>(std::max<int64_t>(0, d));
    grew = grew || d > 0;
  }
  if (grew) {
    m.remote_latency.ObserveMultiple(
        growth, static_cast<double>(s.latency_sum_us - m.last_store.latency_sum_us) * 1e-6);
  }
  m.last_store = s;
}

std::string KvCacheMetrics::text() const {
  return prometheus::TextSerializer().Serialize(state_->registry->Collect());
}

}  // namespace pagedkv
