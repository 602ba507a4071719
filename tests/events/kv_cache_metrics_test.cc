// Tests of KvCacheMetrics: names, labels and values in the exposition text.
#include "pagedkv/kv_cache_metrics.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace pagedkv {
namespace {

TEST_CASE("metrics follow the manager's stats under vLLM's names, counters never go back") {
  auto metrics = KvCacheMetrics::create({.model_name = "m"});
  REQUIRE(metrics.ok());
  KvCacheManager::Stats s;
  s.num_blocks = 200;
  s.used_blocks = 50;
  s.prefix_query_tokens = 1000;
  s.prefix_hit_tokens = 250;
  s.preemptions_recompute = 3;
  s.evictions = 7;
  s.cached_host_blocks = 12;
  s.host_hit_tokens = 96;
  s.blocks_demoted = 20;
  s.blocks_promoted = 6;
  s.host_evictions = 4;
  s.blocks_not_admitted = 31;
  s.ghost_hits = 9;
  s.recent_ghost_hits = 13;
  s.frequent_ghost_hits = 14;
  (*metrics)->update(s);
  s.prefix_query_tokens = 900;  // a smaller total (a new manager): the counter stays
  (*metrics)->update(s);
  KvEventPublisher::Stats e;
  e.events_published = 42;
  e.events_dropped_hwm = 2;
  e.requests_refused = 5;
  (*metrics)->update(e);
  const std::string text = (*metrics)->text();
  INFO(text);
  REQUIRE_THAT(text, Catch::Contains("# TYPE pagedkv:kv_cache_usage_perc gauge"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:kv_cache_usage_perc{model_name=\"m\"} 0.25"));
  REQUIRE_THAT(text, Catch::Contains("# TYPE pagedkv:prefix_cache_queries_total counter"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:prefix_cache_queries_total{model_name=\"m\"} 1000"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:prefix_cache_hits_total{model_name=\"m\"} 250"));
  REQUIRE_THAT(text, Catch::Contains(
                         "pagedkv:num_preemptions_total{mode=\"recompute\",model_name=\"m\"} 3"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:num_evictions_total{model_name=\"m\"} 7"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:kv_cache_cached_host_blocks{model_name=\"m\"} 12"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:prefix_cache_host_hits_total{model_name=\"m\"} 96"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:num_blocks_demoted_total{model_name=\"m\"} 20"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:num_blocks_promoted_total{model_name=\"m\"} 6"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:num_host_evictions_total{model_name=\"m\"} 4"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:num_blocks_not_admitted_total{model_name=\"m\"} 31"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:num_ghost_hits_total{model_name=\"m\"} 9"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:num_eviction_ghost_hits_total{list=\"recent\","
                                     "model_name=\"m\"} 13"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:num_eviction_ghost_hits_total{list=\"frequent\","
                                     "model_name=\"m\"} 14"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:kv_events_published_total{model_name=\"m\"} 42"));
  REQUIRE_THAT(
      text, Catch::Contains(
                "pagedkv:kv_events_dropped_total{model_name=\"m\",reason=\"subscriber_hwm\"} 2"));
  REQUIRE_THAT(text,
               Catch::Contains("pagedkv:kv_events_requests_refused_total{model_name=\"m\"} 5"));
}

// The sample line of `name` with `labels` (after model_name) in the exposition text.
std::string sample(const std::string& name, const std::string& labels, const std::string& value) {
  return "pagedkv:" + name + "{" + labels + ",model_name=\"m\"} " + value + "\n";
}

TEST_CASE("per layer group: usage, cached blocks, hits, window releases and partial hit tokens") {
  // A full group and a sliding window of 4 tokens, 2-token blocks, 10 blocks each.
  auto manager = KvCacheManager::create(
      {.block_size = 2,
       .enable_partial_block_reuse = true,
       .layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 10},
                        {.kind = AttentionKind::kSlidingWindow, .window = 4, .num_blocks = 10}}});
  REQUIRE(manager.ok());
  KvCacheManager& m = *manager;
  // Sequence 1: 8 tokens (4 blocks in each group, all cached), then a decode step: the
  // window group releases blocks 0 and 1 (the token at 8 attends to 5..8); then freed.
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  REQUIRE(m.add_sequence(1, prompt).ok());
  REQUIRE(*m.match_prefix(1) == 0);
  REQUIRE(m.allocate_slots(1, 8).ok());
  (void)m.take_step_ops();
  const TokenId next = 9;
  REQUIRE(m.append_tokens(1, {&next, 1}).ok());
  REQUIRE(m.allocate_slots(1, 1).ok());
  (void)m.take_step_ops();
  REQUIRE(m.free(1).ok());
  // Sequence 2 continues blocks 0..2 and the first token of block 3: a hit of 3 blocks
  // (the window group needs blocks 1 and 2 for the token at 6) and 1 partial token (block 3
  // copied in each group).
  const std::vector<TokenId> second = {1, 2, 3, 4, 5, 6, 7, 99, 100};
  REQUIRE(m.add_sequence(2, second).ok());
  REQUIRE(*m.match_prefix(2) == 7);
  (void)m.take_step_ops();
  REQUIRE(m.check_invariants().ok());

  const KvCacheManager::GroupStats full = *m.group_stats(0), window = *m.group_stats(1);
  REQUIRE(full.used_blocks == 4);         // blocks 0..2 and the partial copy
  REQUIRE(full.cached_free_blocks == 1);  // block 3, the copy's source
  REQUIRE(full.hit_blocks == 3);
  REQUIRE(full.released_blocks == 0);
  REQUIRE(window.used_blocks == 3);         // blocks 1, 2 and the copy
  REQUIRE(window.cached_free_blocks == 2);  // 0 (released) and 3
  REQUIRE(window.hit_blocks == 2);
  REQUIRE(window.released_blocks == 2);
  REQUIRE(m.stats().partial_hit_tokens == 1);

  auto metrics = KvCacheMetrics::create({.model_name = "m"});
  REQUIRE(metrics.ok());
  (*metrics)->update(m);
  const std::string text = (*metrics)->text();
  INFO(text);
  const std::string g0 = "group=\"0\",kind=\"full_attention\"";
  const std::string g1 = "group=\"1\",kind=\"sliding_window\"";
  REQUIRE_THAT(text, Catch::Contains("# TYPE pagedkv:kv_cache_group_usage_perc gauge"));
  REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_usage_perc", g0, "0.4")));
  REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_usage_perc", g1, "0.3")));
  REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_num_blocks", g1, "10")));
  REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_used_blocks", g0, "4")));
  REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_cached_free_blocks", g0, "1")));
  REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_cached_free_blocks", g1, "2")));
  REQUIRE_THAT(text, Catch::Contains("# TYPE pagedkv:kv_cache_group_hit_blocks_total counter"));
  REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_hit_blocks_total", g0, "3")));
  REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_hit_blocks_total", g1, "2")));
  REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_released_blocks_total", g0, "0")));
  REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_released_blocks_total", g1, "2")));
  REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_evictions_total", g1, "0")));
  // The manager-wide figures are group 0's pool and all hits, as stats() has them.
  REQUIRE_THAT(text, Catch::Contains("pagedkv:kv_cache_usage_perc{model_name=\"m\"} 0.4"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:prefix_cache_queries_total{model_name=\"m\"} 17"));
  REQUIRE_THAT(text, Catch::Contains("pagedkv:prefix_cache_hits_total{model_name=\"m\"} 7"));
  REQUIRE_THAT(text,
               Catch::Contains("pagedkv:prefix_cache_partial_hits_total{model_name=\"m\"} 1"));
}

TEST_CASE("per-group host-tier and eviction counters follow group_stats(), never going back") {
  auto manager = KvCacheManager::create(
      {.block_size = 2,
       .enable_host_cache = true,
       .layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 8, .num_host_blocks = 8},
                        {.kind = AttentionKind::kChunkedLocal,
                         .window = 4,
                         .num_blocks = 8,
                         .num_host_blocks = 8}}});
  REQUIRE(manager.ok());
  KvCacheManager& m = *manager;
  auto metrics = KvCacheMetrics::create({.model_name = "m"});
  REQUIRE(metrics.ok());
  // Prompts of 8 distinct tokens evict each other's blocks (demoted to the host tier); the
  // first prompt again is promoted back.
  for (SeqId s = 0; s < 4; ++s) {
    std::vector<TokenId> prompt;
    for (int i = 0; i < 8; ++i) prompt.push_back(static_cast<TokenId>((s % 3) * 100 + i + 1));
    REQUIRE(m.add_sequence(s, prompt).ok());
    const int32_t hit = *m.match_prefix(s);
    REQUIRE(m.allocate_slots(s, 8 - hit).ok());
    (void)m.take_step_ops();
    REQUIRE(m.free(s).ok());
    (*metrics)->update(m);
  }
  const std::string text = (*metrics)->text();
  INFO(text);
  const std::string labels[] = {"group=\"0\",kind=\"full_attention\"",
                                "group=\"1\",kind=\"chunked_local_attention\""};
  for (int32_t g = 0; g < 2; ++g) {
    const KvCacheManager::GroupStats s = *m.group_stats(g);
    INFO("group " << g);
    REQUIRE(s.blocks_demoted > 0);
    REQUIRE(s.blocks_promoted > 0);
    REQUIRE(s.evictions > 0);
    REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_blocks_demoted_total", labels[g],
                                              std::to_string(s.blocks_demoted))));
    REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_blocks_promoted_total", labels[g],
                                              std::to_string(s.blocks_promoted))));
    REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_evictions_total", labels[g],
                                              std::to_string(s.evictions))));
    REQUIRE_THAT(text, Catch::Contains(sample("kv_cache_group_cached_host_blocks", labels[g],
                                              std::to_string(s.cached_host_blocks))));
  }
  // A new manager with smaller totals: the counters stay where they were.
  auto fresh = KvCacheManager::create(
      {.block_size = 2,
       .layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 8},
                        {.kind = AttentionKind::kChunkedLocal, .window = 4, .num_blocks = 8}}});
  REQUIRE(fresh.ok());
  (*metrics)->update(*fresh);
  REQUIRE_THAT((*metrics)->text(),
               Catch::Contains(sample("kv_cache_group_blocks_demoted_total", labels[0],
                                      std::to_string(m.group_stats(0)->blocks_demoted))));
}

TEST_CASE("the remote tier's counters by outcome, and the store's latency as a histogram") {
  auto metrics = KvCacheMetrics::create({.model_name = "m"});
  REQUIRE(metrics.ok());
  RemoteTierStats t;
  t.lookups = 3;
  t.found_blocks = 10;
  t.corrupt_blocks = 2;
  t.loaded_tokens = 160;
  RemoteKvStats s;
  s.bytes_read = 4096;
  s.latency_histogram[0] = 2;  // <= 100 us
  s.latency_histogram[3] = 1;  // <= 1 ms
  s.latency_sum_us = 900;
  (*metrics)->update(t, s);
  s.latency_histogram[3] = 2;  // one more, 600 us
  s.latency_sum_us = 1500;
  t.found_blocks = 4;  // a smaller total: the counter stays
  (*metrics)->update(t, s);
  const std::string text = (*metrics)->text();
  INFO(text);
  CHECK_THAT(text, Catch::Contains("pagedkv:remote_lookups_total{model_name=\"m\"} 3"));
  CHECK_THAT(text,
             Catch::Contains("pagedkv:remote_blocks_total{model_name=\"m\",outcome=\"found\"} 10"));
  CHECK_THAT(
      text, Catch::Contains("pagedkv:remote_blocks_total{model_name=\"m\",outcome=\"corrupt\"} 2"));
  CHECK_THAT(text, Catch::Contains("pagedkv:prefix_cache_remote_hits_total{model_name=\"m\"} 160"));
  CHECK_THAT(text, Catch::Contains("pagedkv:remote_bytes_read_total{model_name=\"m\"} 4096"));
  CHECK_THAT(text,
             Catch::Contains("pagedkv:remote_request_latency_seconds_count{model_name=\"m\"} 4"));
  CHECK_THAT(
      text, Catch::Contains("pagedkv:remote_request_latency_seconds_sum{model_name=\"m\"} 0.0015"));
  CHECK_THAT(
      text, Catch::Contains(
                "pagedkv:remote_request_latency_seconds_bucket{model_name=\"m\",le=\"0.0001\"} 2"));
  CHECK_THAT(text,
             Catch::Contains(
                 "pagedkv:remote_request_latency_seconds_bucket{model_name=\"m\",le=\"0.001\"} 4"));
}

TEST_CASE("an invalid prefix is refused, and so is serving twice") {
  auto bad = KvCacheMetrics::create({.prefix = "1bad"});
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(bad.status().message()), Catch::Contains("1bad"));
  auto metrics = KvCacheMetrics::create({});
  REQUIRE(metrics.ok());
  REQUIRE((*metrics)->port() == 0);
  REQUIRE((*metrics)->serve("127.0.0.1:0").ok());
  REQUIRE((*metrics)->port() > 0);
  REQUIRE((*metrics)->serve("127.0.0.1:0").code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("HTTP worker threads and the request timeout are checked against their ranges") {
  auto no_threads = KvCacheMetrics::create({.num_threads = 0});
  REQUIRE(no_threads.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(no_threads.status().message()),
               Catch::Contains("num_threads 0 is not in 1..1024"));
  auto long_timeout = KvCacheMetrics::create({.request_timeout_ms = 60001});
  REQUIRE(long_timeout.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(long_timeout.status().message()),
               Catch::Contains("request_timeout_ms 60001 is not in 1..60000"));
}

}  // namespace
}  // namespace pagedkv
