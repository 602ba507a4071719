// File: pagedkv/redis_kv_store.h
//
// A RemoteKvStore on one Redis server or a Redis Cluster (pagedkv::remote, hiredis). Its
// I/O thread holds one connection per server and sends each batch pipelined: SET, GET or
// EXISTS per key, appended in chunks of at most pipeline_bytes and then their replies
// read. A value is copied once each way: sent from the put's string, read into the get's.
// Connect and command timeouts bound every wait; after a failure (server down, killed,
// stalled past the command timeout) the connection is dropped, the rest of the batch
// completes as errors, and the next batch reconnects, no sooner than an exponential
// backoff allows: batches in between complete at once as errors. A reply error for one
// key (OOM, NOAUTH, WRONGTYPE) fails that key only. docs/remote.md describes the fault
// behaviour.
//
// Redis Cluster: the URL names any node; the first batch asks it INFO cluster and, when
// cluster_enabled is 1, reads the slot map (CLUSTER SLOTS). Each key then goes to the
// master of its slot (CRC16 of the key or its {hash tag}, mod 16384), every master's keys
// of a chunk pipelined on a connection of their own, opened when first needed. A -MOVED
// reply updates the map (read again in full at most once per batch) and a -ASK reply
// (a slot being migrated) sends ASKING and the command to the named node; a key still
// redirected after max_redirects completes as kError. RemoteKvStats::redirects counts them.
//
// Not in this version: TLS (Debian 12's hiredis 0.14 has no hiredis_ssl), reads from
// replicas.
//
// Example (in a function returning a Status):
//   auto store = create_redis_kv_store({.url = "redis://10.0.0.5:6379/2",
//                                       .password_env = "PAGEDKV_REDIS_PASSWORD"});
//   if (!store.ok()) return store.status();
//   auto id = (*store)->exists({"pagedkv:llama-8b-tp0:00ff"});
//   if (!id.ok()) return id.status();
#ifndef PAGEDKV_REDIS_KV_STORE_H_
#define PAGEDKV_REDIS_KV_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pagedkv/remote_kv_store.h"

namespace pagedkv {

struct RedisKvStoreOptions {
  // "redis://HOST:PORT[/DB]", HOST a name or an IPv4/IPv6 address ("[::1]"); DB defaults
  // to 0 (a cluster has only 0). For a cluster, any node: the others are learned from it.
  // A password in the URL is refused: it would end up in logs and process lists.
  std::string url = "redis://127.0.0.1:6379";
  // AUTH, when one of these is set (not both): the name of an environment variable, or
  // the path of a file whose first line is the password. Read once, at creation; never
  // logged or put in a Status.
  std::string password_env = "";
  std::string password_file = "";
  std::string username = "";  // Redis 6 ACL user for AUTH; empty: the default user
  int32_t connect_timeout_ms = 500;
  int32_t command_timeout_ms = 2000;      // a reply slower than this drops the connection
  int32_t reconnect_backoff_min_ms = 50;  // first wait after a failed connect, doubled
  int32_t reconnect_backoff_max_ms = 5000;
  int64_t pipeline_bytes = 16 << 20;  // value bytes appended before replies are read
  int32_t max_redirects = 5;          // cluster: MOVED / ASK followed per key, then kError
  RemoteKvLimits limits{};
};

// create_redis_kv_store()
//
// Checks the options, reads the password and starts the I/O thread; it does not connect:
// the first batch does, so a server that is down at creation is no error.
// Errors: InvalidArgument for a malformed URL, a password in it, both or an unreadable
// password source (the message names the variable or file, never its content), or a
// non-positive timeout or limit.
[[nodiscard]] absl::StatusOr<std::unique_ptr<RemoteKvStore>> create_redis_kv_store(
    const RedisKvStoreOptions& options);

}  // namespace pagedkv

#endif  // PAGEDKV_REDIS_KV_STORE_H_
