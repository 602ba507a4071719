// remote_kv_store_bench: put and get throughput of a RemoteKvStore, in MiB/s of values,
// with the caller enqueuing batches and polling as a scheduler would. docs/remote.md
// records its figures beside redis-benchmark's on the same server.
// Usage: remote_kv_store_bench redis://127.0.0.1:6379 [value_kib=2048] [values=256]
//        [batch=8]           (or dir:///path for a DirectoryKvStore)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pagedkv/directory_kv_store.h"
#include "pagedkv/redis_kv_store.h"

namespace {

using pagedkv::RemoteCompletion;
using pagedkv::RemoteKeyResult;
using pagedkv::RemoteKvStore;

struct Config {
  std::string url;
  size_t value_bytes = 2 << 20;
  int values = 256;
  int batch = 8;
};

std::unique_ptr<RemoteKvStore> open_store(const Config& config) {
  pagedkv::RemoteKvLimits limits;
  limits.max_queued_requests = 1 << 20;  // a benchmark measures throughput, not drops
  limits.max_queued_bytes = 1ll << 40;
  auto store = config.url.starts_with("dir://")
                   ? pagedkv::create_directory_kv_store(
                         {.directory = config.url.substr(6), .limits = limits})
                   : pagedkv::create_redis_kv_store({.url = config.url, .limits = limits});
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(store);
}

std::string key_of(int i) { return "pagedkv:bench:" + std::to_string(i); }

// Enqueues every value in batches (puts, or gets when `values` is null), polls until all
// have completed, and returns MiB/s of values moved; exits on any key not kOk.
double run(RemoteKvStore& store, const Config& config, const std::string* value) {
  const auto start = std::chrono::steady_clock::now();
  int requests = 0;
  for (int first = 0; first < config.values; first += config.batch, ++requests) {
    std::vector<std::string> keys;
    for (int i = first; i < std::min(first + config.batch, config.values); ++i) {
      keys.push_back(key_of(i));
    }
    const size_t n = keys.size();
    auto id = value != nullptr ? store.put(std::move(keys), std::vector<std::string>(n, *value))
                               : store.get(std::move(keys));
    if (!id.ok()) {
      std::fprintf(stderr, "%s\n", id.status().ToString().c_str());
      std::exit(1);
    }
  }
  std::vector<RemoteCompletion> done;
  while (std::ssize(done) < requests) {
    if (store.poll(&done) == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const RemoteCompletion& c : done) {
    for (RemoteKeyResult r : c.results) {
      if (r != RemoteKeyResult::kOk) {
        std::fprintf(stderr, "request %llu: %s\n", static_cast<unsigned long long>(c.id),
                     c.error.ToString().c_str());
        std::exit(1);
      }
    }
  }
  return static_cast<double>(config.value_bytes) * config.values / (1 << 20) / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s URL [value_kib] [values] [batch]\n", argv[0]);
    return 2;
  }
  Config config{.url = argv[1]};
  if (argc > 2) config.value_bytes = std::strtoull(argv[2], nullptr, 10) << 10;
  if (argc > 3) config.values = std::atoi(argv[3]);
  if (argc > 4) config.batch = std::atoi(argv[4]);
  auto store = open_store(config);
  const std::string value(config.value_bytes, 'v');
  const double put_mibs = run(*store, config, &value);
  const double get_mibs = run(*store, config, nullptr);
  const pagedkv::RemoteKvStats stats = store->stats();
  std::printf(
      "%s: %d values of %zu KiB in batches of %d: put %.0f MiB/s, get %.0f MiB/s "
      "(mean latency %.2f ms, max %.2f ms per request, queueing included)\n",
      config.url.c_str(), config.values, config.value_bytes >> 10, config.batch, put_mibs, get_mibs,
      stats.latency_sum_us / 1e3 / static_cast<double>(stats.requests), stats.latency_max_us / 1e3);
  return 0;
}
