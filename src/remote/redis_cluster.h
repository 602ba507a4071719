// File: src/remote/redis_cluster.h
//
// The parts of the Redis Cluster specification a client needs, as pure functions: the key
// slot (CRC16 of the key or of its hash tag, mod 16384), the slot map read from CLUSTER
// SLOTS, and the -MOVED / -ASK redirections. RedisKvStore routes with them.
#ifndef PAGEDKV_REMOTE_REDIS_CLUSTER_H_
#define PAGEDKV_REMOTE_REDIS_CLUSTER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct redisReply;

namespace pagedkv::internal {

inline constexpr int kRedisClusterSlots = 16384;

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0, no reflection), as the
// specification's crc16.c: crc16("123456789") == 0x31C3.
uint16_t redis_crc16(absl::string_view bytes);

// The slot of `key`: CRC16 mod 16384 of the key, or of its hash tag: the bytes between
// the first '{' and the first '}' after it, when there are any ("{user1000}.following"
// hashes "user1000"; "foo{}{bar}" hashes the whole key).
int redis_key_slot(absl::string_view key);

// "HOST:PORT", the name of a cluster node as MOVED / ASK and CLUSTER SLOTS give it.
struct RedisNodeAddress {
  std::string host;
  int port = 0;
  bool operator==(const RedisNodeAddress&) const = default;
};

// A -MOVED or -ASK error reply: "MOVED 3999 127.0.0.1:6381" (the slot has a new owner:
// update the map) or "ASK 3999 127.0.0.1:6381" (this key only, during a migration: send
// ASKING, then the command, to that node, the map unchanged).
struct RedisRedirect {
  bool ask = false;
  int slot = 0;
  RedisNodeAddress node;
};

// The redirect an error reply carries, or nullopt for any other error (or a malformed
// one, which then fails its key as the error it is).
std::optional<RedisRedirect> parse_redis_redirect(absl::string_view error);

// One range of CLUSTER SLOTS: slots [first, last] served by `master`.
struct RedisSlotRange {
  int first = 0;
  int last = 0;
  RedisNodeAddress master;
};

// The master of each slot range in a CLUSTER SLOTS reply (replicas are ignored). An
// empty host (a node that does not know its own address) means `asked`'s host.
// InvalidArgument names the first malformed entry.
absl::StatusOr<std::vector<RedisSlotRange>> parse_cluster_slots(const redisReply& reply,
                                                                const std::string& asked_host);

}  // namespace pagedkv::internal

#endif  // PAGEDKV_REMOTE_REDIS_CLUSTER_H_
