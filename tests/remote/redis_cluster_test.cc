// RedisKvStore on a Redis Cluster: the key slot function against the specification's
// values, and a real three-master cluster (tests/remote/redis_test_cluster.h) on loopback: keys
// spread over every master, and a slot migration (redis-cli --cluster reshard) while puts
// and gets run through the store. Without redis-server or redis-cli the cluster cases
// report themselves skipped.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <map>

#include "pagedkv/redis_kv_store.h"
#include "remote/redis_cluster.h"
#include "remote/redis_test_cluster.h"
#include "remote/store_test_util.h"

namespace pagedkv {
namespace {

using internal::redis_crc16;
using internal::redis_key_slot;
using testing::all_results;
using testing::make_store;
using testing::Poller;
using testing::RedisCluster;
using testing::skip_without_redis_cli;
using testing::test_keys;
using testing::test_value;

TEST_CASE("key slots: CRC16 XMODEM mod 16384, of the hash tag when there is one", "[remote]") {
  CHECK(redis_crc16("123456789") == 0x31C3);  // the specification's check value
  CHECK(redis_crc16("") == 0);
  CHECK(redis_key_slot("123456789") == (0x31C3 & 16383));
  CHECK(redis_key_slot("foo") == 12182);  // CLUSTER KEYSLOT foo
  // The bytes between the first '{' and the next '}' are hashed, when there are any.
  CHECK(redis_key_slot("{user1000}.following") == redis_key_slot("user1000"));
  CHECK(redis_key_slot("{user1000}.followers") == redis_key_slot("user1000"));
  CHECK(redis_key_slot("foo{}{bar}") == (redis_crc16("foo{}{bar}") & 16383));
  CHECK(redis_key_slot("foo{{bar}}zap") == redis_key_slot("{bar"));
  CHECK(redis_key_slot("foo{bar}{zap}") == redis_key_slot("bar"));
  CHECK(redis_key_slot("no{close") == (redis_crc16("no{close") & 16383));
}

TEST_CASE("MOVED and ASK replies are parsed, other errors are not redirects", "[remote]") {
  const auto moved = internal::parse_redis_redirect("MOVED 3999 127.0.0.1:6381");
  REQUIRE(moved.has_value());
  CHECK(!moved->ask);
  CHECK(moved->slot == 3999);
  CHECK(moved->node == internal::RedisNodeAddress{.host = "127.0.0.1", .port = 6381});
  const auto ask = internal::parse_redis_redirect("ASK 0 ::1:7000");
  REQUIRE(ask.has_value());
  CHECK(ask->ask);
  CHECK(ask->node == internal::RedisNodeAddress{.host = "::1", .port = 7000});
  for (const char* other : {"WRONGTYPE Operation against a key", "MOVED 16384 h:1", "MOVED 1 h",
                            "ASK x h:1", "MOVED 1 h:0", "MOVED 1 :5"}) {
    INFO(other);
    CHECK(!internal::parse_redis_redirect(other).has_value());
  }
}

TEST_CASE("a cluster: keys land on every master and read back exactly", "[remote][redis]") {
  if (skip_without_redis_cli()) return;
  RedisCluster cluster;
  // The server's own slots agree with ours.
  for (const char* key : {"123456789", "{user1000}.following", "foo{}{bar}", "pagedkv:ns:00ff"}) {
    INFO(key);
    CHECK(cluster.server(0).command({"CLUSTER", "KEYSLOT", key}) ==
          std::to_string(redis_key_slot(key)));
  }

  auto store = make_store({.url = cluster.url()});
  Poller poller(*store);
  std::vector<std::string> keys = test_keys("cluster", 600);
  std::vector<std::string> values;
  // Small values, and some of 256 KiB that go out from the request's own string.
  for (int i = 0; i < 600; ++i) values.push_back(test_value(i, i % 100 == 0 ? 256 << 10 : 100 + i));
  const auto put = store->put(keys, values);
  REQUIRE(put.ok());
  const RemoteCompletion stored = poller.wait(*put);
  INFO(stored.error.ToString());
  CHECK(all_results(stored, RemoteKeyResult::kOk));

  std::vector<std::string> asked = keys;
  asked.push_back("cluster:missing");
  const auto get = store->get(asked);
  const auto exists = store->exists(asked);
  REQUIRE((get.ok() && exists.ok()));
  const RemoteCompletion got = poller.wait(*get);
  const RemoteCompletion present = poller.wait(*exists);
  for (size_t i = 0; i < keys.size(); ++i) {
    INFO("key " << keys[i]);
    REQUIRE(got.results[i] == RemoteKeyResult::kOk);
    CHECK(got.values[i] == values[i]);
    CHECK(present.results[i] == RemoteKeyResult::kOk);
  }
  CHECK(got.results.back() == RemoteKeyResult::kNotFound);
  CHECK(present.results.back() == RemoteKeyResult::kNotFound);

  int64_t total = 0;
  for (int i = 0; i < RedisCluster::kMasters; ++i) {
    INFO("master " << i);
    CHECK(cluster.dbsize(i) > 100);  // about a third each
    total += cluster.dbsize(i);
  }
  CHECK(total == 600);
  const RemoteKvStats stats = store->stats();
  CHECK(stats.errors == 0);
  CHECK(stats.redirects == 0);  // the slot map was read before the first key
  CHECK(stats.hits == 2 * 600);
}

TEST_CASE("a cluster: a redirect loop ends at max_redirects and ASK then MOVED follow a migration",
          "[remote][redis]") {
  if (skip_without_redis_cli()) return;
  RedisCluster cluster;
  // Slot 100 is the first master's; a key in it.
  std::string key;
  for (int n = 0; key.empty(); ++n) {
    if (redis_key_slot("ask:" + std::to_string(n)) == 100) key = "ask:" + std::to_string(n);
  }
  auto store = make_store({.url = cluster.url()});
  Poller poller(*store);
  const auto get_value = [&] {
    const auto get = store->get({key});
    REQUIRE(get.ok());
    const RemoteCompletion got = poller.wait(*get);
    INFO(got.error.ToString());
    REQUIRE(got.results[0] == RemoteKeyResult::kOk);
    return got.values[0];
  };

  // Half a migration: the source is MIGRATING but the target not yet IMPORTING, so the
  // source answers ASK and the target MOVED back. The store gives up after max_redirects.
  const std::string source = cluster.node_id(0), target = cluster.node_id(1);
  REQUIRE(cluster.server(0).command({"CLUSTER", "SETSLOT", "100", "MIGRATING", target}) == "OK");
  const auto looping = store->put({key}, {test_value(1, 5000)});
  REQUIRE(looping.ok());
  const RemoteCompletion gave_up = poller.wait(*looping);
  CHECK(gave_up.results[0] == RemoteKeyResult::kError);
  CHECK_THAT(gave_up.error.ToString(), Catch::Contains("still redirected after max_redirects 5"));
  CHECK(store->stats().redirects == 6);  // ASK, MOVED, ASK, MOVED, ASK, MOVED
  CHECK(store->stats().errors == 1);

  // The target IMPORTING too: the key, absent from the source, is the target's, reached
  // with ASKING.
  REQUIRE(cluster.server(1).command({"CLUSTER", "SETSLOT", "100", "IMPORTING", source}) == "OK");
  const auto put = store->put({key}, {test_value(1, 5000)});
  REQUIRE(put.ok());
  CHECK(all_results(poller.wait(*put), RemoteKeyResult::kOk));
  CHECK(store->stats().redirects == 7);
  CHECK(cluster.server(0).command({"CLUSTER", "COUNTKEYSINSLOT", "100"}) == "0");
  CHECK(cluster.server(1).command({"CLUSTER", "COUNTKEYSINSLOT", "100"}) == "1");
  CHECK(get_value() == test_value(1, 5000));
  CHECK(store->stats().redirects == 8);  // ASK does not change the map

  // The slot is the target's now: one MOVED, then the map knows.
  for (int i = 0; i < RedisCluster::kMasters; ++i) {
    REQUIRE(cluster.server(i).command({"CLUSTER", "SETSLOT", "100", "NODE", target}) == "OK");
  }
  CHECK(get_value() == test_value(1, 5000));
  CHECK(store->stats().redirects == 9);
  CHECK(get_value() == test_value(1, 5000));
  CHECK(store->stats().redirects == 9);
  CHECK(store->stats().errors == 1);
}

TEST_CASE("a cluster: a slot migration during puts and gets loses nothing", "[remote][redis]") {
  if (skip_without_redis_cli()) return;
  RedisCluster cluster;
  // redis-cli --cluster create gives the first master slots 0-5460, and reshard moves a
  // source's lowest slots first: a key in each of slots 0..kMoved-1, plus 100 elsewhere.
  constexpr int kMoved = 300;
  std::map<int, std::string> by_slot;
  for (int n = 0; std::ssize(by_slot) < kMoved; ++n) {
    const std::string key = "mig:" + std::to_string(n);
    if (redis_key_slot(key) < kMoved) by_slot.emplace(redis_key_slot(key), key);
  }
  std::vector<std::string> keys = test_keys("other", 100);
  for (const auto& [slot, key] : by_slot) keys.push_back(key);

  auto store = make_store({.url = cluster.url()});
  Poller poller(*store);
  const auto round_trip = [&](int round) {
    std::vector<std::string> values;
    for (size_t i = 0; i < keys.size(); ++i)
      values.push_back(test_value(round * 1000 + int(i), 512));
    const auto put = store->put(keys, values);
    REQUIRE(put.ok());
    const RemoteCompletion stored = poller.wait(*put);
    INFO("round " << round << ": " << stored.error.ToString());
    REQUIRE(all_results(stored, RemoteKeyResult::kOk));
    const auto get = store->get(keys);
    REQUIRE(get.ok());
    const RemoteCompletion got = poller.wait(*get);
    INFO(got.error.ToString());
    REQUIRE(all_results(got, RemoteKeyResult::kOk));
    REQUIRE(got.values == values);
  };
  round_trip(0);

  const pid_t reshard = cluster.spawn_cli(
      {"--cluster", "reshard", "127.0.0.1:" + std::to_string(cluster.server(0).port()),
       "--cluster-from", cluster.node_id(0), "--cluster-to", cluster.node_id(1), "--cluster-slots",
       std::to_string(kMoved), "--cluster-yes"});
  int rounds = 1;
  int status = 0;
  while (waitpid(reshard, &status, WNOHANG) == 0) round_trip(rounds++);
  INFO(cluster.log());
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  round_trip(rounds++);  // after: the slots' old owner answers MOVED
  WARN(rounds << " rounds of " << keys.size() << " puts and gets, " << store->stats().redirects
              << " redirects");

  // The slots did move, and the store followed.
  CHECK(cluster.server(1).command({"CLUSTER", "COUNTKEYSINSLOT", "0"}) == "1");
  const RemoteKvStats stats = store->stats();
  CHECK(stats.errors == 0);
  CHECK(stats.redirects > 0);
}

}  // namespace
}  // namespace pagedkv
