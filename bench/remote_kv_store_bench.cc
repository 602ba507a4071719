// remote_kv_store_bench: put and get throughput of a RemoteKvStore, in MiB/s of values,
// with the caller enqueuing batches and polling as a scheduler would. For a redis:// URL
// it also runs redis-benchmark (when on PATH) against the same server, alternating with
// the store's runs, with the same value size and count, one connection and the batch as
// its pipeline depth (-P), and prints both rates and their ratio, the best of `repeats`
// runs each. scripts/remote-bench.sh starts a redis-server for it; docs/remote.md
// records the figures.
// Usage: remote_kv_store_bench redis://127.0.0.1:6379 [value_kib=2048] [values=256]
//        [batch=8] [repeats=3]      (or dir:///path for a DirectoryKvStore)
#include <algorithm>
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
  int repeats = 3;
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

// Enqueues every value in batches (puts when `put`, else gets), polls until all have
// completed, and returns MiB/s of values moved; exits on any key not kOk. The values of a
// put are built before the clock starts and moved into the store, as an engine hands over
// the buffers it encoded; a get's values are dropped as they are polled, as an engine
// consumes them.
double run(RemoteKvStore& store, const Config& config, bool put) {
  std::vector<std::vector<std::string>> batches;
  for (int first = 0; first < config.values; first += config.batch) {
    const int n = std::min(config.batch, config.values - first);
    batches.emplace_back(put ? n : 0, std::string(config.value_bytes, 'v'));
  }
  const auto start = std::chrono::steady_clock::now();
  int first = 0;
  for (std::vector<std::string>& values : batches) {
    std::vector<std::string> keys;
    for (int i = first; i < std::min(first + config.batch, config.values); ++i) {
      keys.push_back(key_of(i));
    }
    first += config.batch;
    auto id = put ? store.put(std::move(keys), std::move(values)) : store.get(std::move(keys));
    if (!id.ok()) {
      std::fprintf(stderr, "%s\n", id.status().ToString().c_str());
      std::exit(1);
    }
  }
  std::vector<RemoteCompletion> done;
  for (size_t completed = 0; completed < batches.size(); done.clear()) {
    if (store.poll(&done) == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    for (const RemoteCompletion& c : done) {
      for (size_t i = 0; i < c.results.size(); ++i) {
        if (c.results[i] != RemoteKeyResult::kOk ||
            (!put && c.values[i].size() != config.value_bytes)) {
          std::fprintf(stderr, "request %llu: %s\n", static_cast<unsigned long long>(c.id),
                       c.error.ToString().c_str());
          std::exit(1);
        }
      }
    }
    completed += done.size();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(config.value_bytes) * config.values / (1 << 20) / seconds;
}

// redis-benchmark's SET and GET rates in MiB/s, from one run of
//   redis-benchmark -h HOST -p PORT -t set,get -d BYTES -n VALUES -P BATCH -c 1 -q
// on the URL's server: the same values over one connection, BATCH commands in flight
// (the store pipelines a batch and waits for its replies). Zeros when it cannot run.
std::pair<double, double> redis_benchmark(const Config& config) {
  std::string address = config.url.substr(std::string("redis://").size());
  address = address.substr(0, address.find('/'));
  const size_t colon = address.rfind(':');
  const std::string command =
      "redis-benchmark -h " + address.substr(0, colon) + " -p " + address.substr(colon + 1) +
      " -t set,get -d " + std::to_string(config.value_bytes) + " -n " +
      std::to_string(config.values) + " -P " + std::to_string(config.batch) + " -c 1 -q 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {0, 0};
  std::string output;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  pclose(pipe);
  // The final line of each test reads "SET: 630.54 requests per second, p50=...";
  // progress lines before it end in '\r'.
  const auto rate = [&](const std::string& test) {
    double rps = 0;
    for (size_t at = output.find(test + ": "); at != std::string::npos;
         at = output.find(test + ": ", at + 1)) {
      const size_t end = output.find_first_of("\r\n", at);
      const std::string line = output.substr(at, end - at);
      if (line.find("requests per second") != std::string::npos) {
        rps = std::strtod(line.c_str() + test.size() + 2, nullptr);
      }
    }
    return rps * static_cast<double>(config.value_bytes) / (1 << 20);
  };
  return {rate("SET"), rate("GET")};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s URL [value_kib] [values] [batch] [repeats]\n", argv[0]);
    return 2;
  }
  Config config{.url = argv[1]};
  if (argc > 2) config.value_bytes = std::strtoull(argv[2], nullptr, 10) << 10;
  if (argc > 3) config.values = std::atoi(argv[3]);
  if (argc > 4) config.batch = std::atoi(argv[4]);
  if (argc > 5) config.repeats = std::max(1, std::atoi(argv[5]));
  const bool compare = config.url.starts_with("redis://");
  auto store = open_store(config);
  double put_mibs = 0, get_mibs = 0, set_mibs = 0, get_reference_mibs = 0;
  for (int i = 0; i < config.repeats; ++i) {
    put_mibs = std::max(put_mibs, run(*store, config, /*put=*/true));
    get_mibs = std::max(get_mibs, run(*store, config, /*put=*/false));
    if (!compare) continue;
    const auto [set, get] = redis_benchmark(config);
    set_mibs = std::max(set_mibs, set);
    get_reference_mibs = std::max(get_reference_mibs, get);
  }
  const pagedkv::RemoteKvStats stats = store->stats();
  std::printf(
      "%s: %d values of %zu KiB in batches of %d, best of %d: put %.0f MiB/s, get %.0f MiB/s "
      "(mean latency %.2f ms, max %.2f ms per request, queueing included)\n",
      config.url.c_str(), config.values, config.value_bytes >> 10, config.batch, config.repeats,
      put_mibs, get_mibs, stats.latency_sum_us / 1e3 / static_cast<double>(stats.requests),
      stats.latency_max_us / 1e3);
  if (set_mibs > 0 && get_reference_mibs > 0) {
    std::printf(
        "redis-benchmark -P %d -c 1, best of %d: SET %.0f MiB/s, GET %.0f MiB/s; "
        "store / redis-benchmark: put %.2f, get %.2f\n",
        config.batch, config.repeats, set_mibs, get_reference_mibs, put_mibs / set_mibs,
        get_mibs / get_reference_mibs);
  } else if (compare) {
    std::printf("redis-benchmark: not run (not on PATH?)\n");
  }
  return 0;
}
