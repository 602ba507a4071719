// CPU paged decode attention vs the same attention over a contiguous cache.
//
// "Paged": block_size 16 (or the size given), blocks a random permutation of a pool 2x the
// needed size. "Contiguous": one block per sequence holding its whole context, an identity
// table: the same kernel with no paging. Both pools are KvStorage CPU pools. The bar: paged
// <= 1.15x contiguous. Also times write_kv and extend (prefill) attention. Single-threaded, like
// the kernels.
//
// Run: build/bench/attention_cpu_bench --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "pagedkv/attention.h"
#include "pagedkv/kv_storage.h"
#include "pagedkv/numeric.h"

namespace pagedkv {
namespace {

constexpr int32_t kHeadDim = 128;
constexpr int32_t kNumQHeads = 32;
constexpr int32_t kNumKvHeads = 8;

template <typename T>
struct Setup {
  int32_t num_blocks = 0, block_size = 0, max_blocks = 0;
  std::optional<KvStorage> storage;  // one layer; huge-page backed like any CPU pool
  std::vector<T> q, out;
  std::vector<int32_t> table, lens;
  KvCacheView view() const { return storage->view(0); }
  BlockTableView tables() const {
    return {table.data(), lens.data(), static_cast<int32_t>(lens.size()), max_blocks, block_size};
  }
};

// `paged`: blocks of `block_size` from a shuffled pool 2x the needed size; otherwise one
// block of `context` tokens per sequence. Both pools come from KvStorage.
template <typename T>
Setup<T> make_setup(int32_t batch, int32_t context, int32_t block_size, bool paged) {
  Setup<T> s;
  s.block_size = paged ? block_size : context;
  s.max_blocks = num_blocks_for_tokens(context, s.block_size);
  const int32_t needed = batch * s.max_blocks;
  s.num_blocks = paged ? 2 * needed : needed;
  const KvCacheSpec spec{.num_layers = 1,
                         .num_kv_heads = kNumKvHeads,
                         .head_dim = kHeadDim,
                         .dtype = DTypeOf<T>::value,
                         .block_size = s.block_size};
  absl::StatusOr<KvStorage> storage =
      KvStorage::create(spec, s.num_blocks, {.device = Device::kCpu});
  if (!storage.ok()) std::abort();
  s.storage.emplace(std::move(*storage));
  std::vector<int32_t> ids(s.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(1);
  if (paged) std::shuffle(ids.begin(), ids.end(), rng);
  s.table.assign(ids.begin(), ids.begin() + needed);
  s.lens.assign(batch, context);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const KvCacheView view = s.view();
  T* k = static_cast<T*>(view.k);
  T* v = static_cast<T*>(view.v);
  for (int64_t i = 0; i < pool_elements(view); ++i) {
    k[i] = from_float<T>(uni(rng));
    v[i] = from_float<T>(uni(rng));
  }
  s.q.resize(int64_t{batch} * kNumQHeads * kHeadDim);
  for (T& x : s.q) x = from_float<T>(uni(rng));
  s.out.resize(s.q.size());
  return s;
}

// Args: batch, context, block_size, paged (1) or contiguous (0).
template <typename T>
void BM_DecodeCpu(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  const int32_t context = static_cast<int32_t>(state.range(1));
  Setup<T> s =
      make_setup<T>(batch, context, static_cast<int32_t>(state.range(2)), state.range(3) != 0);
  const DecodeArgs args{
      .q = s.q.data(), .out = s.out.data(), .dtype = DTypeOf<T>::value, .num_q_heads = kNumQHeads};
  const KvCacheView view = s.view();
  const BlockTableView tables = s.tables();
  for (auto _ : state) {
    const absl::Status status = paged_decode_attention(Device::kCpu, view, tables, args);
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    benchmark::DoNotOptimize(s.out.data());
    benchmark::ClobberMemory();
  }
  const int64_t kv_bytes = int64_t{2} * batch * context * kNumKvHeads * kHeadDim * sizeof(T);
  state.SetBytesProcessed(state.iterations() * kv_bytes);
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(batch) * context * state.iterations(), benchmark::Counter::kIsRate);
}

void decode_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "context", "block_size", "paged"});
  for (int64_t context : {512, 4096}) {
    for (int64_t block_size : {16}) {
      for (int64_t paged : {0, 1}) b->Args({4, context, block_size, paged});
    }
  }
  for (int64_t block_size : {8, 32}) b->Args({4, 4096, block_size, 1});
  b->Unit(benchmark::kMicrosecond);
}
BENCHMARK_TEMPLATE(BM_DecodeCpu, float)->Apply(decode_args);
BENCHMARK_TEMPLATE(BM_DecodeCpu, BFloat16)->Apply(decode_args);

// Prefill of `new` tokens on top of a `context - new` prefix, one sequence, bf16.
void BM_ExtendCpu(benchmark::State& state) {
  const int32_t context = static_cast<int32_t>(state.range(0));
  const int32_t num_new = static_cast<int32_t>(state.range(1));
  Setup<BFloat16> s = make_setup<BFloat16>(1, context, 16, true);
  s.q.resize(int64_t{num_new} * kNumQHeads * kHeadDim, from_float<BFloat16>(0.5f));
  s.out.resize(s.q.size());
  const std::vector<int32_t> indptr = {0, num_new};
  const ExtendArgs args{.q = s.q.data(),
                        .out = s.out.data(),
                        .dtype = DType::kBFloat16,
                        .num_q_heads = kNumQHeads,
                        .qo_indptr = indptr.data()};
  for (auto _ : state) {
    const absl::Status status = paged_extend_attention(Device::kCpu, s.view(), s.tables(), args);
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    benchmark::DoNotOptimize(s.out.data());
  }
  state.counters["new tokens/s"] = benchmark::Counter(
      static_cast<double>(num_new) * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ExtendCpu)->Args({512, 512})->Args({2048, 64})->Unit(benchmark::kMillisecond);

// write_kv of `n` tokens (fp32 source) into a bf16 cache at scattered slots.
void BM_WriteKvCpu(benchmark::State& state) {
  const int32_t n = static_cast<int32_t>(state.range(0));
  Setup<BFloat16> s = make_setup<BFloat16>(1, 4096, 16, true);
  std::vector<float> k(int64_t{n} * kNumKvHeads * kHeadDim, 0.25f), v(k);
  std::vector<int64_t> slots(n);
  for (int32_t i = 0; i < n; ++i) slots[i] = (int64_t{i} * 7919) % (int64_t{s.num_blocks} * 16);
  const WriteKvArgs args{.k = k.data(),
                         .v = v.data(),
                         .src_dtype = DType::kFloat32,
                         .slot_mapping = slots.data(),
                         .num_tokens = n};
  for (auto _ : state) {
    const absl::Status status = write_kv(Device::kCpu, s.view(), args);
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * int64_t{n} * kNumKvHeads * kHeadDim * 2 * 6);
}
BENCHMARK(BM_WriteKvCpu)->Arg(256)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagedkv

BENCHMARK_MAIN();
