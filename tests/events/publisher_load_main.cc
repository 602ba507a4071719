// A live publisher for check_replay_abuse.py: every millisecond one step that stores a
// block (and removes the one stored 1000 steps before, so the snapshot state stays at
// 1000 blocks), on tcp://127.0.0.1 (free ports; the PUB and ROUTER endpoints printed on
// the first line). Stops when stdin closes or after MAX_SECONDS, then prints its peak
// RSS ("peak_rss_kb N") and its stats.
// usage: pagedkv-publisher-load MAX_SECONDS
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "pagedkv/kv_event_publisher.h"

namespace {

constexpr int32_t kBlockSize = 16;
constexpr int64_t kLiveBlocks = 1000;

pagedkv::BlockHash hash_of(int64_t step) {
  return {static_cast<uint64_t>(step) * 0x9e3779b97f4a7c15ULL, static_cast<uint64_t>(step)};
}

int64_t peak_rss_kb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: pagedkv-publisher-load MAX_SECONDS\n";
    return 2;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(std::atoi(argv[1]));
  auto publisher = pagedkv::KvEventPublisher::create(
      {.endpoint = "tcp://127.0.0.1:*", .replay_endpoint = "tcp://127.0.0.1:*"});
  if (!publisher.ok()) {
    std::cerr << publisher.status() << "\n";
    return 1;
  }
  std::cout << (*publisher)->endpoint() << " " << (*publisher)->replay_endpoint() << std::endl;
  std::atomic<bool> stdin_closed{false};
  std::thread watcher([&] {
    for (std::string line; std::getline(std::cin, line);) {
    }
    stdin_closed = true;
  });
  std::vector<pagedkv::TokenId> tokens(kBlockSize);
  auto next_step = std::chrono::steady_clock::now();
  for (int64_t step = 0; !stdin_closed && std::chrono::steady_clock::now() < deadline; ++step) {
    for (int32_t i = 0; i < kBlockSize; ++i) tokens[i] = static_cast<int32_t>(step + i);
    pagedkv::BlockStored stored;
    stored.block_hashes = {hash_of(step)};
    stored.token_ids = tokens;
    stored.block_size = kBlockSize;
    (*publisher)->on_event(stored);
    if (step >= kLiveBlocks) {
      pagedkv::BlockRemoved removed;
      removed.block_hashes = {hash_of(step - kLiveBlocks)};
      (*publisher)->on_event(removed);
    }
    (*publisher)->end_step();
    next_step += std::chrono::milliseconds(1);
    std::this_thread::sleep_until(next_step);
  }
  const pagedkv::KvEventPublisher::Stats s = (*publisher)->stats();
  std::cout << "peak_rss_kb " << peak_rss_kb() << "\nsteps_published " << s.steps_published
            << "\nsteps_dropped " << s.steps_dropped_hwm + s.steps_dropped_queue
            << "\nreplay_requests " << s.replay_requests << "\nsnapshot_requests "
            << s.snapshot_requests << "\nrequests_refused " << s.requests_refused
            << "\nstalled_peers_dropped " << s.stalled_peers_dropped << std::endl;
  publisher->reset();
  if (!stdin_closed) std::cout << "stopped by MAX_SECONDS" << std::endl;
  watcher.detach();  // blocked reading stdin; the process exits
  return 0;
}
