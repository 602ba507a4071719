// File: examples/simulator/sim_allocator.h
//
// The allocators the engine model compares, behind one small interface:
//   contiguous-max     the pre-paging baseline: each sequence reserves max_model_len
//                      contiguous slots at admission, placed first-fit (Orca "Max");
//   contiguous-oracle  the same, reserving exactly prompt + output tokens (Orca "Oracle",
//                      which needs the output length in advance: an upper bound for
//                      any reservation scheme);
//   paged              pagedkv's KvCacheManager without prefix caching;
//   paged+prefix       KvCacheManager with prefix caching, optionally with a host tier
//                      (below).
// The paged allocators are the library itself; this file only adapts its calls to the
// engine model's vocabulary. The contiguous baselines are studies of their own
// (studies/contiguous_allocator.h).
//
// Hybrid models (AllocatorSetup::hybrid): the manager gets one pool per layer group
// (KvCacheManager::Options::layer_groups), and usage() counts KV bytes.
//
// Host tier (paged+prefix, host_cache_tokens > 0): the manager's own (issue 13,
// docs/allocator.md "Host tier"). Swap space and the tier share one host pool of
// (swap + tier) blocks, swap first and the tier caching in the rest. Evicted cached device
// blocks are demoted there; match_prefix() continues from the device hits into host hits
// and promotes them (as far as free device blocks allow), so they are not prefilled.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_SIM_ALLOCATOR_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_SIM_ALLOCATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pagedkv/kv_cache_config.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_events.h"
#include "pagedkv/types.h"

namespace pagedkv::sim {

enum class AllocatorKind { kContiguousMax, kContiguousOracle, kPaged, kPagedPrefix };

struct AllocatorConfig {
  AllocatorKind kind = AllocatorKind::kPaged;
  int32_t block_size = 16;  // tokens per block (paged only)
};

// "contiguous-max", "paged+prefix/16", ...
std::string allocator_name(const AllocatorConfig& config);

// Memory held at one instant. A hybrid setup counts bytes instead of token slots: the KV
// bytes its running sequences need at least (KvCacheConfig::min_bytes_per_sequence() of
// their computed tokens) and the bytes of the blocks held in every group.
struct AllocatorUsage {
  int64_t token_slots = 0;     // slots holding a token's KV (computed tokens)
  int64_t reserved_slots = 0;  // slots set aside for running sequences
};

// What one admit() or reserve() call computes.
struct Work {
  int32_t tokens = 0;     // tokens whose slots the call reserved (to compute this step)
  int32_t remaining = 0;  // tokens of the sequence still to compute after them
};

// A hybrid model's pools (paged allocators): the layer groups KvCacheManager gets, the
// arrangement they come from (page bytes per group) and the model whose analytic need
// usage() reports. For every layer treated as full attention, `pools` is one full group.
struct HybridPools {
  std::vector<LayerGroup> groups;  // KvCacheConfig::split_budget() of `pools`
  KvCacheConfig pools;
  KvCacheConfig model;
  int64_t budget_bytes = 0;
};

struct AllocatorCounters {
  int64_t prefix_query_tokens = 0;  // tokens of admitted prefills (re-prefills included)
  int64_t prefix_hit_tokens = 0;    // of those, claimed from the prefix cache
  int64_t evictions = 0;
  int64_t preemptions_recompute = 0;
  int64_t preemptions_swap = 0;
  int64_t cow_copies = 0;
  int64_t blocks_swapped_out = 0;
  int64_t prefix_host_hit_tokens = 0;  // of prefix_hit_tokens, promoted from the host tier
  // The manager's host-tier counters (KvCacheManager::Stats). An exchange counts in both
  // blocks_promoted and blocks_demoted.
  int64_t blocks_promoted = 0;  // host tier -> device
  int64_t blocks_demoted = 0;   // device -> host tier
  int64_t host_evictions = 0;   // blocks dropped from the host tier
};

struct AllocatorSetup {
  AllocatorConfig config;
  int64_t budget_tokens = 0;       // KV slots of the device budget
  int64_t host_budget_tokens = 0;  // KV slots of host swap space (paged, swap mode)
  int64_t host_cache_tokens = 0;   // KV slots of the host tier, besides swap (paged+prefix)
  HostAdmission host_admission = HostAdmission::kAll;     // which evictions the tier takes
  EvictionPolicy eviction_policy = EvictionPolicy::kLru;  // the prefix cache's order
  int32_t max_model_len = 8192;
  double watermark_fraction = 0.01;  // paged admission leaves this share of blocks free
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
  // Paged only: layer groups with pools of their own (budget_tokens then only says that
  // the budget is not empty); no swap space or host tier.
  std::optional<HybridPools> hybrid;
  // The most tokens one admit() or reserve() computes (0: any); sizes what a windowed
  // group holds at once. run_engine() sets it from EngineOptions.
  int32_t max_chunk_tokens = 0;
  // Paged only: where the manager sends its KV events (not owned; null: nowhere). The
  // cluster model's router and shared tier follow the engines through them.
  KvEventSink* event_sink = nullptr;
};

class SimAllocator {
 public:
  virtual ~SimAllocator() = default;

