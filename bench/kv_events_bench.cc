// KvEventPublisher benchmarks (docs/events.md has the figures):
//   BM_SchedulerHandOff  scheduler-thread cost per event: on_event() for each event of a
//                        step plus end_step(), with the publisher thread running. Target
//                        <= 50 ns per event. queue_drops (steps dropped at
//                        max_queued_events) should be 0: the loop lets the publisher
//                        thread catch up, untimed.
//   BM_LoopbackStream    events per second delivered to a subscriber on tcp loopback that
//                        decodes every batch (msgpack-c) and checks the sequence numbers;
//                        the producer is paced at the given rate for 2 s. Target
//                        >= 1,000,000 events/s with no drop and no gap.
// Events are half BlockStored (one 16-token block) and half BlockRemoved (one hash), the
// mix of a busy engine; they are built before timing, as the pool builds them anyway.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <msgpack.hpp>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "events/cache_mirror.h"
#include "events/staged_batch.h"
#include "events/wire_format.h"
#include "pagedkv/kv_event_publisher.h"

namespace pagedkv {
namespace {

std::vector<KvEvent> make_step(int events) {
  std::vector<KvEvent> step;
  for (int i = 0; i < events; ++i) {
    const BlockHash hash{static_cast<uint64_t>(i) * 7919, 42};
    if (i % 2 == 0) {
      BlockStored s;
      s.block_hashes = {hash};
      s.parent_hash = BlockHash{1, 2};
      s.token_ids.assign(16, 1234);
      s.block_size = 16;
      step.emplace_back(std::move(s));
    } else {
      step.emplace_back(BlockRemoved{{hash}});
    }
  }
  return step;
}

void BM_SchedulerHandOff(benchmark::State& state) {
  const auto events_per_step = static_cast<int>(state.range(0));
  auto publisher = KvEventPublisher::create({.endpoint = "tcp://127.0.0.1:*"});
  if (!publisher.ok()) {
    state.SkipWithError(publisher.status().ToString().c_str());
    return;
  }
  KvEventPublisher& p = **publisher;
  const std::vector<KvEvent> step = make_step(events_per_step);
  // The producer outruns the publisher thread: every `drain_every` steps, wait (untimed)
  // until it has caught up. 32 steps stay within the 64 recycled staging buffers, the
  // regime of an engine whose publisher keeps up; 4096 steps measure a publisher that lags
  // far behind (fresh staging buffers are allocated then).
  const int64_t drain_every = state.range(1);
  int64_t steps = 0;
  for (auto _ : state) {
    for (const KvEvent& e : step) p.on_event(e);
    p.end_step();
    if (++steps % drain_every == 0) {
      state.PauseTiming();
      for (KvEventPublisher::Stats s = p.stats();
           s.steps_published + s.steps_dropped_hwm + s.steps_dropped_queue < s.next_seq;
           s = p.stats()) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      state.ResumeTiming();
    }
  }
  const int64_t events = state.iterations() * events_per_step;
  state.SetItemsProcessed(events);
  state.counters["ns_per_event"] = benchmark::Counter(
      static_cast<double>(events), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["queue_drops"] = static_cast<double>(p.stats().steps_dropped_queue);
}
// ns_per_event is per CPU second of the scheduler thread (the benchmark's CPU column):
// on a loaded machine the wall time also counts the time the thread waits for a core.
BENCHMARK(BM_SchedulerHandOff)
    ->ArgNames({"events_per_step", "drain_every"})
    ->Args({8, 32})
    ->Args({64, 32})
    ->Args({512, 32})
    ->Args({8, 4096})
    ->Args({64, 4096})
    ->Args({512, 4096});

// Publisher-thread work per event, split: msgpack encoding, and the snapshot mirror.
void BM_PublisherEncode(benchmark::State& state) {
  internal::StagedBatch batch;
  for (const KvEvent& e : make_step(64)) batch.add(e);
  std::string payload;
  for (auto _ : state) {
    internal::encode_batch(batch, {}, &payload);
    benchmark::DoNotOptimize(payload.data());
  }
  state.SetItemsProcessed(state.iterations() * 64);
  state.counters["bytes_per_event"] = static_cast<double>(payload.size()) / 64;
}
BENCHMARK(BM_PublisherEncode);

void BM_MirrorApply(benchmark::State& state) {
  internal::StagedBatch batch;
  // Stores then removes the same hashes: the mirror stays small, every event does work.
  for (const KvEvent& e : make_step(64)) {
    if (const auto* s = std::get_if<BlockStored>(&e)) {
      batch.add(e);
      batch.add(BlockRemoved{s->block_hashes});
    }
  }
  internal::CacheMirror mirror;
  for (auto _ : state) mirror.apply(batch);
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(batch.events.size()));
}
BENCHMARK(BM_MirrorApply);

// Counts the events of every batch a SUB socket receives; records gaps in the seqs.
struct Subscriber {
  explicit Subscriber(const std::string& endpoint) : socket(context, zmq::socket_type::sub) {
    socket.set(zmq::sockopt::subscribe, "");
    socket.set(zmq::sockopt::rcvhwm, 0);
    socket.connect(endpoint);
    thread = std::thread([this] { run(); });
  }
  ~Subscriber() {
    stop = true;
    thread.join();
  }
  void run() {
    std::vector<zmq::message_t> frames;
    while (!stop) {
      zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(10)) == 0) continue;
      frames.clear();
      if (!zmq::recv_multipart(socket, std::back_inserter(frames))) continue;
      int64_t seq = 0;
      for (size_t i = 0; i < 8; ++i) {
        seq = (seq << 8) | static_cast<const unsigned char*>(frames[1].data())[i];
      }
      if (seq != next_seq) gaps.fetch_add(1);
      next_seq = seq + 1;
      const msgpack::object_handle batch =
          msgpack::unpack(static_cast<const char*>(frames[2].data()), frames[2].size());
      events.fetch_add(batch.get().via.array.ptr[1].via.array.size);
    }
  }
  zmq::context_t context;
  zmq::socket_t socket;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> events{0};
  std::atomic<int64_t> gaps{0};
  int64_t next_seq = 0;
};

