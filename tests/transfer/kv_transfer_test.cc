// KvTransferSender and KvTransferReceiver over TCP and shared memory, in one process: round
// trips, every injected fault ending in a clear per-block and per-transfer state within
// the deadline, cancellation from either side, and refused input.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "pagedkv/kv_transfer.h"
#include "pagedkv/kv_transfer_faults.h"
#include "transfer/transfer_test_util.h"

namespace pagedkv::testing {
namespace {

using Fault = KvTransferFault::Kind;

std::string transport_scheme() { return GENERATE(std::string("tcp"), std::string("shm")); }

void check_states(const KvReceiveCompletion& done, const std::vector<KvBlockState>& expected) {
  REQUIRE(done.blocks.size() == expected.size());
  for (size_t b = 0; b < expected.size(); ++b) {
    INFO("block " << b);
    CHECK(done.blocks[b].state == expected[b]);
  }
}

TEST_CASE("many blocks of two groups arrive verified, in parts of other borders", "[transfer]") {
  const std::string scheme = transport_scheme();
  const KvTransferOptions options = test_options();
  TransferPair pair = connect_pair(scheme, options);
  TestTransfer first(7, 32, options);
  TestTransfer second(8, 5, options);
  REQUIRE(pair.receiver->expect(first.id, first.destinations(), absl::Seconds(10)).ok());
  REQUIRE(pair.receiver->expect(second.id, second.destinations(), absl::Seconds(10)).ok());
  REQUIRE(pair.sender->send(first.id, first.blocks(), absl::Seconds(10)).ok());
  REQUIRE(pair.sender->send(second.id, second.blocks(), absl::Seconds(10)).ok());
  CHECK(pair.sender->in_flight() == 2);

  const Outcomes out = drive(pair, 2, 2);
  for (const KvReceiveCompletion& done : out.received) {
    INFO(done.detail.ToString());
    CHECK(done.outcome == KvTransferOutcome::kComplete);
    CHECK(done.detail.ok());
    CHECK(done.count(KvBlockState::kVerified) == std::ssize(done.blocks));
  }
  for (const KvSendCompletion& done : out.sent) {
    CHECK(done.outcome == KvTransferOutcome::kComplete);
    CHECK(done.acknowledged);
    CHECK(done.blocks_verified == (done.id == 7 ? 64 : 10));
    CHECK(done.blocks_sent == done.blocks_verified);
  }
  for (const TestTransfer* transfer : {&first, &second}) {
    for (size_t b = 0; b < transfer->positions.size(); ++b) CHECK(transfer->arrived(b));
  }
  CHECK(out.received[0].verified_prefix(0) + out.received[0].verified_prefix(1) ==
        std::ssize(out.received[0].blocks));
  CHECK(pair.sender->in_flight() == 0);
  CHECK(pair.receiver->in_flight() == 0);
}

TEST_CASE("a dropped block is missing and ends the verified prefix", "[transfer][faults]") {
  const std::string scheme = transport_scheme();
  const KvTransferOptions options = test_options({32 << 10});
  TransferPair pair =
      connect_pair(scheme, options, {{.kind = Fault::kDrop, .transfer = 3, .block = 2}});
  TestTransfer transfer(3, 5, options);
  REQUIRE(pair.receiver->expect(3, transfer.destinations(), absl::Seconds(10)).ok());
  REQUIRE(pair.sender->send(3, transfer.blocks(), absl::Seconds(10)).ok());
  const Outcomes out = drive(pair, 1, 1);

  const KvReceiveCompletion& received = out.received[0];
  CHECK(received.outcome == KvTransferOutcome::kFailed);
  check_states(received, {KvBlockState::kVerified, KvBlockState::kVerified, KvBlockState::kMissing,
                          KvBlockState::kVerified, KvBlockState::kVerified});
  CHECK(received.verified_prefix(0) == 2);
  CHECK(received.detail.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(received.detail.message()),
             Catch::Contains("ended after 4 block frames with 4 of 5 blocks verified"));
  CHECK(out.sent[0].outcome == KvTransferOutcome::kFailed);
  CHECK(out.sent[0].acknowledged);
  CHECK(out.sent[0].blocks_verified == 4);
  CHECK(out.sent[0].blocks_sent == 4);
}

TEST_CASE("a corrupted byte fails its block's checksum only", "[transfer][faults]") {
  const std::string scheme = transport_scheme();
  const KvTransferOptions options = test_options({32 << 10});
  TransferPair pair = connect_pair(
      scheme, options,
      {{.kind = Fault::kCorruptByte, .transfer = 4, .block = 1, .byte_offset = 12345}});
  TestTransfer transfer(4, 3, options);
  REQUIRE(pair.receiver->expect(4, transfer.destinations(), absl::Seconds(10)).ok());
  REQUIRE(pair.sender->send(4, transfer.blocks(), absl::Seconds(10)).ok());
  const Outcomes out = drive(pair, 1, 1);

  check_states(out.received[0],
               {KvBlockState::kVerified, KvBlockState::kCorrupt, KvBlockState::kVerified});
  CHECK(out.received[0].verified_prefix(0) == 1);
  CHECK_THAT(std::string(out.received[0].detail.message()),
             Catch::Contains("block (group 0, index 1) failed its payload checksum"));
  // The corrupt destination differs from the source in exactly the flipped byte.
  CHECK(transfer.destination[1][12345] == ~transfer.source[1][12345]);
  transfer.destination[1][12345] = transfer.source[1][12345];
  CHECK(transfer.arrived(1));
  CHECK(out.sent[0].outcome == KvTransferOutcome::kFailed);
}

TEST_CASE("a block delayed past the deadline times the transfer out on time",
          "[transfer][faults]") {
  const std::string scheme = transport_scheme();
  const KvTransferOptions options = test_options({32 << 10});
  TransferPair pair = connect_pair(
      scheme, options,
      {{.kind = Fault::kDelay, .transfer = 5, .block = 1, .delay = absl::Seconds(30)}});
  TestTransfer transfer(5, 3, options);
  REQUIRE(pair.receiver->expect(5, transfer.destinations(), absl::Milliseconds(300)).ok());
  REQUIRE(pair.sender->send(5, transfer.blocks(), absl::Milliseconds(400)).ok());
  const Outcomes out = drive(pair, 1, 1);

  CHECK(out.elapsed < absl::Seconds(2));  // the deadline, not the 30 s delay
  const KvReceiveCompletion& received = out.received[0];
  CHECK(received.outcome == KvTransferOutcome::kTimedOut);
  CHECK(received.detail.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(received.detail.message()),
             Catch::Contains("1 of 3 blocks verified within its timeout 300ms"));
  check_states(received, {KvBlockState::kVerified, KvBlockState::kMissing, KvBlockState::kMissing});
  // The receiver's answer (timed out) reaches the sender before its own deadline.
  CHECK(out.sent[0].outcome == KvTransferOutcome::kTimedOut);
  CHECK(out.sent[0].blocks_sent == 1);
}

TEST_CASE("a connection closed mid-block fails every transfer with its verified blocks",
          "[transfer][faults]") {
  const std::string scheme = transport_scheme();
  const KvTransferOptions options = test_options({32 << 10});
  TransferPair pair = connect_pair(
      scheme, options,
      {{.kind = Fault::kCloseConnection, .transfer = 6, .block = 2, .byte_offset = 1000}});
  TestTransfer transfer(6, 4, options);
  TestTransfer behind(9, 2, options);
  REQUIRE(pair.receiver->expect(6, transfer.destinations(), absl::Seconds(10)).ok());
  REQUIRE(pair.receiver->expect(9, behind.destinations(), absl::Seconds(10)).ok());
  REQUIRE(pair.sender->send(6, transfer.blocks(), absl::Seconds(10)).ok());
  REQUIRE(pair.sender->send(9, behind.blocks(), absl::Seconds(10)).ok());
  const Outcomes out = drive(pair, 2, 2);

  CHECK(out.elapsed < absl::Seconds(2));
  for (const KvReceiveCompletion& received : out.received) {
    CHECK(received.outcome == KvTransferOutcome::kFailed);
    CHECK(received.detail.code() == absl::StatusCode::kUnavailable);
    if (received.id == 6) {
      check_states(received, {KvBlockState::kVerified, KvBlockState::kVerified,
                              KvBlockState::kMissing, KvBlockState::kMissing});
    } else {
      CHECK(received.count(KvBlockState::kMissing) == 2);
    }
  }
  for (const KvSendCompletion& sent : out.sent) {
    CHECK(sent.outcome == KvTransferOutcome::kFailed);
    CHECK_FALSE(sent.acknowledged);
    CHECK_THAT(std::string(sent.detail.message()), Catch::Contains("injected fault"));
  }
  const absl::Status after = pair.sender->send(10, behind.blocks(), absl::Seconds(1));
  CHECK(after.code() == absl::StatusCode::kUnavailable);
  CHECK(pair.receiver->expect(10, behind.destinations(), absl::Seconds(1)).code() ==
        absl::StatusCode::kUnavailable);
}

TEST_CASE("a sender's cancel mid-transfer ends both sides as cancelled", "[transfer][cancel]") {
  const std::string scheme = transport_scheme();
  const KvTransferOptions options = test_options({32 << 10});
  TransferPair pair = connect_pair(
      scheme, options,
      {{.kind = Fault::kDelay, .transfer = 11, .block = 2, .delay = absl::Seconds(30)}});
  TestTransfer transfer(11, 4, options);
  REQUIRE(pair.receiver->expect(11, transfer.destinations(), absl::Seconds(10)).ok());
  REQUIRE(pair.sender->send(11, transfer.blocks(), absl::Seconds(10)).ok());
  std::vector<KvSendCompletion> sent;
  pair.sender->poll(&sent);  // blocks 0 and 1 leave; block 2 waits for its delay
  REQUIRE(pair.sender->cancel(11).ok());
  CHECK(pair.sender->in_flight() == 0);
  const Outcomes out = drive(pair, 1, 1);

  CHECK(out.sent[0].outcome == KvTransferOutcome::kCancelled);
  CHECK(out.sent[0].detail.code() == absl::StatusCode::kCancelled);
  CHECK(out.received[0].outcome == KvTransferOutcome::kCancelled);
  CHECK_THAT(std::string(out.received[0].detail.message()),
             Catch::Contains("cancelled by the sender"));
  check_states(out.received[0], {KvBlockState::kVerified, KvBlockState::kVerified,
                                 KvBlockState::kMissing, KvBlockState::kMissing});
  CHECK(pair.sender->cancel(11).code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a receiver's cancel stops the sender with the receiver's answer", "[transfer][cancel]") {
  const std::string scheme = transport_scheme();
  const KvTransferOptions options = test_options({32 << 10});
  TransferPair pair = connect_pair(
      scheme, options,
      {{.kind = Fault::kDelay, .transfer = 12, .block = 1, .delay = absl::Seconds(30)}});
  TestTransfer transfer(12, 3, options);
  REQUIRE(pair.receiver->expect(12, transfer.destinations(), absl::Seconds(10)).ok());
  REQUIRE(pair.sender->send(12, transfer.blocks(), absl::Seconds(10)).ok());
  REQUIRE(pair.receiver->cancel(12).ok());
  const Outcomes out = drive(pair, 1, 1);

  CHECK(out.received[0].outcome == KvTransferOutcome::kCancelled);
  CHECK(out.sent[0].outcome == KvTransferOutcome::kCancelled);
  CHECK(out.sent[0].acknowledged);
  CHECK_THAT(std::string(out.sent[0].detail.message()),
             Catch::Contains("cancelled by the receiver"));
  CHECK(pair.receiver->cancel(12).code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a block under another hash is the wrong block and is not written",
          "[transfer][faults]") {
  const KvTransferOptions options = test_options({32 << 10});
  TransferPair pair = connect_pair("tcp", options);
  TestTransfer transfer(13, 2, options);
  std::vector<KvTransferBlock> blocks = transfer.blocks();
  blocks[1].hash.lo ^= 1;
  REQUIRE(pair.receiver->expect(13, transfer.destinations(), absl::Seconds(10)).ok());
  REQUIRE(pair.sender->send(13, std::move(blocks), absl::Seconds(10)).ok());
  const Outcomes out = drive(pair, 1, 1);

  check_states(out.received[0], {KvBlockState::kVerified, KvBlockState::kWrongBlock});
  CHECK_THAT(std::string(out.received[0].detail.message()),
             Catch::Contains("block (group 0, index 1) arrived as 32768 bytes of hash"));
  CHECK(transfer.destination[1] == std::vector<std::byte>(32 << 10, std::byte{0}));
}

TEST_CASE("a transfer the receiver does not expect fails at the sender", "[transfer]") {
  const KvTransferOptions options = test_options({32 << 10});
  TransferPair pair = connect_pair("shm", options);
  TestTransfer transfer(14, 2, options);
  REQUIRE(pair.sender->send(14, transfer.blocks(), absl::Seconds(10)).ok());
  const Outcomes out = drive(pair, 1, 0);
  CHECK(out.sent[0].outcome == KvTransferOutcome::kFailed);
  CHECK(out.sent[0].acknowledged);
  CHECK_THAT(std::string(out.sent[0].detail.message()),
             Catch::Contains("the receiver does not expect transfer 14"));
  // The connection still works afterwards.
  TestTransfer next(15, 1, options);
  REQUIRE(pair.receiver->expect(15, next.destinations(), absl::Seconds(10)).ok());
  REQUIRE(pair.sender->send(15, next.blocks(), absl::Seconds(10)).ok());
  CHECK(drive(pair, 1, 1).received[0].outcome == KvTransferOutcome::kComplete);
}

TEST_CASE("refused calls name the value and the limit and change nothing", "[transfer]") {
  const KvTransferOptions options = test_options({32 << 10, 1024});
  TransferPair pair = connect_pair("tcp", options);
  TestTransfer transfer(20, 2, options);
  auto send = [&](std::vector<KvTransferBlock> blocks, absl::Duration timeout) {
    return pair.sender->send(20, std::move(blocks), timeout);
  };
  auto message = [](const absl::Status& status) { return std::string(status.message()); };

  absl::Status status = send(transfer.blocks(), absl::ZeroDuration());
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(message(status) == "send(transfer 20): timeout 0 is not > 0");
  status = send(transfer.blocks(), absl::Milliseconds(-5));
  CHECK(message(status) == "send(transfer 20): timeout -5ms is not > 0");
  status = send({}, absl::Seconds(1));
  CHECK(message(status) == "send(transfer 20): 0 blocks; a transfer has 1 to 65536");

  std::vector<KvTransferBlock> blocks = transfer.blocks();
  blocks[1].parts.pop_back();
  status = send(blocks, absl::Seconds(1));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(message(status) ==
        "send(transfer 20): block 1 (group 0, index 1) has 16384 bytes; group 0's blocks hold "
        "32768");
  blocks = transfer.blocks();
  blocks[0].group = 2;
  CHECK(message(send(blocks, absl::Seconds(1))) ==
        "send(transfer 20): block 0 (group 2, index 0): group outside [0, 2)");
  blocks = transfer.blocks();
  blocks[1].index = 0;
  CHECK(message(send(blocks, absl::Seconds(1))) ==
        "send(transfer 20): block 1 (group 0, index 0): named twice");
  blocks[1].index = -1;
  CHECK(message(send(blocks, absl::Seconds(1))) ==
        "send(transfer 20): block 1 (group 0, index -1): index < 0");
  CHECK(pair.sender->in_flight() == 0);

  std::vector<KvTransferDestination> destinations = transfer.destinations();
  destinations[3].parts[0] = destinations[3].parts[0].first(1);
  status = pair.receiver->expect(20, destinations, absl::Seconds(1));
  CHECK(message(status) ==
        "expect(transfer 20): block 3 (group 1, index 1) has 684 bytes; group 1's blocks hold "
        "1024");
  CHECK(pair.receiver->expect(20, transfer.destinations(), absl::ZeroDuration()).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(pair.receiver->in_flight() == 0);

  REQUIRE(pair.receiver->expect(20, transfer.destinations(), absl::Seconds(10)).ok());
  status = pair.receiver->expect(20, transfer.destinations(), absl::Seconds(10));
  CHECK(status.code() == absl::StatusCode::kAlreadyExists);
  CHECK(message(status) == "expect(transfer 20): transfer 20 is in flight");
  CHECK(pair.receiver->cancel(21).code() == absl::StatusCode::kNotFound);
  CHECK(message(pair.sender->cancel(21)) == "cancel(transfer 21): not in flight (0 transfers are)");
  REQUIRE(pair.sender->send(20, transfer.blocks(), absl::Seconds(10)).ok());
  CHECK(drive(pair, 1, 1).received[0].outcome == KvTransferOutcome::kComplete);
}

TEST_CASE("the handshake refuses another namespace or other block sizes, naming both",
          "[transfer]") {
  auto listener = listen_kv_transport(listen_endpoint("tcp"));
  REQUIRE(listener.ok());
  KvTransferOptions theirs = test_options({4096});
  theirs.namespace_digest = "other-model";
  absl::StatusOr<std::unique_ptr<KvTransferSender>> sender;
  std::thread connector([&] { sender = connect_kv_transfer((*listener)->endpoint(), theirs); });
  auto receiver = accept_kv_transfer(**listener, test_options({4096, 512}));
  connector.join();
  const std::string expected =
      "the sender has namespace 'other-model', block bytes [4096]; the receiver has namespace "
      "'0123456789abcdef0123456789abcdef', block bytes [4096, 512]";
  CHECK(receiver.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(receiver.status().message()) == expected);
  CHECK(sender.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(sender.status().message()), Catch::Contains(expected));
}

TEST_CASE("invalid options and endpoints are refused before any connection", "[transfer]") {
  KvTransferOptions options = test_options();
  options.block_bytes = {};
  CHECK(std::string(connect_kv_transfer("tcp://127.0.0.1:1", options).status().message()) ==
        "block_bytes is empty; it needs one size per layer group");
  options = test_options({0});
  CHECK(std::string(connect_kv_transfer("tcp://127.0.0.1:1", options).status().message()) ==
        "block_bytes[0] = 0 is outside [1, 1073741824]");
  CHECK(std::string(listen_kv_transport("udp://x:1").status().message()) ==
        "endpoint 'udp://x:1' is not of the form tcp://HOST:PORT or shm://NAME");
  CHECK(std::string(
            connect_kv_transport("tcp://127.0.0.1:1", absl::ZeroDuration()).status().message()) ==
        "connect to tcp://127.0.0.1:1: timeout 0 is not > 0");
  CHECK(std::string(connect_kv_transport("shm://x", absl::Seconds(1), {.shm_ring_bytes = 1000})
                        .status()
                        .message()) ==
        "shm_ring_bytes 1000 is not a power of two in [65536, 1073741824]");
  auto listener = listen_kv_transport(listen_endpoint("tcp"));
  REQUIRE(listener.ok());
  const absl::Status accepted = (*listener)->accept(absl::Milliseconds(50)).status();
  CHECK(accepted.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(accepted.message()), Catch::Contains("no peer connected within 50ms"));
}

}  // namespace
}  // namespace pagedkv::testing
