// Tests of the simulator's hybrid-model study (hybrid.h): the prefix replay through the
// KvCacheManager (prefix_replay.h), the vLLM-rule model (studies/vllm_hybrid_rule.h) against
// the manager and against vLLM's measured replay, and quick runs on the shipped traces
// (simulator_test.cc tests chunked prefill and hybrid pools in the engine). Trace-based tests
// report themselves skipped when ../shared/traces is absent (PAGEDKV_TRACES_DIR overrides it).
// Nothing here is timed.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <tuple>

#include "engine.h"
#include "hybrid.h"
#include "prefix_replay.h"
#include "studies/vllm_hybrid_rule.h"
#include "support/sanitizers.h"
#include "support/skip.h"
#include "trace.h"
#ifdef PAGEDKV_HAVE_PLANNER
#include "pagedkv/hf_model_config.h"
#endif

namespace pagedkv::sim {
namespace {

std::string trace_file(const std::string& name) {
  if (pagedkv::testing::skipped_under_expensive_checks()) return "";
  const char* dir = std::getenv("PAGEDKV_TRACES_DIR");
  const std::string path =
      (dir != nullptr ? std::string(dir) : std::string(PAGEDKV_SOURCE_DIR) + "/../shared/traces") +
      "/" + name;
  if (!std::filesystem::exists(path)) {
    pagedkv::testing::report_skip("trace " + path + " not found (set PAGEDKV_TRACES_DIR)");
    return "";
  }
  return path;
}

// A Mooncake-like trace: conversations that grow by a few 512-token blocks per turn, on top
// of a few shared system prompts, with partial last blocks; deterministic.
Trace small_trace(int32_t requests, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Trace t;
  t.name = "small";
  int64_t next_id = 1000;
  std::vector<std::vector<int64_t>> conversations;
  for (int32_t r = 0; r < requests; ++r) {
    std::vector<int64_t> ids;
    if (!conversations.empty() && rng() % 3 != 0) {
      ids = conversations[rng() % conversations.size()];  // a later turn
      if (ids.size() > 4) ids.resize(1 + rng() % 4);      // or a branch off an earlier one
    } else {
      ids = {static_cast<int64_t>(rng() % 3)};  // a system prompt
      conversations.emplace_back();
    }
    const int32_t more = 1 + static_cast<int32_t>(rng() % 4);
    for (int32_t k = 0; k < more; ++k) ids.push_back(next_id++);
    if (rng() % 2 == 0) conversations[rng() % conversations.size()] = ids;
    Request req;
    req.arrival_s = r;
    req.input_length = static_cast<int32_t>(ids.size() - 1) * kMooncakeBlockTokens + 1 +
                       static_cast<int32_t>(rng() % kMooncakeBlockTokens);
    req.output_length = 4;
    req.hash_ids = ids;
    t.requests.push_back(req);
  }
  return t;
}

std::vector<LayerGroup> small_groups(int32_t window_blocks, int32_t full_blocks) {
  return {{.kind = AttentionKind::kSlidingWindow, .window = 256, .num_blocks = window_blocks},
          {.kind = AttentionKind::kFull, .num_blocks = full_blocks}};
}

std::vector<LayerGroup> full_first(std::vector<LayerGroup> groups) {
  std::swap(groups[0], groups[1]);
  return groups;
}

TEST_CASE("hybrid: the built-in models are the planner's reading of the fixtures",
          "[simulator][hybrid]") {
  const HybridModel gemma = gemma3_27b();
  CHECK(gemma.config.bytes_per_token(0) == 425984);  // 52 sliding layers of 16 x 128, bf16
  CHECK(gemma.config.bytes_per_token(1) == 81920);
  const HybridModel oss = gpt_oss_120b();
  CHECK(oss.config.bytes_per_token(0) == 36864);
  CHECK(oss.config.bytes_per_token(1) == 36864);
  CHECK(absl::IsInvalidArgument(hybrid_model("llama").status()));
  absl::StatusOr<KvCacheConfig> full = full_treatment(gemma.config);
  REQUIRE(full.ok());
  CHECK(full->num_groups() == 1);
  CHECK(full->bytes_per_token() == gemma.config.bytes_per_token());
#ifdef PAGEDKV_HAVE_PLANNER
  const std::string fixtures = std::string(PAGEDKV_SOURCE_DIR) + "/tests/planner/fixtures/";
  for (const auto& [dir, model] :
       {std::pair{"google--gemma-3-27b-it", gemma}, std::pair{"openai--gpt-oss-120b", oss}}) {
    absl::StatusOr<HfModelConfig> read =
        read_hf_config(fixtures + dir + "/excerpt.json", {.kv_dtype = DType::kBFloat16});
    REQUIRE(read.ok());
    INFO(dir);
    REQUIRE(read->kv.num_groups() == model.config.num_groups());
    for (int32_t g = 0; g < model.config.num_groups(); ++g) {
      CHECK(read->kv.groups[g].kind == model.config.groups[g].kind);
      CHECK(read->kv.groups[g].window == model.config.groups[g].window);
      CHECK(read->kv.bytes_per_token(g) == model.config.bytes_per_token(g));
    }
  }
#endif
}

// The manager's options for the small tests: checkpoints small enough for these prompts.
KvCacheManager::Options small_options(const std::vector<LayerGroup>& groups) {
  HybridStudyOptions options;
  options.checkpoint_tokens = 2048;
  options.checkpoint_levels = 3;
  return hit_study_manager_options(groups, options, 1 << 16);
}

TEST_CASE("hybrid: the manager hits alike in both group orders, at most its full hold",
          "[simulator][hybrid]") {
  // Small pools force evictions in both groups; 100-token chunks release blocks behind the
  // window mid-prompt. The manager caches the anchor's blocks first whatever the order of
  // the groups, so both orders hit the same. A third of the requests under the sanitizers.
  const Trace trace = small_trace(pagedkv::testing::kSanitized ? 100 : 300, 7);
  const Prompts prompts = trace_prompts(trace);
  for (const auto& [window_blocks, full_blocks, chunk] :
       {std::tuple{60, 600, 100}, std::tuple{150, 1500, 100}, std::tuple{300, 2000, 0}}) {
    const std::vector<LayerGroup> groups = small_groups(window_blocks, full_blocks);
    INFO("pools " << window_blocks << " + " << full_blocks << ", chunk " << chunk);
    absl::StatusOr<PrefixHits> manager = replay_prefix_hits(prompts, small_options(groups), chunk);
    REQUIRE(manager.ok());
    CHECK(manager->requests == std::ssize(trace.requests));
    CHECK(manager->hit_tokens > 0);
    CHECK(manager->hit_tokens <= manager->full_hold_tokens);
    CHECK(manager->evictions.size() == 2);
    absl::StatusOr<PrefixHits> reordered =
        replay_prefix_hits(prompts, small_options(full_first(groups)), chunk);
    REQUIRE(reordered.ok());
    CHECK(reordered->hit_tokens == manager->hit_tokens);
    CHECK(reordered->full_hold_tokens == manager->full_hold_tokens);
  }
  CHECK(absl::IsInvalidArgument(
      replay_prefix_hits(prompts, small_options(small_groups(60, 600)), -1).status()));
}

TEST_CASE("hybrid: the vLLM-rule model", "[simulator][hybrid]") {
  const Trace trace = small_trace(200, 11);
  absl::StatusOr<HitStreams> streams = hit_streams(trace, 16);
  REQUIRE(streams.ok());
  SECTION("one full group: the manager's hits (clean blocks reused first)") {
    const std::vector<LayerGroup> full = {{.kind = AttentionKind::kFull, .num_blocks = 700}};
    absl::StatusOr<PrefixHits> vllm = replay_vllm_hybrid_rule(*streams, 700, full, 0);
    absl::StatusOr<PrefixHits> paged =
        replay_prefix_hits(trace_prompts(trace), small_options(full), 0);
    REQUIRE(vllm.ok());
    REQUIRE(paged.ok());
    CHECK(vllm->hit_tokens == paged->hit_tokens);
    CHECK(vllm->hit_tokens > 0);
  }
  SECTION("a pool that holds everything cuts no hit; a window group is looked up right to left") {
    const std::vector<LayerGroup> groups = small_groups(0, 0);
    absl::StatusOr<PrefixHits> big = replay_vllm_hybrid_rule(*streams, 1 << 20, groups, 100);
    REQUIRE(big.ok());
    CHECK(big->hit_tokens == big->full_hold_tokens);
    CHECK(big->hit_tokens > 0);
    absl::StatusOr<PrefixHits> small = replay_vllm_hybrid_rule(*streams, 1500, groups, 100);
    REQUIRE(small.ok());
    CHECK(small->hit_tokens <= small->full_hold_tokens);
    CHECK(small->hit_tokens < big->hit_tokens);
  }
  CHECK(absl::IsInvalidArgument(
      replay_vllm_hybrid_rule(
          *streams, 10,
          std::vector<LayerGroup>{{.kind = AttentionKind::kSlidingWindow, .window = 64}}, 0)
          .status()));
}

TEST_CASE("hybrid: a split with chunk headroom sets a prefill chunk aside in window pools",
          "[simulator][hybrid]") {
  const HybridModel oss = gpt_oss_120b();
  const int64_t budget = int64_t{36} << 30;
  absl::StatusOr<PoolSplit> split = oss.config.split_budget(budget, 11646);
  REQUIRE(split.ok());
  CHECK(chunk_headroom_blocks(128, 8192, 16) == 512 + 8 + 1);
  absl::StatusOr<std::vector<LayerGroup>> headroom =
      split_with_chunk_headroom(oss.config, budget, 11646, 8192);
  REQUIRE(headroom.ok());
  absl::StatusOr<PoolSplit> rest =
      oss.config.split_budget(budget - 521 * oss.config.page_bytes(0), 11646);
  REQUIRE(rest.ok());
  CHECK((*headroom)[0].num_blocks == rest->groups[0].num_blocks + 521);
  CHECK((*headroom)[1].num_blocks == rest->groups[1].num_blocks);
  CHECK((*headroom)[1].num_blocks < split->groups[1].num_blocks);
}

TEST_CASE("quick hybrid study on the Mooncake trace", "[simulator][hybrid]") {
  const std::string path = trace_file("synthetic_trace.jsonl");
  if (path.empty()) return;
  absl::StatusOr<Trace> trace = read_trace(path);
  REQUIRE(trace.ok());
  truncate_trace(*trace, 400);
  HybridStudyOptions options;
  // The manager replays each prompt: one pool size under the sanitizers.
  options.fractions =
      pagedkv::testing::kSanitized ? std::vector<double>{0.25} : std::vector<double>{0.5, 0.25};
  for (const HybridModel& model : {gemma3_27b(), gpt_oss_120b()}) {
    absl::StatusOr<HybridHitStudy> study = hybrid_hit_study(*trace, model, options);
    REQUIRE(study.ok());
    CHECK(study->target_tokens == 5632);
    for (const HybridHitRow& row : study->rows) {
      INFO(model.name << " at " << row.fraction << " of the footprint");
      // Hits never exceed what the full groups hold; vLLM's model rarely cuts one.
      CHECK(row.manager.hit_tokens <= row.manager.full_hold_tokens);
      CHECK(row.vllm.of_full_hold() > 0.99);
      // The manager's windowed eviction rule keeps at least 0.9 of what the full groups
      // hold, and hits at least as much as the vLLM-rule model at the same memory.
      CHECK(row.manager.of_full_hold() >= 0.9);
      CHECK(row.manager.hit_tokens >= row.vllm.hit_tokens);
      // The split that counts the footprint never gives the full pool more than all of it
      // cached, and hits at least what the sequence-only split hits.
      CHECK(row.cache_groups.back().num_blocks <= study->cached_tokens / 16 + 5632 / 16 + 1);
      CHECK(row.cache_manager.hit_tokens >= row.manager.hit_tokens);
    }
    CHECK(format_hybrid_hit_study(*study).find("manager/vLLM") != std::string::npos);
  }
}

TEST_CASE("quick hybrid utilization on the Azure code trace", "[simulator][hybrid]") {
  const std::string path = trace_file("AzureLLMInferenceTrace_code.csv");
  if (path.empty()) return;
  absl::StatusOr<Trace> trace = read_trace(path);
  REQUIRE(trace.ok());
  truncate_trace(*trace, 400);
  clamp_to_model_len(*trace, 8192);
  scale_arrivals(*trace, 16);
  const HybridModel gemma = gemma3_27b();
  absl::StatusOr<HybridUtilRun> run =
      hybrid_util_run(*trace, gemma, 65536 * gemma.config.bytes_per_token(), 8192,
                      HybridStudyOptions{}, EngineOptions{});
  REQUIRE(run.ok());
  CHECK(run->hybrid.completed == 400);
  CHECK(run->full.completed == 400);
  // The full treatment keeps every token in every layer: a fraction of what it holds is
  // needed. The hybrid pools hold close to the need, and run more requests at once.
  CHECK(run->full.mean_utilization < 0.8);
  CHECK(run->hybrid.mean_utilization > run->full.mean_utilization);
  CHECK(run->hybrid.peak_concurrency > run->full.peak_concurrency);
  CHECK(run->hybrid.mean_concurrency > run->full.mean_concurrency);
}

TEST_CASE("vLLM-rule model: one full group hits what vLLM v1 measured on the replay",
          "[simulator][hybrid]") {
  // tests/trace_replay_test.cc: vLLM v1's manager hits 15,619,888 and 2,932,336 prompt
  // tokens on the Mooncake replay at 131,071 and 16,383 blocks of 16 tokens.
  const std::string path = trace_file("synthetic_trace.jsonl");
  if (path.empty()) return;
  absl::StatusOr<Trace> trace = read_trace(path);
  REQUIRE(trace.ok());
  absl::StatusOr<HitStreams> streams = hit_streams(*trace, 16);
  REQUIRE(streams.ok());
  CHECK(streams->num_ids == 1332108);
  // With every freed block at the queue's tail (block_pool.py's free_blocks() as it reads),
  // 15,597,792 and 2,930,448.
  std::vector<std::tuple<int32_t, int64_t, int64_t>> cases = {{16383, 2932336, 2930448}};
  if (!pagedkv::testing::kSanitized) cases.emplace_back(131071, 15619888, 15597792);
  for (const auto& [blocks, hits, tail_hits] : cases) {
    const std::vector<LayerGroup> full = {{.kind = AttentionKind::kFull, .num_blocks = blocks}};
    absl::StatusOr<PrefixHits> vllm = replay_vllm_hybrid_rule(*streams, blocks, full, 0);
    REQUIRE(vllm.ok());
    CHECK(vllm->hit_tokens == hits);
    vllm = replay_vllm_hybrid_rule(*streams, blocks, full, 0, /*clean_first=*/false);
    REQUIRE(vllm.ok());
    CHECK(vllm->hit_tokens == tail_hits);
  }
}

}  // namespace
}  // namespace pagedkv::sim
