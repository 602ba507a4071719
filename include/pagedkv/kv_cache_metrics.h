// File: pagedkv/kv_cache_metrics.h
//
// KvCacheMetrics: the manager's counters (and an event publisher's) in Prometheus' text
// exposition format, through prometheus-cpp. Names and meanings follow vLLM's metrics
// with the prefix "pagedkv:" instead of "vllm:" (docs/events.md lists them):
//   pagedkv:kv_cache_usage_perc        gauge, used device blocks / all, 0..1
//   pagedkv:prefix_cache_queries_total counter, prompt tokens looked up in the prefix cache
//   pagedkv:prefix_cache_hits_total    counter, of those, tokens found
//   pagedkv:num_preemptions_total      counter, preempted sequences (label mode)
//   pagedkv:num_evictions_total        counter, cached blocks evicted to reuse them
// plus block gauges, copy-on-write and swap counters, the host tier's (cached host blocks,
// host hits in tokens, blocks demoted, promoted, evicted from the tier, not admitted to it,
// ghost hits), partial-block hits in tokens, the publisher's event counters, and with
// update(manager) one series per layer group (labels group and kind) of
// pagedkv:kv_cache_group_* gauges and counters: usage, blocks, cached blocks, blocks claimed
// by hits, released behind windows, evicted, demoted and promoted.
//
// Threading: update() on the scheduler thread (once per step is plenty); the HTTP server
// started by serve() reads the values from its own threads (prometheus-cpp's metrics are
// atomic).
//
// Example (in a function returning a Status, with a KvCacheManager `manager`):
//   auto metrics = KvCacheMetrics::create({.model_name = "llama-3.1-8b"});
//   if (!metrics.ok()) return metrics.status();
//   if (absl::Status s = (*metrics)->serve("127.0.0.1:9400"); !s.ok()) return s;  // /metrics
//   // then after every engine step:
//   (*metrics)->update(manager);  // stats() and every layer group's group_stats()
#ifndef PAGEDKV_KV_CACHE_METRICS_H_
#define PAGEDKV_KV_CACHE_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_event_publisher.h"
#include "pagedkv/remote_kv_store.h"
#include "pagedkv/remote_tier.h"

namespace pagedkv {
namespace internal {
struct MetricsState;
}  // namespace internal

class KvCacheMetrics {
 public:
  struct Options {
    std::string prefix = "pagedkv:";  // metric name prefix; vLLM's dashboards use "vllm:"
    std::string model_name = "";      // value of the model_name label (vLLM's); empty: none
    // The HTTP server (civetweb) serves one connection per worker thread, and a connection
    // that sends no complete request holds its worker until request_timeout_ms passes. So
    // a scrape behind N such connections waits about ceil(N / num_threads) timeouts:
    // 400 of them with the defaults, 7 x 100 ms. Each worker costs a thread and a 16 KiB
    // request buffer (docs/events.md, "Metrics").
    int32_t num_threads = 64;          // HTTP worker threads, 1..kMaxThreads
    int32_t request_timeout_ms = 100;  // for a request's headers to arrive, 1..kMaxTimeoutMs
  };
  static constexpr int32_t kMaxThreads = 1024;
  static constexpr int32_t kMaxTimeoutMs = 60000;

  // Errors: InvalidArgument when the prefix makes an invalid metric name, or num_threads
  // or request_timeout_ms is out of its range.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KvCacheMetrics>> create(Options options);
  ~KvCacheMetrics();
  KvCacheMetrics(const KvCacheMetrics&) = delete;
  KvCacheMetrics& operator=(const KvCacheMetrics&) = delete;

  // KvCacheMetrics::serve()
  //
  // Serves GET /metrics over HTTP on `bind_address` ("127.0.0.1:9400"; port 0 picks a free
  // one, see port()) until destruction. Errors: FailedPrecondition when already serving;
  // Unavailable when the address cannot be bound.
  [[nodiscard]] absl::Status serve(const std::string& bind_address);
  // The port being served, 0 before serve().
  int port() const;

  // Sets the gauges and advances the counters to `stats` (counters never go back).
  void update(const KvCacheManager::Stats& stats);
  // update(manager.stats()), and each layer group's series from group_stats(g): labels
  // group (its index) and kind (vLLM's KVCacheSpecKind value: full_attention,
  // sliding_window, chunked_local_attention, as the KV events name it).
  void update(const KvCacheManager& manager);
  void update(const KvEventPublisher::Stats& stats);
  // The remote tier's counters (pagedkv_remote_*_total, prefix_cache_remote_hits_total)
  // and its store's, with the store's latency histogram
  // (pagedkv_remote_request_latency_seconds; buckets kRemoteLatencyBoundsUs).
  void update(const RemoteTierStats& tier, const RemoteKvStats& store);

  // The exposition text that GET /metrics returns.
  std::string text() const;

 private:
  explicit KvCacheMetrics(std::unique_ptr<internal::MetricsState> state);
  std::unique_ptr<internal::MetricsState> state_;
};

}  // namespace pagedkv

#endif  // PAGEDKV_KV_CACHE_METRICS_H_
