// Unit tests of the decode loop's two-engine run (disaggregation.h): a prefill engine
// hands every sequence to a decode engine over pagedkv::transfer on loopback, and the pair
// generates exactly what one engine does, whatever the transfers lose. The CTest runs of
// pagedkv-decode --disaggregate (check_decode.py) add the delay fault, the other presets
// and verification against the dense reference.
#include <unistd.h>
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache_plan.h"
#include "disaggregation.h"
#include "model.h"
#include "scheduler.h"
#include "workload.h"

namespace decode_loop {
namespace {

struct Setup {
  Model model;
  EngineOptions options;
  std::vector<Request> requests;
};

// The llama preset, narrower, on CPU with pools that preempt, and 16 requests sharing a
// system prompt, some with forked samples.
std::unique_ptr<Setup> small_setup() {
  ModelConfig config = llama_preset();
  config.d_model = 64;
  config.ffn_dim = 128;
  auto setup =
      std::make_unique<Setup>(Setup{.model = Model(config), .options = {}, .requests = {}});
  absl::StatusOr<CachePlan> plan = plan_cache(config, pagedkv::DType::kFloat32, 16, false);
  REQUIRE(plan.ok());
  EngineOptions& options = setup->options;
  options.cache = *std::move(plan);
  // 16 blocks of 16 tokens, and as many host blocks for swapping.
  const int64_t pool_bytes = 16 * options.cache.bytes_per_block_all_groups();
  REQUIRE(
      size_pools({.device_bytes = pool_bytes, .swap_bytes = pool_bytes}, 128, &options.cache).ok());
  options.watermark_blocks = watermark_blocks(options.cache);
  WorkloadOptions workload_options;
  workload_options.num_requests = 16;
  workload_options.system_prompt_len = 48;
  workload_options.max_new_tokens = 8;
  workload_options.vocab_size = config.vocab_size;
  absl::StatusOr<Workload> workload = make_workload(workload_options);
  REQUIRE(workload.ok());
  setup->requests = workload->requests;
  return setup;
}

RunStats one_engine(const Setup& setup) {
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::create(setup.model, setup.options);
  REQUIRE(engine.ok());
  const absl::Status status = (*engine)->run(setup.requests);
  INFO(status.ToString());
  REQUIRE(status.ok());
  return (*engine)->stats();
}

DisaggregationStats two_engines(const Setup& setup, const DisaggregationOptions& pair) {
  EngineOptions prefill_options = setup.options;
  prefill_options.hand_off = true;
  absl::StatusOr<std::unique_ptr<Engine>> prefill = Engine::create(setup.model, prefill_options);
  absl::StatusOr<std::unique_ptr<Engine>> decode = Engine::create(setup.model, setup.options);
  REQUIRE(prefill.ok());
  REQUIRE(decode.ok());
  absl::StatusOr<DisaggregationStats> stats =
      run_disaggregated(**prefill, **decode, setup.requests, pair);
  INFO(stats.status().ToString());
  REQUIRE(stats.ok());
  return *stats;
}

TEST_CASE("two engines generate what one does, whatever the transfers lose", "[decode_loop]") {
  const std::unique_ptr<Setup> setup = small_setup();
  const RunStats single = one_engine(*setup);
  REQUIRE(single.requests_completed == 16);

  const auto [transport, fault] = GENERATE(table<std::string, TransferFault>(
      {{"tcp://127.0.0.1:0", TransferFault::kNone},
       {absl::StrCat("shm://pagedkv-disaggregation-test-", getpid()), TransferFault::kNone},
       {"tcp://127.0.0.1:0", TransferFault::kDrop},
       {"tcp://127.0.0.1:0", TransferFault::kCorrupt},
       {"tcp://127.0.0.1:0", TransferFault::kPeerKilled}}));
  CAPTURE(transport, static_cast<int>(fault));
  const DisaggregationStats pair = two_engines(*setup, {.endpoint = transport, .fault = fault});
  CHECK(pair.combined.requests == 16);
  CHECK(pair.combined.requests_completed == 16);
  CHECK(pair.combined.generated_tokens == single.generated_tokens);
  CHECK(pair.combined.output_digest == single.output_digest);
  CHECK(pair.handoffs > 0);
  CHECK(pair.transfers > 0);
  if (!pair.peer_killed) {
    // Every handed-off prompt token: kept from the decode engine's cache, imported, or
    // computed again.
    CHECK(pair.served_tokens + pair.recomputed_tokens == pair.import_tokens);
  }
  switch (fault) {
    case TransferFault::kNone:
      CHECK(pair.transfers_complete == pair.transfers);
      CHECK(pair.recomputed_tokens == 0);
      CHECK(pair.imported_tokens > 0);
      break;
    case TransferFault::kDrop:
      CHECK(pair.blocks_missing > 0);
      CHECK(pair.recomputed_tokens > 0);
      break;
    case TransferFault::kCorrupt:
      CHECK(pair.blocks_corrupt > 0);
      CHECK(pair.recomputed_tokens > 0);
      break;
    case TransferFault::kDelay:
      break;
    case TransferFault::kPeerKilled:
      CHECK(pair.peer_killed);
      CHECK(pair.rerouted_sequences > 0);
      break;
  }
}

TEST_CASE("run_disaggregated needs a prefill engine that hands off", "[decode_loop]") {
  const std::unique_ptr<Setup> setup = small_setup();
  absl::StatusOr<std::unique_ptr<Engine>> a = Engine::create(setup->model, setup->options);
  absl::StatusOr<std::unique_ptr<Engine>> b = Engine::create(setup->model, setup->options);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const absl::StatusOr<DisaggregationStats> stats =
      run_disaggregated(**a, **b, setup->requests, {});
  CHECK(absl::IsInvalidArgument(stats.status()));
  CHECK_FALSE((*b)->busy());  // nothing was queued
}

}  // namespace
}  // namespace decode_loop
