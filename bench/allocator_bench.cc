// Costs of the allocator's hot paths (Google Benchmark). Targets from the allocator issue:
//   decode append  <= 50 ns per sequence-token (append_tokens + allocate_slots(1))
//   admission      <= 10 ns per prompt token, hashing included
// and, from the hardening issue, BlockPool's argument checks cost under 2% of these.
// Run: build/bench/allocator_bench   (Release or RelWithDebInfo build)
#include <benchmark/benchmark.h>

#include <numeric>
#include <vector>

#include "pagedkv/block_hash.h"
#include "pagedkv/block_pool.h"
#include "pagedkv/kv_cache_manager.h"

namespace pagedkv {
namespace {

KvCacheManager make_manager(int32_t num_blocks) {
  auto m = KvCacheManager::create({.num_blocks = num_blocks, .block_size = 16});
  if (!m.ok()) std::abort();
  return *std::move(m);
}

void check(const absl::Status& status) {
  if (!status.ok()) std::abort();
}

// The engine's end of a scheduling step: it takes the step's copies (and would run them and
// the step's kernels).
void end_step(KvCacheManager& m) {
  benchmark::DoNotOptimize(m.take_pending_swaps());
  benchmark::DoNotOptimize(m.take_pending_copies());
}

// Admission of a 1,024-token prompt whose first 512 tokens are a cached system prompt:
// add_sequence, match_prefix (hash + verified lookup of 32 hit blocks and one miss),
// allocate_slots for the other 512 tokens (32 blocks allocated, hashed and indexed), the
// end of the step, free.
void BM_AdmitSharedPrefix(benchmark::State& state) {
  constexpr int kPrompt = 1024;
  constexpr int kShared = 512;
  KvCacheManager m = make_manager(1 << 14);
  std::vector<TokenId> prompt(kPrompt);
  std::iota(prompt.begin(), prompt.end(), 0);
  check(m.add_sequence(-1, prompt));  // warms the shared prefix
  check(m.allocate_slots(-1, kPrompt).status());
  end_step(m);
  check(m.free(-1));
  SeqId id = 0;
  for (auto _ : state) {
    prompt[kShared] = static_cast<TokenId>(1'000'000 + id);  // a new suffix every time
    check(m.add_sequence(id, prompt));
    const int32_t cached = *m.match_prefix(id);
    auto slots = m.allocate_slots(id, kPrompt - cached);
    benchmark::DoNotOptimize(slots);
    end_step(m);
    check(m.free(id));
    ++id;
  }
  if (m.stats().prefix_hit_tokens != int64_t{kShared} * id) state.SkipWithError("prefix missed");
  state.counters["ns_per_prompt_token"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kPrompt,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_AdmitSharedPrefix);

// One decode step of 256 running sequences, each appending one token and reserving its
// slot (a new block every 16 tokens, hashed and indexed when full).
void BM_DecodeStep(benchmark::State& state) {
  constexpr int kSeqs = 256;
  constexpr int kPrompt = 64;
  constexpr int kMaxLen = 4096;
  KvCacheManager m = make_manager(kSeqs * kMaxLen / 16 + 64);
  std::vector<TokenId> prompt(kPrompt);
  auto admit_all = [&] {
    for (SeqId s = 0; s < kSeqs; ++s) {
      std::iota(prompt.begin(), prompt.end(), static_cast<TokenId>(s * kPrompt));
      check(m.add_sequence(s, prompt));
      check(m.allocate_slots(s, kPrompt).status());
    }
    end_step(m);
  };
  admit_all();
  int length = kPrompt;
  const TokenId token[] = {7};
  for (auto _ : state) {
    if (length == kMaxLen) {  // restart the batch, untimed
      state.PauseTiming();
      for (SeqId s = 0; s < kSeqs; ++s) check(m.free(s));
      admit_all();
      length = kPrompt;
      state.ResumeTiming();
    }
    for (SeqId s = 0; s < kSeqs; ++s) {
      check(m.append_tokens(s, token));
      auto slots = m.allocate_slots(s, 1);
      benchmark::DoNotOptimize(slots);
    }
    end_step(m);
    ++length;
  }
  state.counters["ns_per_seq_token"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kSeqs,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_DecodeStep);

// Fork of a 100-token sequence, then one append to the child: copy-on-write of the shared
// partial last block; then the copies are taken and the child freed.
void BM_ForkCopyOnWrite(benchmark::State& state) {
  KvCacheManager m = make_manager(1024);
  std::vector<TokenId> prompt(100);
  std::iota(prompt.begin(), prompt.end(), 0);
  check(m.add_sequence(0, prompt));
  check(m.allocate_slots(0, 100).status());
  end_step(m);
  const TokenId token[] = {1};
  for (auto _ : state) {
    check(m.fork(0, 1));
    check(m.append_tokens(1, token));
    auto slots = m.allocate_slots(1, 1);
    benchmark::DoNotOptimize(slots);
    end_step(m);
    check(m.free(1));
  }
  if (m.stats().cow_copies != static_cast<int64_t>(state.iterations())) {
    state.SkipWithError("expected one copy per fork");
  }
}
BENCHMARK(BM_ForkCopyOnWrite);

// free() of 256 sequences of 1,024 tokens (64 blocks each, cached on release).
void BM_FreeSequence(benchmark::State& state) {
  constexpr int kSeqs = 256;
  constexpr int kLen = 1024;
  KvCacheManager m = make_manager(kSeqs * kLen / 16);
  std::vector<TokenId> prompt(kLen);
  SeqId next = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (int i = 0; i < kSeqs; ++i) {
      std::iota(prompt.begin(), prompt.end(), static_cast<TokenId>(next * kLen));
      check(m.add_sequence(next + i, prompt));
      check(m.allocate_slots(next + i, kLen).status());
    }
    end_step(m);
    state.ResumeTiming();
    for (int i = 0; i < kSeqs; ++i) check(m.free(next + i));
    next += kSeqs;
  }
  state.counters["ns_per_block"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kSeqs * (kLen / 16),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_FreeSequence);

// BlockPool's public entry points, each of which validates its arguments (issue 11): a
// prefix hit touches 64 free-cached blocks one by one, then the request frees them in one
// call (tail first). KvCacheManager calls unchecked versions instead; this measures what
// an engine driving the pool directly pays.
void BM_PoolTouchFree(benchmark::State& state) {
  constexpr int kBlocks = 64;
  auto created = BlockPool::create({.num_blocks = 1024, .block_size = 16});
  if (!created.ok()) std::abort();
  BlockPool& pool = *created;
  std::vector<BlockId> blocks(kBlocks);
  check(pool.allocate(blocks));
  std::vector<TokenId> tokens(16);
  BlockHash parent_hash;
  for (int i = 0; i < kBlocks; ++i) {
    std::iota(tokens.begin(), tokens.end(), i * 16);
    const BlockHash hash = hash_block(i == 0 ? nullptr : &parent_hash, tokens, {});
    auto cached = pool.cache_full_block(blocks[i], hash, i == 0 ? kNoBlock : blocks[i - 1],
                                        i == 0 ? nullptr : &parent_hash, tokens, {});
    if (!cached.ok() || !*cached) std::abort();
    parent_hash = hash;
  }
  const std::vector<BlockId> reversed(blocks.rbegin(), blocks.rend());
  check(pool.free(reversed));
  for (auto _ : state) {
    for (const BlockId b : blocks) check(pool.touch(b));
    check(pool.free(reversed));
  }
  state.counters["ns_per_block"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kBlocks,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_PoolTouchFree);

}  // namespace
}  // namespace pagedkv

BENCHMARK_MAIN();
