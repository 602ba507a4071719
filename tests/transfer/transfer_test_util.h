// Helpers of the KV transfer tests: connected sender/receiver pairs over each transport,
// blocks of known bytes, and a bounded loop that drives both ends to their completions.
#ifndef PAGEDKV_TESTS_TRANSFER_TRANSFER_TEST_UTIL_H_
#define PAGEDKV_TESTS_TRANSFER_TRANSFER_TEST_UTIL_H_

#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "pagedkv/kv_transfer.h"
#include "pagedkv/kv_transfer_faults.h"
#include "pagedkv/kv_transport.h"

namespace pagedkv::testing {

// "tcp://127.0.0.1:0" or a fresh "shm://..." name (unique per process and call).
inline std::string listen_endpoint(const std::string& scheme) {
  static std::atomic<int> counter{0};
  if (scheme == "tcp") return "tcp://127.0.0.1:0";
  return absl::StrCat("shm://test-", ::getpid(), "-", counter++);
}

inline KvTransferOptions test_options(std::vector<int64_t> block_bytes = {64 << 10, 16 << 10}) {
  return {.namespace_digest = "0123456789abcdef0123456789abcdef",
          .block_bytes = std::move(block_bytes),
          .handshake_timeout = absl::Seconds(5)};
}

// The byte at `offset` of block (group, index) of transfer `id`: every block differs.
inline std::byte pattern_byte(KvTransferId id, int32_t group, int32_t index, size_t offset) {
  return static_cast<std::byte>((id * 131 + group * 31 + index * 7 + offset * 13 + offset / 251) &
                                0xff);
}

inline BlockHash pattern_hash(KvTransferId id, int32_t group, int32_t index) {
  return {.lo = id * 1000 + static_cast<uint64_t>(index), .hi = static_cast<uint64_t>(group) + 1};
}

// A request's blocks on both sides: the sender's bytes (in 2 parts each, as K and V) and
// the receiver's destinations (in 3 parts each, so that part borders differ).
struct TestTransfer {
  KvTransferId id = 0;
  std::vector<std::pair<int32_t, int32_t>> positions;  // (group, index), in order
  std::vector<std::vector<std::byte>> source;
  std::vector<std::vector<std::byte>> destination;

  TestTransfer(KvTransferId transfer, int32_t blocks_per_group, const KvTransferOptions& options)
      : id(transfer) {
    for (int32_t g = 0; g < std::ssize(options.block_bytes); ++g) {
      for (int32_t i = 0; i < blocks_per_group; ++i) {
        positions.push_back({g, i});
        std::vector<std::byte> bytes(static_cast<size_t>(options.block_bytes[g]));
        for (size_t o = 0; o < bytes.size(); ++o) bytes[o] = pattern_byte(id, g, i, o);
        source.push_back(std::move(bytes));
        destination.emplace_back(static_cast<size_t>(options.block_bytes[g]), std::byte{0});
      }
    }
  }

  std::vector<KvTransferBlock> blocks() const {
    std::vector<KvTransferBlock> out;
    for (size_t b = 0; b < positions.size(); ++b) {
      const ConstByteSpan bytes(source[b]);
      const size_t half = bytes.size() / 2;
      out.push_back({.group = positions[b].first,
                     .index = positions[b].second,
                     .hash = pattern_hash(id, positions[b].first, positions[b].second),
                     .parts = {bytes.first(half), bytes.subspan(half)}});
    }
    return out;
  }

  std::vector<KvTransferDestination> destinations() {
    std::vector<KvTransferDestination> out;
    for (size_t b = 0; b < positions.size(); ++b) {
      const MutableByteSpan bytes(destination[b]);
      const size_t third = bytes.size() / 3;
      out.push_back(
          {.group = positions[b].first,
           .index = positions[b].second,
           .hash = pattern_hash(id, positions[b].first, positions[b].second),
           .parts = {bytes.first(third), bytes.subspan(third, third), bytes.subspan(2 * third)}});
    }
    return out;
  }

  bool arrived(size_t block) const { return source[block] == destination[block]; }
};

// A connected pair in this process. The handshake needs both ends at once, so the sender
// connects from a thread; after that each end is used by the test's thread only.
struct TransferPair {
  std::unique_ptr<KvTransferSender> sender;
  std::unique_ptr<KvTransferReceiver> receiver;
};

inline TransferPair connect_pair(const std::string& scheme, const KvTransferOptions& options,
                                 std::vector<KvTransferFault> faults = {}) {
  auto listener = listen_kv_transport(listen_endpoint(scheme));
  REQUIRE(listener.ok());
  absl::StatusOr<std::unique_ptr<KvTransferSender>> sender;
  std::thread connector([&] {
    auto transport = connect_kv_transport((*listener)->endpoint(), absl::Seconds(5));
    if (!transport.ok()) {
      sender = transport.status();
      return;
    }
    sender = create_fault_injecting_kv_transfer_sender(*std::move(transport), options,
                                                       std::move(faults));
  });
  auto receiver = accept_kv_transfer(**listener, options);
  connector.join();
  INFO(sender.status().ToString() << " / " << receiver.status().ToString());
  REQUIRE(sender.ok());
  REQUIRE(receiver.ok());
  return {*std::move(sender), *std::move(receiver)};
}

struct Outcomes {
  std::vector<KvSendCompletion> sent;
  std::vector<KvReceiveCompletion> received;
  absl::Duration elapsed;
};

// Drives both ends until the sender has `sends` completions and the receiver `receives`,
// or `limit` passes (then the test fails: a hang).
inline Outcomes drive(TransferPair& pair, size_t sends, size_t receives,
                      absl::Duration limit = absl::Seconds(10)) {
  Outcomes out;
  const absl::Time start = absl::Now();
  while (out.sent.size() < sends || out.received.size() < receives) {
    REQUIRE(absl::Now() - start < limit);
    pair.sender->poll(&out.sent);
    pair.receiver->poll(&out.received);
    pair.receiver->wait(absl::Milliseconds(1));
  }
  out.elapsed = absl::Now() - start;
  return out;
}

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_TRANSFER_TRANSFER_TEST_UTIL_H_