void BM_LoopbackStream(benchmark::State& state) {
  const double rate = static_cast<double>(state.range(0));  // events per second
  constexpr int kEventsPerStep = 64;
  constexpr double kSeconds = 2.0;
  // With a replay endpoint: the publisher thread also keeps the replay buffer and the
  // snapshot state, as in production.
  auto publisher = KvEventPublisher::create(
      {.endpoint = "tcp://127.0.0.1:*", .replay_endpoint = "tcp://127.0.0.1:*"});
  if (!publisher.ok()) {
    state.SkipWithError(publisher.status().ToString().c_str());
    return;
  }
  KvEventPublisher& p = **publisher;
  const std::vector<KvEvent> step = make_step(kEventsPerStep);
  for (auto _ : state) {
    Subscriber subscriber(p.endpoint());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let SUB connect
    const int64_t steps = static_cast<int64_t>(rate * kSeconds / kEventsPerStep);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) {
      for (const KvEvent& e : step) p.on_event(e);
      p.end_step();
      // Pace: sleep while ahead of the target rate.
      const auto due = start + std::chrono::duration<double>((i + 1) * kEventsPerStep / rate);
      if (due > std::chrono::steady_clock::now() + std::chrono::microseconds(200)) {
        std::this_thread::sleep_until(due);
      }
    }
    const int64_t sent = steps * kEventsPerStep;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (subscriber.events < sent && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    state.counters["events_per_s"] = static_cast<double>(subscriber.events) / seconds;
    state.counters["delivered"] = static_cast<double>(subscriber.events);
    state.counters["sent"] = static_cast<double>(sent);
    state.counters["gaps"] = static_cast<double>(subscriber.gaps);
  }
  const KvEventPublisher::Stats s = p.stats();
  state.counters["drops"] = static_cast<double>(s.steps_dropped_hwm + s.steps_dropped_queue);
}
BENCHMARK(BM_LoopbackStream)
    ->Arg(1'000'000)
    ->Arg(1'500'000)
    ->Arg(2'000'000)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pagedkv

BENCHMARK_MAIN();
