// Loopback throughput of the KV transfer (pagedkv::transfer) beside a plain memcpy of the
// same bytes (Google Benchmark). Each iteration moves one batch of 32 MiB of blocks from a
// sender to a receiver, end to end: the receiver posts its destinations, the sender sends,
// every block is checksummed on both sides (XXH3-64) and the receiver's acknowledgement
// reaches the sender. The sender runs on a thread of its own, as an engine would run each
// side in its own process; the two share nothing but the transport.
//   BM_Memcpy/<block bytes>          memcpy of the batch, block by block: the bound
//   BM_Transfer/<transport>/<block bytes>   the transfer; its counters give the memcpy
//                                    bound measured in the same run (memcpy_GBps) and
//                                    GBps / memcpy_GBps (ratio)
// Run: build/bench/kv_transfer_bench   (Release build; docs/transfer.md has figures)
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "pagedkv/kv_transfer.h"
#include "pagedkv/kv_transport.h"

namespace pagedkv {
namespace {

constexpr int64_t kBatchBytes = 32 << 20;

struct Batch {
  explicit Batch(int64_t block_bytes)
      : blocks(kBatchBytes / block_bytes),
        source(static_cast<size_t>(kBatchBytes)),
        destination(static_cast<size_t>(kBatchBytes)) {
    for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 7 + i / 4093);
    std::memset(destination.data(), 0, destination.size());  // fault the pages in
    this->block_bytes = block_bytes;
  }
  ConstByteSpan source_block(int64_t b) const {
    return ConstByteSpan(source).subspan(b * block_bytes, block_bytes);
  }
  MutableByteSpan destination_block(int64_t b) {
    return MutableByteSpan(destination).subspan(b * block_bytes, block_bytes);
  }

  int64_t blocks;
  int64_t block_bytes = 0;
  std::vector<std::byte> source;
  std::vector<std::byte> destination;
};

void copy_batch(Batch& batch) {
  for (int64_t b = 0; b < batch.blocks; ++b) {
    std::memcpy(batch.destination_block(b).data(), batch.source_block(b).data(), batch.block_bytes);
  }
  benchmark::DoNotOptimize(batch.destination.data());
  benchmark::ClobberMemory();
}

void BM_Memcpy(benchmark::State& state) {
  Batch batch(state.range(0));
  for (auto _ : state) copy_batch(batch);
  state.SetBytesProcessed(state.iterations() * kBatchBytes);
}

// GB/s of copy_batch() over a few rounds, for the transfer's ratio.
double memcpy_gbps(Batch& batch) {
  copy_batch(batch);
  constexpr int kRounds = 8;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kRounds; ++i) copy_batch(batch);
  return kRounds * kBatchBytes / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
}

// The sender's thread: sends round r's batch once the receiver has asked for it (`asked`
// > r), drives it to its completion, and counts it in `done`.
void run_sender(KvTransferSender& sender, const Batch& batch, const std::atomic<int64_t>& asked,
                std::atomic<int64_t>& done, const std::atomic<bool>& stop, std::atomic<bool>& ok) {
  for (int64_t round = 0; !stop.load();) {
    if (asked.load(std::memory_order_acquire) <= round) {
      std::this_thread::yield();
      continue;
    }
    std::vector<KvTransferBlock> blocks;
    for (int64_t b = 0; b < batch.blocks; ++b) {
      blocks.push_back(
          {.group = 0, .index = static_cast<int32_t>(b), .parts = {batch.source_block(b)}});
    }
    if (!sender.send(static_cast<KvTransferId>(round), std::move(blocks), absl::Seconds(60)).ok()) {
      ok = false;
      return;
    }
    std::vector<KvSendCompletion> completions;
    while (completions.empty()) {
      sender.wait(absl::Milliseconds(10));
      sender.poll(&completions);
    }
    if (completions[0].outcome != KvTransferOutcome::kComplete) ok = false;
    done.store(++round, std::memory_order_release);
  }
}

void BM_Transfer(benchmark::State& state, const std::string& scheme) {
  Batch batch(state.range(0));
  const double bound = memcpy_gbps(batch);
  const KvTransferOptions options{.block_bytes = {batch.block_bytes},
                                  .max_blocks_per_transfer = 1 << 20};
  const std::string endpoint =
      scheme == "tcp" ? "tcp://127.0.0.1:0" : absl::StrCat("shm://bench-", ::getpid());
  auto listener = listen_kv_transport(endpoint);
  if (!listener.ok()) return state.SkipWithError(listener.status().ToString().c_str());
  absl::StatusOr<std::unique_ptr<KvTransferSender>> sender;
  std::thread connector([&] { sender = connect_kv_transfer((*listener)->endpoint(), options); });
  auto receiver = accept_kv_transfer(**listener, options);
  connector.join();
  if (!sender.ok() || !receiver.ok()) return state.SkipWithError("handshake failed");

  std::atomic<int64_t> asked{0}, done{0};
  std::atomic<bool> stop{false}, ok{true};
  std::thread sending([&] { run_sender(**sender, batch, asked, done, stop, ok); });
  int64_t round = 0;
  const absl::Time start = absl::Now();
  for (auto _ : state) {
    std::vector<KvTransferDestination> destinations;
    for (int64_t b = 0; b < batch.blocks; ++b) {
      destinations.push_back(
          {.group = 0, .index = static_cast<int32_t>(b), .parts = {batch.destination_block(b)}});
    }
    if (!(*receiver)
             ->expect(static_cast<KvTransferId>(round), std::move(destinations), absl::Seconds(60))
             .ok()) {
      ok = false;
      break;
    }
    asked.store(++round, std::memory_order_release);
    std::vector<KvReceiveCompletion> completions;
    // The round ends when the sender has the acknowledgement too.
    while (completions.empty() || done.load(std::memory_order_acquire) < round) {
      (*receiver)->wait(absl::Milliseconds(1));
      (*receiver)->poll(&completions);
    }
    if (completions[0].outcome != KvTransferOutcome::kComplete) ok = false;
  }
  stop = true;
  sending.join();
  if (!ok) return state.SkipWithError("a transfer did not complete");
  if (batch.source != batch.destination) return state.SkipWithError("bytes differ");
  state.SetBytesProcessed(state.iterations() * kBatchBytes);
  state.counters["memcpy_GBps"] = bound;
  const double gbps =
      static_cast<double>(round * kBatchBytes) / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
  state.counters["GBps"] = gbps;
  state.counters["ratio"] = gbps / bound;
}

void block_sizes(benchmark::internal::Benchmark* bench) {
  for (int64_t bytes : {64 << 10, 256 << 10, 1 << 20, 2 << 20}) bench->Arg(bytes);
  bench->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
}

BENCHMARK(BM_Memcpy)->Apply(block_sizes);
BENCHMARK_CAPTURE(BM_Transfer, tcp, std::string("tcp"))->Apply(block_sizes);
BENCHMARK_CAPTURE(BM_Transfer, shm, std::string("shm"))->Apply(block_sizes);

}  // namespace
}  // namespace pagedkv

BENCHMARK_MAIN();