  // Called for each sequence preempted as a victim of another's allocation, or itself.
  using PreemptionListener = std::function<void(SeqId, PreemptionMode)>;
  void set_preemption_listener(PreemptionListener listener) { listener_ = std::move(listener); }

  // Registers a waiting sequence that will hold at most `final_tokens` tokens, of which
  // `num_forks` children are forked right after its first prefill.
  // Errors: InvalidArgument when it can never fit (the engine rejects the request).
  [[nodiscard]] virtual absl::Status add(SeqId seq, std::span<const TokenId> prompt,
                                         int32_t final_tokens, int32_t num_forks) = 0;

  // Admits a waiting sequence: claims its cached prefix and reserves its uncomputed
  // tokens, at most `max_tokens` of them (chunked prefill: the rest in later reserve()
  // calls). Returns the tokens to compute (the prefill work; host-tier hits are promoted,
  // not computed) and those left. ResourceExhausted: not now.
  [[nodiscard]] virtual absl::StatusOr<Work> admit(SeqId seq, int32_t max_tokens) = 0;

  // Reserves a running sequence's uncomputed tokens (its last generated token, or the next
  // chunk of its prompt), at most `max_tokens`, preempting others when `may_preempt`.
  // ResourceExhausted: no room.
  [[nodiscard]] virtual absl::StatusOr<Work> reserve(SeqId seq, bool may_preempt,
                                                     int32_t max_tokens) = 0;

  // Preempts a running sequence itself (the listener is called).
  [[nodiscard]] virtual absl::Status preempt(SeqId seq) = 0;

  // Brings a swapped sequence back. ResourceExhausted: not now.
  [[nodiscard]] virtual absl::Status swap_in(SeqId seq) = 0;

  [[nodiscard]] virtual absl::Status append(SeqId seq, TokenId token) = 0;
  [[nodiscard]] virtual absl::Status fork(SeqId parent, SeqId child) = 0;
  [[nodiscard]] virtual absl::Status free(SeqId seq) = 0;

  // Hands this step's block copies (copy-on-write, swap) to the "engine", as a real
  // engine does before its kernels run; the paged allocator releases blocks that a
  // pending copy still named only then.
  virtual void run_copies() {}

  // The allocator's own invariant check (KvCacheManager::check_invariants() for paged).
  [[nodiscard]] virtual absl::Status check_invariants() const { return absl::OkStatus(); }

  // Memory held by `running` sequences (and any the allocator holds for admission).
  virtual AllocatorUsage usage(std::span<const SeqId> running) const = 0;
  virtual AllocatorCounters counters() const = 0;
  // A one-line state summary for error messages.
  virtual std::string describe() const = 0;

 protected:
  void notify_preempted(SeqId seq, PreemptionMode mode) {
    if (listener_) listener_(seq, mode);
  }

 private:
  PreemptionListener listener_;
};

// Errors: InvalidArgument for a budget that holds no block / slot, a bad block size, or
// hybrid pools with a contiguous allocator, swap space or a host tier.
[[nodiscard]] absl::StatusOr<std::unique_ptr<SimAllocator>> make_allocator(
    const AllocatorSetup& setup);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_SIM_ALLOCATOR_H_
