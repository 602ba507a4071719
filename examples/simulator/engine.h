// File: examples/simulator/engine.h
//
// A simple serving-engine model that replays a trace against one allocator, in the
// iteration-level style of Orca and vLLM:
//   - Requests arrive at their trace time and wait in FIFO order.
//   - Each step: every running sequence reserves a slot for its last generated token
//     (preempting the latest-arrived running sequences when blocks run out: recompute or
//     swap); then swapped sequences come back if they fit; then, if nothing was preempted
//     and nothing is swapped, waiting requests are admitted in order while their prompt
//     fits (paged: leaving the watermark free; contiguous: a first-fit reservation), up to
//     max_num_seqs running sequences and max_prefill_tokens prompt tokens per step.
//   - Chunked prefill (chunked_prefill, as vLLM schedules): a step computes at most
//     max_prefill_tokens prompt tokens in all; a prompt that does not fit the rest of the
//     step's budget is admitted with a chunk of it and continues in later steps (before
//     new admissions), generating its first token in the step that computes its last
//     chunk. A sequence whose prefill waits for budget holds its blocks.
//   - A step takes step_ms plus prefill_ms_per_1k_tokens per 1,000 prompt tokens
//     computed, plus the time to promote the step's host-tier hits (the KV bytes of the
//     blocks the allocator promoted, over host_link_bytes_per_s; demotions are taken to
//     overlap them on the link's other direction), then every scheduled sequence
//     generates one token. A request completes after output_length tokens (all of its
//     samples / beams).
//   - Parallel samples fork after the prompt's prefill; beam requests keep beam_width
//     beams and every beam_interval tokens drop their last beam and fork their first.
//   - Cluster mode (cluster.h): a caller that owns the clock across engines hands each
//     engine the requests routed to it (EngineModel). With a shared tier, an admission
//     reads the prompt's full blocks that follow the manager's device and host hits from
//     the tier while it holds them: those tokens are not prefilled, and the step pays
//     their KV bytes over shared_tier_bytes_per_s instead.
// It measures KV utilization, concurrency, throughput, preemptions, prefix hits,
// evictions and the wall time spent inside allocator calls (in the CLI only).
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_ENGINE_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared_tier.h"
#include "sim_allocator.h"
#include "trace.h"

namespace pagedkv::sim {

struct EngineOptions {
  int32_t max_num_seqs = 512;            // running sequences at most
  int32_t max_prefill_tokens = 16384;    // prompt tokens per step (one prompt always fits)
  double step_ms = 20;                   // decode step time
  double prefill_ms_per_1k_tokens = 50;  // added per 1,000 prompt tokens computed
  int64_t kv_bytes_per_token = 131072;   // KV of one token (Llama-3.1-8B in bf16)
  double host_link_bytes_per_s = 55e9;   // host tier promotions (PCIe 5.0 x16)
  int32_t beam_interval = 8;             // beam requests re-fork every this many tokens
  int32_t series_points = 400;           // samples of the over-time series
  bool measure_allocator_time = false;   // time allocator calls (wall clock)
  bool check_invariants = false;         // check the allocator's invariants every step (tests)
  bool chunked_prefill = false;          // prompts in chunks of the step's prefill budget
  // Cluster mode: the prefix store the engines share (not owned; null: none) and its
  // bandwidth to one engine.
  SharedTier* shared_tier = nullptr;
  double shared_tier_bytes_per_s = 25e9;
  // Called every ~progress_every steps with (steps, completed, total requests).
  std::function<void(int64_t, int64_t, int64_t)> progress;
  int64_t progress_every = 20000;
};

struct SeriesPoint {
  double time_s = 0;
  double utilization = 0;   // token slots / reserved slots, at that step
  int32_t concurrency = 0;  // requests with a running sequence
};

struct EngineResult {
  std::string allocator;
  int64_t requests = 0;
  int64_t completed = 0;
  int64_t rejected = 0;  // could never fit the budget
  int64_t steps = 0;
  double sim_time_s = 0;  // last completion time
  // Hybrid pools (AllocatorSetup::hybrid) count bytes: the running sequences' analytic
  // need for token slots, the bytes of blocks in use for reserved slots, the budget bytes.
  double mean_utilization = 0;   // step-time weighted mean of token / reserved slots
  double mean_memory_use = 0;    // step-time weighted mean of token slots / budget
  double mean_reserved = 0;      // step-time weighted mean of reserved slots / budget
  int32_t peak_concurrency = 0;  // requests with a running sequence
  double mean_concurrency = 0;   // step-time weighted, over steps with work
  double throughput_rps = 0;     // completed / sim_time_s
  double mean_latency_s = 0;     // arrival to completion
  int64_t preemptions = 0;       // recompute + swap
  int64_t preemptions_swap = 0;
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;         // device and host tier hits
  int64_t prefix_host_hit_tokens = 0;    // of those, promoted from the host tier
  int64_t prefix_shared_hit_tokens = 0;  // besides those: read from the shared tier
  int64_t blocks_promoted = 0;
  int64_t blocks_demoted = 0;
  int64_t host_evictions = 0;     // blocks dropped from the host tier
  double promote_time_s = 0;      // step time spent promoting
  double shared_read_time_s = 0;  // step time spent reading the shared tier
  int64_t evictions = 0;
  int64_t cow_copies = 0;
  int64_t generated_tokens = 0;
  double allocator_ns_per_step = 0;  // 0 unless measure_allocator_time
  std::vector<SeriesPoint> series;
  double prefix_hit_rate() const {
    return prefix_query_tokens == 0 ? 0.0
                                    : static_cast<double>(prefix_hit_tokens) / prefix_query_tokens;
  }
};

// Where a request stands in one engine, as a router that balances load follows it.
enum class RequestPhase : uint8_t {
  kNotHere,   // not submitted to this engine
  kQueued,    // submitted; its prompt is not computed yet
  kDecoding,  // its prompt is computed (first token on)
  kDone,      // completed or rejected
};

// One engine of the model, stepped by a caller that owns the clock across engines: it
// submits each request in arrival order when its arrival time comes, and runs every engine
// up to that time first. run_engine() submits every request and drains.
class EngineModel {
 public:
  // `trace` must outlive the engine. Errors: as run_engine().
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<EngineModel>> create(
      const Trace& trace, const AllocatorSetup& setup, const EngineOptions& options);
  ~EngineModel();

  // Hands trace request `request` to this engine: it arrives at its trace time, or now if
  // the engine's clock has passed it. Requests come in arrival order.
  void submit(int32_t request);

  // Runs steps while the engine has work and its clock is before `until_s`; an idle
  // engine stops there. A step that starts before `until_s` may end after it.
  // Errors: Internal as run_engine().
  [[nodiscard]] absl::Status run_until(double until_s);

  // Runs until every submitted request finished and returns the engine's results.
  // Errors: Internal as run_engine().
  [[nodiscard]] absl::StatusOr<EngineResult> drain();

  RequestPhase phase(int32_t request) const;

 private:
  class Impl;
  explicit EngineModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Replays `trace` on a fresh allocator made from `setup`. Every request must satisfy
// input_length + output_length <= setup.max_model_len (see clamp_to_model_len()).
// Errors: InvalidArgument for a bad trace or setup; Internal when the allocator breaks
// the engine's expectations (with the step and sequence).
[[nodiscard]] absl::StatusOr<EngineResult> run_engine(const Trace& trace,
                                                      const AllocatorSetup& setup,
                                                      const EngineOptions& options);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_ENGINE_H_
