// --metrics-port: the engine's KV-cache metrics (pagedkv::KvCacheMetrics, Prometheus text
// format) served over HTTP while the decode loop runs.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_METRICS_SERVER_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_METRICS_SERVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_event_publisher.h"
#include "pagedkv/remote_kv_store.h"
#include "pagedkv/remote_tier.h"

namespace decode_loop {

class MetricsServer {
 public:
  // Serves GET /metrics on 127.0.0.1:`port` (0: a free port) and prints the URL on
  // stderr. Unimplemented when pagedkv was built without prometheus-cpp.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> start(int port);
  virtual ~MetricsServer() = default;
  virtual void update(const pagedkv::KvCacheManager::Stats& stats) = 0;
  // The publisher's counters (--kv-events): events published, requests served.
  virtual void update(const pagedkv::KvEventPublisher::Stats& stats) = 0;
  // The remote tier's and its store's counters (--remote).
  virtual void update(const pagedkv::RemoteTierStats& tier,
                      const pagedkv::RemoteKvStats& store) = 0;
};

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_METRICS_SERVER_H_
