// The KV transfer between two processes on loopback (fork()): a round trip over each
// transport, the sender killed with SIGKILL mid-transfer, the receiver killed while the
// sender is blocked on it. Each side learns what happened within its deadline.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "pagedkv/kv_transfer.h"
#include "transfer/transfer_test_util.h"

namespace pagedkv::testing {
namespace {

using Fault = KvTransferFault::Kind;

// Runs `body` in a child process, which exits with its result (0: passed) and never
// returns into the test runner.
template <typename Body>
pid_t fork_child(Body body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(body());
  return pid;
}

int wait_child(pid_t pid) {
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Child: connects to `endpoint`, sends `transfer` with `faults`, and exits 0 once the
// receiver acknowledged it complete.
int run_sender(const std::string& endpoint, const KvTransferOptions& options,
               const TestTransfer& transfer, std::vector<KvTransferFault> faults) {
  auto transport = connect_kv_transport(endpoint, absl::Seconds(5));
  if (!transport.ok()) return 2;
  auto sender =
      create_fault_injecting_kv_transfer_sender(*std::move(transport), options, std::move(faults));
  if (!sender.ok() || !(*sender)->send(transfer.id, transfer.blocks(), absl::Seconds(20)).ok()) {
    return 3;
  }
  std::vector<KvSendCompletion> done;
  while (done.empty()) {
    (*sender)->wait(absl::Milliseconds(100));
    (*sender)->poll(&done);
  }
  return done[0].outcome == KvTransferOutcome::kComplete ? 0 : 4;
}

// Polls `receiver` until its first completion or `limit`.
std::vector<KvReceiveCompletion> receive(KvTransferReceiver& receiver, absl::Duration limit) {
  std::vector<KvReceiveCompletion> done;
  const absl::Time end = absl::Now() + limit;
  while (done.empty() && absl::Now() < end) {
    receiver.wait(absl::Milliseconds(10));
    receiver.poll(&done);
  }
  return done;
}

TEST_CASE("two processes move a request's blocks over each transport", "[transfer][process]") {
  const std::string scheme = GENERATE(std::string("tcp"), std::string("shm"));
  const KvTransferOptions options = test_options({256 << 10, 64 << 10});
  TestTransfer transfer(31, 24, options);
  auto listener = listen_kv_transport(listen_endpoint(scheme));
  REQUIRE(listener.ok());
  const std::string endpoint = (*listener)->endpoint();
  const pid_t child =
      fork_child([&] { return run_sender(endpoint, options, transfer, /*faults=*/{}); });

  auto receiver = accept_kv_transfer(**listener, options);
  REQUIRE(receiver.ok());
  REQUIRE((*receiver)->expect(31, transfer.destinations(), absl::Seconds(20)).ok());
  const std::vector<KvReceiveCompletion> done = receive(**receiver, absl::Seconds(20));
  REQUIRE(done.size() == 1);
  INFO(done[0].detail.ToString());
  CHECK(done[0].outcome == KvTransferOutcome::kComplete);
  for (size_t b = 0; b < transfer.positions.size(); ++b) CHECK(transfer.arrived(b));
  CHECK(wait_child(child) == 0);
}

TEST_CASE("a sender killed mid-transfer leaves its verified blocks and fails the rest at once",
          "[transfer][process]") {
  const std::string scheme = GENERATE(std::string("tcp"), std::string("shm"));
  const KvTransferOptions options = test_options({64 << 10});
  TestTransfer transfer(32, 8, options);
  auto listener = listen_kv_transport(listen_endpoint(scheme));
  REQUIRE(listener.ok());
  const std::string endpoint = (*listener)->endpoint();
  // The child sends blocks 0 to 2, then stalls before block 3 until it is killed.
  const pid_t child = fork_child([&] {
    return run_sender(
        endpoint, options, transfer,
        {{.kind = Fault::kDelay, .transfer = 32, .block = 3, .delay = absl::Seconds(60)}});
  });
  auto receiver = accept_kv_transfer(**listener, options);
  REQUIRE(receiver.ok());
  REQUIRE((*receiver)->expect(32, transfer.destinations(), absl::Seconds(30)).ok());
  CHECK(receive(**receiver, absl::Milliseconds(300)).empty());  // blocks 0-2 arrive meanwhile

  REQUIRE(::kill(child, SIGKILL) == 0);
  const absl::Time killed = absl::Now();
  const std::vector<KvReceiveCompletion> done = receive(**receiver, absl::Seconds(5));
  REQUIRE(done.size() == 1);
  CHECK(absl::Now() - killed < absl::Seconds(2));  // the connection, not the 30 s deadline
  CHECK(done[0].outcome == KvTransferOutcome::kFailed);
  CHECK(done[0].detail.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(done[0].detail.message()),
             Catch::Contains("connection lost with 3 of 8 blocks verified"));
  CHECK(done[0].verified_prefix(0) == 3);
  CHECK(done[0].count(KvBlockState::kMissing) == 5);
  for (size_t b = 0; b < 3; ++b) CHECK(transfer.arrived(b));
  CHECK(wait_child(child) == 128 + SIGKILL);
}

TEST_CASE("a receiver killed while the sender waits on it fails the sender's transfer",
          "[transfer][process]") {
  const std::string scheme = GENERATE(std::string("tcp"), std::string("shm"));
  const KvTransferOptions options = test_options({1 << 20});
  TestTransfer transfer(33, 48, options);  // 48 MiB: more than the socket or ring holds
  auto listener = listen_kv_transport(listen_endpoint(scheme));
  REQUIRE(listener.ok());
  // The child accepts, expects, and never reads again.
  const pid_t child = fork_child([&] {
    auto receiver = accept_kv_transfer(**listener, options);
    if (!receiver.ok()) return 2;
    TestTransfer destinations(33, 48, options);
    if (!(*receiver)->expect(33, destinations.destinations(), absl::Seconds(60)).ok()) return 3;
    ::pause();
    return 0;
  });
  auto transport =
      connect_kv_transport((*listener)->endpoint(), absl::Seconds(5), {.shm_ring_bytes = 1 << 20});
  REQUIRE(transport.ok());
  auto sender = create_kv_transfer_sender(*std::move(transport), options);
  REQUIRE(sender.ok());
  REQUIRE((*sender)->send(33, transfer.blocks(), absl::Seconds(30)).ok());
  std::vector<KvSendCompletion> done;
  const absl::Time stalled_until = absl::Now() + absl::Milliseconds(300);
  while (absl::Now() < stalled_until) {
    (*sender)->wait(absl::Milliseconds(10));
    (*sender)->poll(&done);
  }
  CHECK(done.empty());

  REQUIRE(::kill(child, SIGKILL) == 0);
  const absl::Time killed = absl::Now();
  while (done.empty() && absl::Now() - killed < absl::Seconds(5)) {
    (*sender)->wait(absl::Milliseconds(10));
    (*sender)->poll(&done);
  }
  REQUIRE(done.size() == 1);
  CHECK(absl::Now() - killed < absl::Seconds(2));
  CHECK(done[0].outcome == KvTransferOutcome::kFailed);
  CHECK_FALSE(done[0].acknowledged);
  CHECK(done[0].detail.code() == absl::StatusCode::kUnavailable);
  CHECK(done[0].blocks_sent < 48);
  CHECK(wait_child(child) == 128 + SIGKILL);
}

}  // namespace
}  // namespace pagedkv::testing
