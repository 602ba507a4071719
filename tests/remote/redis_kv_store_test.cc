// RedisKvStore against a real redis-server (tests/remote/redis_server.h) on a free
// loopback port: round trips, bad input, a server killed and restarted, a stalled server,
// AUTH and a full queue. Without redis-server the cases report themselves skipped.
#include "pagedkv/redis_kv_store.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <thread>

#include "remote/redis_kv_store.h"
#include "remote/redis_server.h"
#include "remote/store_test_util.h"

namespace pagedkv {
namespace {

using testing::all_results;
using testing::make_store;
using testing::milliseconds;
using testing::Poller;
using testing::RedisServer;
using testing::skip_without_redis;
using testing::test_keys;
using testing::test_value;

// Puts `keys` with test values and waits until every key is stored.
void put_and_wait(RemoteKvStore& store, Poller& poller, const std::vector<std::string>& keys,
                  size_t value_size) {
  std::vector<std::string> values;
  for (size_t i = 0; i < keys.size(); ++i) values.push_back(test_value(int(i), value_size));
  absl::StatusOr<RemoteRequestId> id = store.put(keys, std::move(values));
  REQUIRE(id.ok());
  const RemoteCompletion done = poller.wait(*id);
  INFO(done.error.ToString());
  REQUIRE(all_results(done, RemoteKeyResult::kOk));
}

TEST_CASE("remote_block_key formats the namespace and the 128-bit hash", "[remote]") {
  CHECK(remote_block_key("llama-8b-tp0", BlockHash{.lo = 0x0123456789abcdef, .hi = 0xff}) ==
        "pagedkv:llama-8b-tp0:00000000000000ff0123456789abcdef");
}

TEST_CASE("a batch of puts, gets and exists round-trips, values up to 2 MiB", "[remote][redis]") {
  if (skip_without_redis()) return;
  RedisServer server(testing::free_loopback_port(), {});
  auto store = make_store({.url = server.url()});
  Poller poller(*store);

  // 200 small values and 4 of 2 MiB, in one put.
  std::vector<std::string> keys = test_keys("k", 204);
  std::vector<std::string> values;
  for (int i = 0; i < 204; ++i) values.push_back(test_value(i, i < 200 ? 100 + i : 2 << 20));
  const auto put = store->put(keys, values);
  REQUIRE(put.ok());
  const RemoteCompletion stored = poller.wait(*put);
  CHECK(stored.op == RemoteOp::kPut);
  REQUIRE(stored.results.size() == 204);
  CHECK(all_results(stored, RemoteKeyResult::kOk));
  CHECK(stored.error.ok());

  // Read back with 10 missing keys interleaved.
  std::vector<std::string> asked = keys;
  for (int i = 0; i < 10; ++i) asked.insert(asked.begin() + 20 * i, "missing:" + std::to_string(i));
  const auto get = store->get(asked);
  const auto exists = store->exists(asked);
  REQUIRE((get.ok() && exists.ok()));
  const RemoteCompletion got = poller.wait(*get);
  const RemoteCompletion present = poller.wait(*exists);
  REQUIRE(got.values.size() == asked.size());
  for (size_t i = 0; i < asked.size(); ++i) {
    const bool missing = asked[i].starts_with("missing:");
    const RemoteKeyResult expected = missing ? RemoteKeyResult::kNotFound : RemoteKeyResult::kOk;
    INFO("key " << asked[i]);
    CHECK(got.results[i] == expected);
    CHECK(present.results[i] == expected);
    if (!missing) CHECK(got.values[i] == values[std::stoi(asked[i].substr(2))]);
    if (missing) CHECK(got.values[i].empty());
  }
  CHECK(present.values.empty());

  int64_t total_bytes = 0;
  for (const std::string& v : values) total_bytes += std::ssize(v);
  const RemoteKvStats stats = store->stats();
  CHECK(stats.requests == 3);
  CHECK(stats.puts == 204);
  CHECK(stats.gets == 2 * 214);
  CHECK(stats.hits == 2 * 204);
  CHECK(stats.misses == 2 * 10);
  CHECK(stats.errors == 0);
  CHECK(stats.bytes_written == total_bytes);
  CHECK(stats.bytes_read == total_bytes);
  CHECK(stats.latency_max_us > 0);
  int64_t histogram_total = 0;
  for (int64_t n : stats.latency_histogram) histogram_total += n;
  CHECK(histogram_total == 3);
}

TEST_CASE("batches larger than one pipeline chunk round-trip in order", "[remote][redis]") {
  if (skip_without_redis()) return;
  RedisServer server(testing::free_loopback_port(), {});
  // 1 MiB chunks: each 2 MiB value goes alone; 3,000 keys take three 1,024-command chunks.
  auto store = make_store({.url = server.url(), .pipeline_bytes = 1 << 20});
  Poller poller(*store);
  std::vector<std::string> keys = test_keys("many", 3000);
  std::vector<std::string> values;
  for (int i = 0; i < 3000; ++i) values.push_back(test_value(i, i % 1000 == 0 ? 2 << 20 : 16));
  const auto put = store->put(keys, values);
  REQUIRE(put.ok());
  CHECK(all_results(poller.wait(*put), RemoteKeyResult::kOk));
  const auto get = store->get(keys);
  REQUIRE(get.ok());
  const RemoteCompletion got = poller.wait(*get);
  CHECK(all_results(got, RemoteKeyResult::kOk));
  CHECK(got.values == values);
}

TEST_CASE("a reply error fails its key only and keeps the connection", "[remote][redis]") {
  if (skip_without_redis()) return;
  RedisServer server(testing::free_loopback_port(), {});
  server.command({"LPUSH", "a-list", "x"});  // GET on a list: WRONGTYPE
  auto store = make_store({.url = server.url()});
  Poller poller(*store);
  put_and_wait(*store, poller, {"before", "after"}, 32);
  const auto get = store->get({"before", "a-list", "after"});
  REQUIRE(get.ok());
  const RemoteCompletion got = poller.wait(*get);
  CHECK(got.results == std::vector<RemoteKeyResult>{RemoteKeyResult::kOk, RemoteKeyResult::kError,
                                                    RemoteKeyResult::kOk});
  CHECK(got.values[2] == test_value(1, 32));
  CHECK_THAT(got.error.ToString(), Catch::Contains("key 'a-list': WRONGTYPE"));
  const RemoteKvStats stats = store->stats();
  CHECK(stats.errors == 1);
  CHECK(stats.hits == 2);
  CHECK(stats.reconnects == 0);
}

TEST_CASE("bad input is refused with the value and the limit named, and changes nothing",
          "[remote]") {
  // No server needed: a refused request never reaches the I/O thread.
  RedisKvStoreOptions options{.url = "redis://127.0.0.1:1"};
  options.limits.max_value_bytes = 1 << 20;
  options.limits.max_key_bytes = 16;
  auto store = make_store(options);
  const RemoteKvStats before = store->stats();

  const auto expect_refused = [](const absl::StatusOr<RemoteRequestId>& id,
                                 const std::string& fragment) {
    INFO(id.status().ToString());
    REQUIRE(id.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(id.status().message()), Catch::Contains(fragment));
  };
  expect_refused(store->put({}, {}), "put: no keys");
  expect_refused(store->get({"a", ""}), "get: key 1 of 2 is empty");
  expect_refused(store->exists({"0123456789abcdefXYZ"}),
                 "key 0 is 19 bytes; the limit is max_key_bytes 16");
  expect_refused(store->put({"a", "b"}, {"x"}), "put: 2 keys but 1 values");
  expect_refused(store->put({"a", "big"}, {"x", std::string((1 << 20) + 1, 'v')}),
                 "value of key 1 ('big') is 1048577 bytes; the limit is max_value_bytes 1048576");

  std::vector<RemoteCompletion> done;
  CHECK(store->poll(&done) == 0);
  const RemoteKvStats after = store->stats();
  CHECK(after.requests == before.requests);
  CHECK(after.puts == before.puts);
  CHECK(after.gets == before.gets);
  CHECK(after.queued_requests == 0);
  CHECK(after.dropped_puts == 0);
}

TEST_CASE("malformed options are refused naming the setting, never the password", "[remote]") {
  const auto code_and_message = [](const RedisKvStoreOptions& options) {
    const auto store = create_redis_kv_store(options);
    REQUIRE(!store.ok());
    return std::pair(store.status().code(), std::string(store.status().message()));
  };
  CHECK(code_and_message({.url = "http://h:1"}).second.find("not a redis:// URL") !=
        std::string::npos);
  CHECK(code_and_message({.url = "redis://h:99999"}).second.find("port") != std::string::npos);
  CHECK(code_and_message({.url = "redis://h:1/x"}).second.find("database") != std::string::npos);
  const auto [code, message] = code_and_message({.url = "redis://:secret@h:1"});
  CHECK(code == absl::StatusCode::kInvalidArgument);
  CHECK(message.find("secret") == std::string::npos);
  CHECK(message.find("password_env") != std::string::npos);
  unsetenv("PAGEDKV_TEST_NO_SUCH_VARIABLE");
  CHECK(code_and_message({.password_env = "PAGEDKV_TEST_NO_SUCH_VARIABLE"})
            .second.find("PAGEDKV_TEST_NO_SUCH_VARIABLE") != std::string::npos);
  CHECK(code_and_message({.command_timeout_ms = 0}).second ==
        "redis: command_timeout_ms is 0; it must be positive");

  const auto endpoint = internal::parse_redis_url("redis://[::1]:6380/3");
  REQUIRE(endpoint.ok());
  CHECK(endpoint->host == "::1");
  CHECK(endpoint->port == 6380);
  CHECK(endpoint->db == 3);
}

TEST_CASE("a server killed mid-run: requests fail without blocking, then the store reconnects",
          "[remote][redis]") {
  if (skip_without_redis()) return;
  RedisServer server(testing::free_loopback_port(), {});
  auto store = make_store({.url = server.url(),
                           .connect_timeout_ms = 200,
                           .command_timeout_ms = 1000,
                           .reconnect_backoff_min_ms = 20,
                           .reconnect_backoff_max_ms = 200});
  Poller poller(*store);
  put_and_wait(*store, poller, test_keys("before", 8), 4096);

  server.kill9();
  // 300 ms of traffic against a dead server, a request every 2 ms.
  std::vector<RemoteRequestId> during;
  const auto outage_end = std::chrono::steady_clock::now() + milliseconds(300);
  for (int i = 0; std::chrono::steady_clock::now() < outage_end; ++i) {
    const auto id = poller.timed([&] {
      return i % 2 == 0 ? store->put(test_keys("during", 4), std::vector<std::string>(4, "v"))
                        : store->get(test_keys("before", 8));
    });
    REQUIRE(id.ok());
    during.push_back(*id);
    poller.poll_once();
    std::this_thread::sleep_for(milliseconds(2));
  }
  for (RemoteRequestId id : during) {
    const RemoteCompletion done = poller.wait(id, milliseconds(5000));
    CHECK(all_results(done, RemoteKeyResult::kError));
    CHECK(done.error.code() == absl::StatusCode::kUnavailable);
  }
  CHECK(poller.slowest_call() < milliseconds(10));
  CHECK(store->stats().errors > 0);

  server.start();  // same port, empty (no persistence)
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(5000);
  bool recovered = false;
  while (!recovered && std::chrono::steady_clock::now() < deadline) {
    const auto id = store->put({"after"}, {test_value(7, 1 << 20)});
    REQUIRE(id.ok());
    recovered = all_results(poller.wait(*id), RemoteKeyResult::kOk);
    if (!recovered) std::this_thread::sleep_for(milliseconds(20));
  }
  REQUIRE(recovered);
  const auto get = store->get({"after", "before:0"});
  REQUIRE(get.ok());
  const RemoteCompletion got = poller.wait(*get);
  CHECK(got.results[0] == RemoteKeyResult::kOk);
  CHECK(got.values[0] == test_value(7, 1 << 20));
  CHECK(got.results[1] == RemoteKeyResult::kNotFound);  // the restarted server is empty
  CHECK(store->stats().reconnects >= 1);
}

TEST_CASE("a stalled server (DEBUG SLEEP) times requests out and never blocks a poll",
          "[remote][redis]") {
  if (skip_without_redis()) return;
  RedisServer server(testing::free_loopback_port(), {});
  auto store = make_store({.url = server.url(), .command_timeout_ms = 300});
  Poller poller(*store);
  put_and_wait(*store, poller, {"x"}, 1000);

  std::thread sleeper([&] { server.command({"DEBUG", "SLEEP", "2"}); });
  server.wait_until_asleep();
  const auto stall_start = std::chrono::steady_clock::now();
  const auto id = poller.timed([&] { return store->get({"x"}); });
  REQUIRE(id.ok());
  const RemoteCompletion stalled = poller.wait(*id, milliseconds(1500));
  CHECK(std::chrono::steady_clock::now() - stall_start < milliseconds(1500));
  CHECK(stalled.results[0] == RemoteKeyResult::kError);
  CHECK_THAT(stalled.error.ToString(), Catch::Contains("command_timeout_ms 300"));
  CHECK(poller.slowest_call() < milliseconds(10));
  sleeper.join();

  // Awake again: the next requests reconnect and read the value.
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(5000);
  RemoteKeyResult result = RemoteKeyResult::kError;
  while (result != RemoteKeyResult::kOk && std::chrono::steady_clock::now() < deadline) {
    const auto again = store->get({"x"});
    REQUIRE(again.ok());
    result = poller.wait(*again).results[0];
  }
  CHECK(result == RemoteKeyResult::kOk);
}

TEST_CASE("AUTH with --requirepass: from an environment variable or a file", "[remote][redis]") {
  if (skip_without_redis()) return;
  const std::string password = "pagedkv-test-pw-71";
  RedisServer server(testing::free_loopback_port(), {"--requirepass", password});

  SECTION("the right password, from the environment, then from a file") {
    setenv("PAGEDKV_TEST_REDIS_PASSWORD", password.c_str(), 1);
    const std::string file = "/tmp/pagedkv-test-redis-pw-" + std::to_string(server.port());
    std::ofstream(file) << password << "\n";
    for (RedisKvStoreOptions options :
         {RedisKvStoreOptions{.url = server.url(), .password_env = "PAGEDKV_TEST_REDIS_PASSWORD"},
          RedisKvStoreOptions{.url = server.url() + "/1", .password_file = file}}) {
      auto store = make_store(options);
      Poller poller(*store);
      put_and_wait(*store, poller, {"authed"}, 64);
      const auto get = store->get({"authed"});
      REQUIRE(get.ok());
      CHECK(poller.wait(*get).values[0] == test_value(0, 64));
    }
    std::remove(file.c_str());
    unsetenv("PAGEDKV_TEST_REDIS_PASSWORD");
  }
  SECTION("no password or a wrong one: every key fails, the password never shows") {
    setenv("PAGEDKV_TEST_REDIS_PASSWORD", "wrong-pw-123", 1);
    for (RedisKvStoreOptions options : {RedisKvStoreOptions{.url = server.url()},
                                        RedisKvStoreOptions{.url = server.url(),
                                        .password_env = "PAGEDKV_TEST_REDIS_PASSWORD"}}) {
      auto store = make_store(options);
      Poller poller(*store);
      const auto put = store->put({"k"}, {"v"});
      REQUIRE(put.ok());
      const RemoteCompletion done = poller.wait(*put);
      CHECK(done.results[0] == RemoteKeyResult::kError);
      INFO(done.error.ToString());
      CHECK((done.error.ToString().find("NOAUTH") != std::string::npos ||
             done.error.ToString().find("WRONGPASS") != std::string::npos));
      CHECK(done.error.ToString().find("wrong-pw-123") == std::string::npos);
    }
    unsetenv("PAGEDKV_TEST_REDIS_PASSWORD");
  }
}

TEST_CASE("a full queue drops puts and fails gets fast, counted, without blocking",
          "[remote][redis]") {
  if (skip_without_redis()) return;
  RedisServer server(testing::free_loopback_port(), {});
  RedisKvStoreOptions options{.url = server.url(), .command_timeout_ms = 5000};
  options.limits.max_queued_requests = 2;
  auto store = make_store(options);
  Poller poller(*store);
  put_and_wait(*store, poller, {"warm"}, 8);  // connected

  // The I/O thread waits on a sleeping server with one request; two more fill the queue.
  std::thread sleeper([&] { server.command({"DEBUG", "SLEEP", "1"}); });
  server.wait_until_asleep();
  const auto in_flight = store->get({"warm"});
  REQUIRE(in_flight.ok());
  while (store->stats().queued_requests != 0) std::this_thread::sleep_for(milliseconds(1));
  std::vector<RemoteRequestId> queued, refused;
  for (const std::string& key : test_keys("queued", 2)) {
    queued.push_back(*store->put({key}, {"v"}));
  }
  for (const std::string& key : test_keys("dropped", 3)) {
    refused.push_back(*poller.timed([&] { return store->put({key}, {"v"}); }));
  }
  for (int i = 0; i < 2; ++i)
    refused.push_back(*poller.timed([&] { return store->get({"warm"}); }));

  // The refused ones complete at once, while the server still sleeps.
  for (size_t i = 0; i < refused.size(); ++i) {
    const RemoteCompletion done = poller.wait(refused[i], milliseconds(100));
    CHECK(done.queue_full);
    CHECK(done.error.code() == absl::StatusCode::kResourceExhausted);
    CHECK(all_results(done, i < 3 ? RemoteKeyResult::kError : RemoteKeyResult::kNotFound));
  }
  CHECK(poller.slowest_call() < milliseconds(10));
  const RemoteKvStats stats = store->stats();
  CHECK(stats.dropped_puts == 3);
  CHECK(stats.failed_fast == 2);
  CHECK(stats.queued_requests == 2);

  sleeper.join();
  CHECK(poller.wait(*in_flight).results[0] == RemoteKeyResult::kOk);
  for (RemoteRequestId id : queued) {
    const RemoteCompletion done = poller.wait(id);
    CHECK(!done.queue_full);
    CHECK(all_results(done, RemoteKeyResult::kOk));
  }
  CHECK(store->stats().puts == 3);  // "warm" and the two queued; dropped ones not counted
}

}  // namespace
}  // namespace pagedkv
