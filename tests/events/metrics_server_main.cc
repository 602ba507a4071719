// A metrics endpoint for check_metrics_abuse.py: serves KvCacheMetrics on 127.0.0.1 (a free
// port, printed on the first line) until stdin closes.
// usage: pagedkv-metrics-server [NUM_THREADS REQUEST_TIMEOUT_MS]  (default: the Options')
#include <cstdlib>
#include <iostream>
#include <string>

#include "pagedkv/kv_cache_metrics.h"

int main(int argc, char** argv) {
  pagedkv::KvCacheMetrics::Options options;
  if (argc == 3) {
    options.num_threads = std::atoi(argv[1]);
    options.request_timeout_ms = std::atoi(argv[2]);
  }
  auto metrics = pagedkv::KvCacheMetrics::create(options);
  if (!metrics.ok()) {
    std::cerr << metrics.status() << "\n";
    return 1;
  }
  if (absl::Status s = (*metrics)->serve("127.0.0.1:0"); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  std::cout << (*metrics)->port() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}
