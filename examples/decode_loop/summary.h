// File: examples/decode_loop/summary.h
//
// The end-of-run report: a human-readable summary, or with --json one JSON object (built
// with nlohmann::json; the CTest tests parse it with python3's json module).
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_SUMMARY_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_SUMMARY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "disaggregation.h"
#include "mechanism.h"
#include "model.h"
#include "pagedkv/kv_event_publisher.h"
#include "pagedkv/remote_kv_store.h"
#include "pagedkv/remote_tier.h"
#include "scheduler.h"
#include "verify.h"

namespace decode_loop {

// What the KV budget holds at the split length (CachePlan::split_tokens), from the sizing
// alone (KvCacheConfig): with the model's layer groups, and with every layer treated as
// full attention in one group.
struct CapacityFigures {
  int64_t tokens = 0;             // the sequence length
  int64_t sequences = 0;          // sequences of that length the groups' pools hold
  int64_t sequences_as_full = 0;  // the same budget, every layer in one full group
  int64_t held_bytes = 0;         // KV one such sequence holds (whole blocks, every group)
  int64_t held_bytes_as_full = 0;
  int64_t min_bytes = 0;  // the analytic minimum: the tokens it attends to, no rounding
};

struct Report {
  std::string device;
  std::string model_name;  // the --model preset
  std::string workload;
  std::string kv_dtype;
  std::string preemption_policy;
  std::string fault;  // the --fault value ("none")
  ModelConfig model;
  EngineOptions engine;
  int64_t kv_budget_bytes = 0;
  int64_t bytes_per_block = 0;  // one block of every layer group
  CapacityFigures capacity;
  RunStats run;
  // --draft replay: the output digest of the run without speculation (RunStats).
  std::optional<uint64_t> rehearsal_digest;
  // Contiguous max-length reservation of the same workload, for comparison.
  int32_t contiguous_max_len = 0;           // tokens reserved per sequence
  int32_t contiguous_peak_concurrency = 0;  // sequences the same budget holds (at most all)
  double contiguous_utilization = 0.0;      // mean real tokens / reserved slots
  std::optional<VerifyResult> verify;
  // --kv-events: the publisher's counters when the summary was written (every batch sent).
  std::optional<pagedkv::KvEventPublisher::Stats> kv_events;
  // --remote: the tier's and its store's counters at the end.
  struct Remote {
    std::string store;  // the --remote value
    pagedkv::RemoteTierStats tier;
    pagedkv::RemoteKvStats store_stats;
  };
  std::optional<Remote> remote;
  // --disaggregate: the transport, the injected transfer fault and the pair's counters
  // (`run` is then DisaggregationStats::combined).
  struct Disaggregation {
    std::string transport;  // "tcp", "shm"
    std::string fault;      // the --transfer-fault value
    DisaggregationStats stats;
  };
  std::optional<Disaggregation> disaggregation;

  // The mechanisms the verified sequences went through (none without --verify).
  MechanismSet covered() const;
  // Of the mechanisms the fault breaks, those the run exercised.
  MechanismSet fault_exercised() const;
  // Whether a verified sequence went through each mechanism in fault_exercised(), and it
  // is not empty: then the verification must fail.
  bool fault_covered() const;
};

std::string format_text(const Report& report);
std::string format_json(const Report& report);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_SUMMARY_H_
