#include "metrics_server.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

#ifdef PAGEDKV_HAVE_METRICS
#include "pagedkv/kv_cache_metrics.h"
#endif

namespace decode_loop {

#ifdef PAGEDKV_HAVE_METRICS
namespace {

class PrometheusServer : public MetricsServer {
 public:
  explicit PrometheusServer(std::unique_ptr<pagedkv::KvCacheMetrics> metrics)
      : metrics_(std::move(metrics)) {}
  void update(const pagedkv::KvCacheManager::Stats& stats) override { metrics_->update(stats); }
  void update(const pagedkv::KvEventPublisher::Stats& stats) override { metrics_->update(stats); }
  void update(const pagedkv::RemoteTierStats& tier, const pagedkv::RemoteKvStats& store) override {
    metrics_->update(tier, store);
  }

 private:
  std::unique_ptr<pagedkv::KvCacheMetrics> metrics_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::start(int port) {
  auto metrics = pagedkv::KvCacheMetrics::create({.model_name = "pagedkv-decode"});
  if (!metrics.ok()) return metrics.status();
  if (absl::Status s = (*metrics)->serve(absl::StrCat("127.0.0.1:", port)); !s.ok()) return s;
  std::fprintf(stderr, "pagedkv-decode: metrics on http://127.0.0.1:%d/metrics\n",
               (*metrics)->port());
  std::fflush(stderr);
  return std::unique_ptr<MetricsServer>(new PrometheusServer(*std::move(metrics)));
}
#else
absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::start(int port) {
  return absl::UnimplementedError(
      absl::StrCat("--metrics-port ", port,
                   ": pagedkv was built without prometheus-cpp (pagedkv::metrics); "
                   "install prometheus-cpp-dev (scripts/install-deps.sh) and reconfigure"));
}
#endif

}  // namespace decode_loop
