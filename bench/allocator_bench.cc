// Costs of the allocator's hot paths (Google Benchmark). Targets from the allocator issue:
//   decode append  <= 50 ns per sequence-token (append_tokens + allocate_slots(1))
//   admission      <= 10 ns per prompt token, hashing included
// and, from the hardening issue, BlockPool's argument checks cost under 2% of these.
// The host tier (issue 13): its bookkeeping per demoted and per promoted block
// (BM_HostTierDemote against BM_AdmitEvicting, BM_HostTierPromote), and a decode step with
// the tier configured but idle (BM_DecodeStepHostTierIdle against BM_DecodeStepNoEvict):
// the tier must not slow the decode path. The adaptive eviction policy (issue 24):
// BM_AdmitEvictingAdaptive at most 1.3x BM_AdmitEvicting's ns per evicted block,
// BM_DecodeStepAdaptive within 5% of BM_DecodeStep.
// Run: build/bench/allocator_bench   (Release or RelWithDebInfo build)
#include <benchmark/benchmark.h>

#include <numeric>
#include <vector>

#include "pagedkv/block_hash.h"
#include "pagedkv/block_pool.h"
#include "pagedkv/kv_cache_manager.h"

namespace pagedkv {
namespace {

KvCacheManager make_manager(KvCacheManager::Options options) {
  auto m = KvCacheManager::create(std::move(options));
  if (!m.ok()) std::abort();
  return *std::move(m);
}

KvCacheManager make_manager(int32_t num_blocks) {
  return make_manager({.block_size = 16, .layer_groups = full_attention(num_blocks)});
}

// A manager with a host tier of `host_blocks` blocks.
KvCacheManager make_tiered_manager(int32_t num_blocks, int32_t host_blocks,
                                   HostAdmission admission = HostAdmission::kAll) {
  return make_manager({.block_size = 16,
                       .enable_host_cache = true,
                       .host_admission = admission,
                       .layer_groups = full_attention(num_blocks, host_blocks)});
}

// A benchmark counter of nanoseconds per `count` events over the whole run.
benchmark::Counter ns_per(int64_t count) {
  return benchmark::Counter(static_cast<double>(count),
                            benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void check(const absl::Status& status) {
  if (!status.ok()) std::abort();
}

// The engine's end of a scheduling step: it takes the step's copies (and would run them and
// the step's kernels).
void end_step(KvCacheManager& m) { benchmark::DoNotOptimize(m.take_step_ops()); }

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

// How run_decode_steps() restarts its batch and calls the manager.
struct DecodeRun {
  // reset_prefix_cache() at each restart: later steps allocate clean blocks instead of
  // evicting the cached ones.
  bool flush = false;
  // A step is the two batched calls instead of two calls per sequence.
  bool batched = false;
  // Each batch's prompts and tokens are new. Otherwise a batch repeats the previous one's
  // tokens, so every block it fills holds contents already cached (kept as a standby copy
  // of the indexed block since a4ca643; dropped uncached before).
  bool fresh_batches = false;
};

// One decode step of 256 running sequences, each appending one token and reserving its
// slot (a new block every 16 tokens, hashed and indexed when full). When the sequences
// reach 4,096 tokens they are freed and the batch restarts (untimed).
void run_decode_steps(benchmark::State& state, KvCacheManager& m, DecodeRun run) {
  constexpr int kSeqs = 256;
  constexpr int kPrompt = 64;
  constexpr int kMaxLen = 4096;
  std::vector<TokenId> prompt(kPrompt);
  int batch = 0;
  auto admit_all = [&] {
    const TokenId first = run.fresh_batches ? batch * kSeqs * kPrompt : 0;
    for (SeqId s = 0; s < kSeqs; ++s) {
      std::iota(prompt.begin(), prompt.end(), static_cast<TokenId>(first + s * kPrompt));
      check(m.add_sequence(s, prompt));
      check(m.allocate_slots(s, kPrompt).status());
    }
    end_step(m);
  };
  admit_all();
  int length = kPrompt;
  std::vector<SeqId> seqs(kSeqs);
  std::iota(seqs.begin(), seqs.end(), SeqId{0});
  std::vector<TokenId> tokens(kSeqs, 7);  // the step's token of each sequence
  const int32_t one_token[] = {1};
  for (auto _ : state) {
    if (length == kMaxLen) {  // restart the batch, untimed
      state.PauseTiming();
      for (SeqId s = 0; s < kSeqs; ++s) check(m.free(s));
      if (run.flush) m.reset_prefix_cache();
      ++batch;
      if (run.fresh_batches) std::fill(tokens.begin(), tokens.end(), 1'000'000'000 + batch);
      admit_all();
      length = kPrompt;
      state.ResumeTiming();
    }
    if (run.batched) {
      check(m.append_tokens_batch(seqs, tokens).status());
      auto slots = m.allocate_slots_batch(seqs, one_token);
      if (!slots.ok() || slots->num_failed != 0) std::abort();
      benchmark::DoNotOptimize(slots);
    } else {
      for (SeqId s = 0; s < kSeqs; ++s) {
        check(m.append_tokens(s, {&tokens[s], 1}));
        auto slots = m.allocate_slots(s, 1);
        benchmark::DoNotOptimize(slots);
      }
    }
    end_step(m);
    ++length;
  }
  state.counters["ns_per_seq_token"] = ns_per(state.iterations() * kSeqs);
}

constexpr int32_t kDecodeBlocks = 256 * 4096 / 16 + 64;

// After the first batch, each new block evicts a cached block of the previous batch.
void BM_DecodeStep(benchmark::State& state) {
  KvCacheManager m = make_manager(kDecodeBlocks);
  run_decode_steps(state, m, {});
}
BENCHMARK(BM_DecodeStep);

// The same steps when no batch repeats another's contents: each new block evicts a cached
// block of the previous batch and is indexed under a hash of its own.
void BM_DecodeStepFreshBatches(benchmark::State& state) {
  KvCacheManager m = make_manager(kDecodeBlocks);
  run_decode_steps(state, m, {.fresh_batches = true});
}
BENCHMARK(BM_DecodeStepFreshBatches);

// The same steps through append_tokens_batch() and allocate_slots_batch().
void BM_DecodeStepBatched(benchmark::State& state) {
  KvCacheManager m = make_manager(kDecodeBlocks);
  run_decode_steps(state, m, {.batched = true});
}
BENCHMARK(BM_DecodeStepBatched);

// The A/B pair for the host tier's cost on the decode path: the same steps without
// evictions, with no host tier and with one that is configured but idle (no eviction, so
// nothing is demoted, and no prefix match, so nothing is promoted).
void BM_DecodeStepNoEvict(benchmark::State& state) {
  KvCacheManager m = make_manager(kDecodeBlocks);
  run_decode_steps(state, m, {.flush = true});
}
BENCHMARK(BM_DecodeStepNoEvict);

void BM_DecodeStepHostTierIdle(benchmark::State& state) {
  KvCacheManager m = make_tiered_manager(kDecodeBlocks, /*host_blocks=*/kDecodeBlocks);
  run_decode_steps(state, m, {.flush = true});
  if (m.stats().blocks_demoted + m.stats().blocks_promoted != 0) {
    state.SkipWithError("the host tier was not idle");
  }
}
BENCHMARK(BM_DecodeStepHostTierIdle);

// Admissions of new 1,024-token prompts (64 full blocks, no prefix hit) into a device pool
// of 1,024 blocks full of the previous prompts' cached blocks: every block allocated evicts
// one. Per admission: add_sequence, match_prefix (a miss), allocate_slots (64 evictions),
// the end of the step, free (64 blocks cached).
void run_evicting_admissions(benchmark::State& state, KvCacheManager& m) {
  constexpr int kPrompt = 1024;
  constexpr int kWarmup = 32;  // fills the device pool (and the host tier, if any) first
  std::vector<TokenId> prompt(kPrompt);
  SeqId id = 0;
  auto admit_new_prompt = [&] {
    std::iota(prompt.begin(), prompt.end(), static_cast<TokenId>(id * kPrompt));
    check(m.add_sequence(id, prompt));
    benchmark::DoNotOptimize(m.match_prefix(id));
    check(m.allocate_slots(id, kPrompt).status());
    end_step(m);
    check(m.free(id));
    ++id;
  };
  while (id < kWarmup) admit_new_prompt();
  const KvCacheManager::Stats before = m.stats();
  for (auto _ : state) admit_new_prompt();
  const KvCacheManager::Stats after = m.stats();
  state.counters["ns_per_evicted_block"] = ns_per(after.evictions - before.evictions);
  if (after.evictions - before.evictions != int64_t{kPrompt / 16} * state.iterations()) {
    state.SkipWithError("expected one eviction per allocated block");
  }
  if (m.options().enable_host_cache) {
    if (after.blocks_demoted > before.blocks_demoted) {
      state.counters["ns_per_demoted_block"] = ns_per(after.blocks_demoted - before.blocks_demoted);
    }
    state.counters["host_evictions_per_admission"] =
        benchmark::Counter(static_cast<double>(after.host_evictions - before.host_evictions) /
                           static_cast<double>(state.iterations()));
    if (m.options().host_admission == HostAdmission::kAll &&
        after.blocks_demoted == before.blocks_demoted) {
      state.SkipWithError("nothing demoted");
    }
    if (m.options().host_admission == HostAdmission::kReused &&
        after.blocks_not_admitted - before.blocks_not_admitted !=
            after.evictions - before.evictions) {
      state.SkipWithError("expected every eviction dropped by the admission rule");
    }
  }
}

void BM_AdmitEvicting(benchmark::State& state) {
  KvCacheManager m = make_manager(1024);
  run_evicting_admissions(state, m);
}
BENCHMARK(BM_AdmitEvicting);

// The same under EvictionPolicy::kAdaptive: every eviction also files a ghost (and trims
// the ghost lists as blocks are cached), against BM_AdmitEvicting's plain LRU.
void BM_AdmitEvictingAdaptive(benchmark::State& state) {
  KvCacheManager m = make_manager({.block_size = 16,
                                   .eviction_policy = EvictionPolicy::kAdaptive,
                                   .layer_groups = full_attention(1024)});
  run_evicting_admissions(state, m);
}
BENCHMARK(BM_AdmitEvictingAdaptive);

// BM_DecodeStep under EvictionPolicy::kAdaptive.
void BM_DecodeStepAdaptive(benchmark::State& state) {
  KvCacheManager m = make_manager({.block_size = 16,
                                   .eviction_policy = EvictionPolicy::kAdaptive,
                                   .layer_groups = full_attention(kDecodeBlocks)});
  run_decode_steps(state, m, {});
}
BENCHMARK(BM_DecodeStepAdaptive);

// The same with a host tier of 1,024 blocks: every eviction is a demotion, and once the
// tier is full (after the warmup) every demotion evicts the tier's least recently used
// block. ns_per_demoted_block minus BM_AdmitEvicting's ns_per_evicted_block is the tier's
// bookkeeping per demoted block.
void BM_HostTierDemote(benchmark::State& state) {
  KvCacheManager m = make_tiered_manager(1024, /*host_blocks=*/1024);
  run_evicting_admissions(state, m);
}
BENCHMARK(BM_HostTierDemote);

// The same with HostAdmission::kReused: no prompt is ever hit, so the rule drops every
// evicted block (its hash joins the ghost list) instead of demoting it: the rule's cost per
// eviction, against BM_HostTierDemote's copy bookkeeping and BM_AdmitEvicting's none.
void BM_HostTierAdmitReused(benchmark::State& state) {
  KvCacheManager m = make_tiered_manager(1024, /*host_blocks=*/1024, HostAdmission::kReused);
  run_evicting_admissions(state, m);
}
BENCHMARK(BM_HostTierAdmitReused);

// Admissions of prompts whose prefix sits in the host tier: 16 prompts of 1,025 tokens
// (64 full blocks each, 1,024 blocks in all) take turns on a device pool of 256 blocks,
// so each prompt's blocks have been evicted (demoted) by the time it comes back.
// match_prefix then promotes its 64 blocks; each promotion takes a device block whose
// cached contents trade places with it (an exchange: a promotion and a demotion), as in a
// serving steady state. Per admission: add_sequence, match_prefix (64 promotions, 64
// demotions), allocate_slots(1), the end of the step, free.
void BM_HostTierPromote(benchmark::State& state) {
  constexpr int kPrompts = 16;
  constexpr int kPrompt = 1025;
  KvCacheManager m = make_tiered_manager(256, /*host_blocks=*/2048);
  std::vector<std::vector<TokenId>> prompts(kPrompts, std::vector<TokenId>(kPrompt));
  for (int p = 0; p < kPrompts; ++p) {
    std::iota(prompts[p].begin(), prompts[p].end(), static_cast<TokenId>(p * kPrompt));
  }
  SeqId id = 0;
  auto admit = [&] {
    const std::vector<TokenId>& prompt = prompts[id % kPrompts];
    check(m.add_sequence(id, prompt));
    const int32_t cached = *m.match_prefix(id);
    check(m.allocate_slots(id, kPrompt - cached).status());
    end_step(m);
    check(m.free(id));
    ++id;
  };
  while (id < 2 * kPrompts) admit();  // computes each prompt, then one round of promotions
  const KvCacheManager::Stats before = m.stats();
  for (auto _ : state) admit();
  const KvCacheManager::Stats after = m.stats();
  const int64_t promoted = after.blocks_promoted - before.blocks_promoted;
  state.counters["ns_per_promoted_block"] = ns_per(promoted);
  state.counters["promoted_per_admission"] =
      benchmark::Counter(static_cast<double>(promoted) / static_cast<double>(state.iterations()));
  state.counters["demoted_per_admission"] =
      benchmark::Counter(static_cast<double>(after.blocks_demoted - before.blocks_demoted) /
                         static_cast<double>(state.iterations()));
  if (promoted != int64_t{(kPrompt - 1) / 16} * state.iterations()) {
    state.SkipWithError("expected every prompt's 64 full blocks promoted from the host tier");
  }
}
BENCHMARK(BM_HostTierPromote);

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
