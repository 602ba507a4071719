#include "remote/redis_cluster.h"

#include <hiredis/hiredis.h>

#include <array>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pagedkv::internal {
namespace {

constexpr std::array<uint16_t, 256> make_crc16_table() {
  std::array<uint16_t, 256> table{};
  for (int byte = 0; byte < 256; ++byte) {
    uint16_t crc = static_cast<uint16_t>(byte << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = static_cast<uint16_t>((crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    table[byte] = crc;
  }
  return table;
}

constexpr std::array<uint16_t, 256> kCrc16Table = make_crc16_table();

// "HOST:PORT" with the port after the last ':' (an IPv6 host keeps its own colons).
std::optional<RedisNodeAddress> parse_node(absl::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return std::nullopt;
  RedisNodeAddress node{.host = std::string(text.substr(0, colon))};
  if (!absl::SimpleAtoi(text.substr(colon + 1), &node.port) || node.port <= 0 ||
      node.port > 65535) {
    return std::nullopt;
  }
  return node;
}

}  // namespace

uint16_t redis_crc16(absl::string_view bytes) {
  uint16_t crc = 0;
  for (const char c : bytes) {
    crc = static_cast<uint16_t>((crc << 8) ^ kCrc16Table[((crc >> 8) ^ static_cast<uint8_t>(c))]);
  }
  return crc;
}

int redis_key_slot(absl::string_view key) {
  const size_t open = key.find('{');
  if (open != absl::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != absl::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return redis_crc16(key) & (kRedisClusterSlots - 1);
}

std::optional<RedisRedirect> parse_redis_redirect(absl::string_view error) {
  RedisRedirect redirect;
  if (absl::StartsWith(error, "MOVED ")) {
    error.remove_prefix(6);
  } else if (absl::StartsWith(error, "ASK ")) {
    redirect.ask = true;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const size_t space = error.find(' ');
  if (space == absl::string_view::npos ||
      !absl::SimpleAtoi(error.substr(0, space), &redirect.slot) || redirect.slot < 0 ||
      redirect.slot >= kRedisClusterSlots) {
    return std::nullopt;
  }
  std::optional<RedisNodeAddress> node = parse_node(error.substr(space + 1));
  if (!node) return std::nullopt;
  redirect.node = *std::move(node);
  return redirect;
}

absl::StatusOr<std::vector<RedisSlotRange>> parse_cluster_slots(const redisReply& reply,
                                                                const std::string& asked_host) {
  if (reply.type != REDIS_REPLY_ARRAY) {
    return absl::InvalidArgumentError(
        absl::StrCat("CLUSTER SLOTS: reply type ", reply.type, ", not an array"));
  }
  std::vector<RedisSlotRange> ranges;
  for (size_t i = 0; i < reply.elements; ++i) {
    const redisReply& entry = *reply.element[i];
    // [first, last, [host, port, id, ...], replicas ...]
    const bool well_formed = entry.type == REDIS_REPLY_ARRAY && entry.elements >= 3 &&
                             entry.element[0]->type == REDIS_REPLY_INTEGER &&
                             entry.element[1]->type == REDIS_REPLY_INTEGER &&
                             entry.element[2]->type == REDIS_REPLY_ARRAY &&
                             entry.element[2]->elements >= 2 &&
                             entry.element[2]->element[0]->type == REDIS_REPLY_STRING &&
                             entry.element[2]->element[1]->type == REDIS_REPLY_INTEGER;
    const auto first = well_formed ? entry.element[0]->integer : -1;
    const auto last = well_formed ? entry.element[1]->integer : -1;
    const auto port = well_formed ? entry.element[2]->element[1]->integer : 0;
    if (!well_formed || first < 0 || last < first || last >= kRedisClusterSlots || port <= 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("CLUSTER SLOTS: entry ", i, " of ", reply.elements, " is malformed"));
    }
    const redisReply& host = *entry.element[2]->element[0];
    ranges.push_back(
        {.first = static_cast<int>(first),
         .last = static_cast<int>(last),
         .master = {.host = host.len == 0 ? asked_host : std::string(host.str, host.len),
                    .port = static_cast<int>(port)}});
  }
  return ranges;
}

}  // namespace pagedkv::internal
