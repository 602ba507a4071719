// Tests of KvCacheMetrics: names, labels and values in the exposition text.
#include "pagedkv/kv_cache_metrics.h"

#include <catch2/catch.hpp>
#include <string>

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
  REQUIRE_THAT(text, Catch::Contains("pagedkv:kv_events_published_total{model_name=\"m\"} 42"));
  REQUIRE_THAT(
      text, Catch::Contains(
                "pagedkv:kv_events_dropped_total{model_name=\"m\",reason=\"subscriber_hwm\"} 2"));
  REQUIRE_THAT(text,
               Catch::Contains("pagedkv:kv_events_requests_refused_total{model_name=\"m\"} 5"));
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
