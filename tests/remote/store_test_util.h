// Helpers for RemoteKvStore tests: a Poller that collects completions by request id and
// times every call made through it, and value makers.
#ifndef PAGEDKV_TESTS_REMOTE_STORE_TEST_UTIL_H_
#define PAGEDKV_TESTS_REMOTE_STORE_TEST_UTIL_H_

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "pagedkv/remote_kv_store.h"

namespace pagedkv::testing {

using std::chrono::milliseconds;

// `size` bytes that depend on `seed` and on the position, so that a value read back under
// the wrong key or truncated differs.
inline std::string test_value(int seed, size_t size) {
  std::string value(size, '\0');
  for (size_t i = 0; i < size; ++i) value[i] = static_cast<char>((seed * 131 + i * 7) & 0xff);
  return value;
}

inline std::vector<std::string> test_keys(const std::string& prefix, int count) {
  std::vector<std::string> keys;
  for (int i = 0; i < count; ++i) keys.push_back(prefix + ":" + std::to_string(i));
  return keys;
}

class Poller {
 public:
  explicit Poller(RemoteKvStore& store) : store_(store) {}

  // Runs `call` (an enqueue or a poll on the store) and records how long it took.
  template <typename Call>
  auto timed(Call call) {
    const auto start = std::chrono::steady_clock::now();
    auto result = call();
    slowest_ = std::max(slowest_, std::chrono::duration_cast<std::chrono::microseconds>(
                                      std::chrono::steady_clock::now() - start));
    return result;
  }

  void poll_once() {
    std::vector<RemoteCompletion> done;
    timed([&] { return store_.poll(&done); });
    for (RemoteCompletion& c : done) {
      REQUIRE(completed_.count(c.id) == 0);  // exactly one completion per request
      completed_.emplace(c.id, std::move(c));
    }
  }

  // Polls every millisecond until `id` has completed; fails the test after `timeout`.
  RemoteCompletion wait(RemoteRequestId id, milliseconds timeout = milliseconds(10000)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (completed_.count(id) == 0) {
      INFO("request " << id << " did not complete within " << timeout.count() << " ms");
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(milliseconds(1));
      poll_once();
    }
    RemoteCompletion c = std::move(completed_.at(id));
    completed_.erase(id);
    return c;
  }

  std::chrono::microseconds slowest_call() const { return slowest_; }

 private:
  RemoteKvStore& store_;
  std::map<RemoteRequestId, RemoteCompletion> completed_;
  std::chrono::microseconds slowest_{0};
};

inline bool all_results(const RemoteCompletion& c, RemoteKeyResult expected) {
  return std::all_of(c.results.begin(), c.results.end(),
                     [&](RemoteKeyResult r) { return r == expected; });
}

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_REMOTE_STORE_TEST_UTIL_H_
