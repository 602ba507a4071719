// Tests of the workload simulator (examples/simulator): trace readers, token derivation,
// the contiguous first-fit baseline, the eviction study against the reference LRU table
// of shared/traces/README.md, and quick engine runs on each shipped trace. Trace-based
// tests WARN and return when the traces are absent (PAGEDKV_TRACES_DIR overrides the
// default PAGEDKV_SOURCE_DIR/../shared/traces). Nothing here is timed.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "contiguous_arena.h"
#include "engine.h"
#include "eviction.h"
#include "report.h"
#include "simulate.h"
#include "synthetic.h"
#include "tokens.h"
#include "trace.h"

namespace pagedkv::sim {
namespace {

std::string traces_dir() {
  if (const char* dir = std::getenv("PAGEDKV_TRACES_DIR")) return dir;
  return std::string(PAGEDKV_SOURCE_DIR) + "/../shared/traces";
}

// The path of a shipped trace, or "" (after a WARN) when it is absent.
std::string trace_path(const std::string& name) {
  const std::string path = traces_dir() + "/" + name;
  if (!std::filesystem::exists(path)) {
    WARN("skipped: trace " << path << " not found (set PAGEDKV_TRACES_DIR)");
    return "";
  }
  return path;
}

Request make_request(int32_t input, int32_t output, std::vector<int64_t> hash_ids = {}) {
  Request r;
  r.input_length = input;
  r.output_length = output;
  r.hash_ids = std::move(hash_ids);
  return r;
}

TEST_CASE("Azure CSV rows parse into arrivals relative to the first row", "[simulator]") {
  absl::StatusOr<Trace> t = parse_azure_csv(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:17:03.9799600,4808,10\n"
      "2023-11-16 18:17:04.0319600,3180,8\n"
      "2023-11-16 18:18:03.9799600,7,1",
      "mini");
  REQUIRE(t.ok());
  REQUIRE(t->requests.size() == 3);
  CHECK(t->requests[0].arrival_s == 0.0);
  CHECK(t->requests[1].arrival_s == Approx(0.052).margin(1e-9));
  CHECK(t->requests[2].arrival_s == Approx(60.0).margin(1e-9));
  CHECK(t->requests[0].input_length == 4808);
  CHECK(t->requests[1].output_length == 8);
  CHECK(t->requests[2].hash_ids.empty());
}

TEST_CASE("malformed Azure rows name the line", "[simulator]") {
  absl::StatusOr<Trace> t = parse_azure_csv(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:17:03.9799600,4808,10\n"
      "2023-11-16 18:17:04.0319600,abc,8\n",
      "bad");
  REQUIRE(absl::IsInvalidArgument(t.status()));
  CHECK(std::string(t.status().message()).find("bad:3:") != std::string::npos);
  CHECK(std::string(t.status().message()).find("ContextTokens") != std::string::npos);

  absl::StatusOr<Trace> header = parse_azure_csv("time,in,out\n", "hdr");
  REQUIRE(absl::IsInvalidArgument(header.status()));
  CHECK(std::string(header.status().message()).find("hdr:1:") != std::string::npos);

  absl::StatusOr<Trace> stamp =
      parse_azure_csv("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-16 18:17:03,5,5\n", "ts");
  REQUIRE(absl::IsInvalidArgument(stamp.status()));
  CHECK(std::string(stamp.status().message()).find("ts:2: bad TIMESTAMP") != std::string::npos);
}

TEST_CASE("Mooncake JSONL rows parse, and bad rows name the line", "[simulator]") {
  absl::StatusOr<Trace> t = parse_mooncake_jsonl(
      "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 6, \"hash_ids\": [0, 1]}\n"
      "{\"timestamp\": 1500, \"input_length\": 512, \"output_length\": 2, \"hash_ids\": [0], "
      "\"note\": \"x\"}\n",
      "mc");
  REQUIRE(t.ok());
  REQUIRE(t->requests.size() == 2);
  CHECK(t->requests[1].arrival_s == 1.5);
  CHECK(t->requests[0].hash_ids == std::vector<int64_t>{0, 1});
  CHECK(t->requests[1].input_length == 512);

  absl::StatusOr<Trace> bad = parse_mooncake_jsonl(
      "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 6, \"hash_ids\": [0, 1]}\n"
      "{\"timestamp\": 1, \"input_length\": 1100, \"output_length\": 6, \"hash_ids\": [0, 1]}\n",
      "mc");
  REQUIRE(absl::IsInvalidArgument(bad.status()));
  CHECK(std::string(bad.status().message()).find("mc:2: hash_ids has 2 ids") != std::string::npos);

  absl::StatusOr<Trace> broken = parse_mooncake_jsonl("{\"timestamp\": 0, \"input_length\"", "mc");
  REQUIRE(absl::IsInvalidArgument(broken.status()));
  CHECK(std::string(broken.status().message()).find("mc:1:") != std::string::npos);
}

TEST_CASE("a missing trace file is NotFound naming the path", "[simulator]") {
  absl::StatusOr<Trace> t = read_trace("/nonexistent/trace.csv");
  REQUIRE(absl::IsNotFound(t.status()));
  CHECK(std::string(t.status().message()).find("/nonexistent/trace.csv") != std::string::npos);
  CHECK(absl::IsInvalidArgument(read_trace("/nonexistent/trace.txt").status()));
}

TEST_CASE("equal Mooncake hash ids give equal tokens, distinct ones differ", "[simulator]") {
  const Request a = make_request(1000, 1, {7, 8});
  const Request b = make_request(600, 1, {7, 9});
  const std::vector<TokenId> ta = prompt_tokens(a, 0);
  const std::vector<TokenId> tb = prompt_tokens(b, 1);
  REQUIRE(ta.size() == 1000);
  REQUIRE(tb.size() == 600);
  CHECK(std::equal(ta.begin(), ta.begin() + 512, tb.begin()));
  int32_t same = 0;
  for (int i = 512; i < 600; ++i) same += ta[i] == tb[i];
  CHECK(same == 0);
  // Without hash ids, prompts are unique per request.
  const Request c = make_request(64, 1);
  CHECK(prompt_tokens(c, 1) != prompt_tokens(c, 2));
}

TEST_CASE("clamping keeps prompt + output within max_model_len", "[simulator]") {
  Trace t;
  t.requests = {make_request(100, 10), make_request(8000, 500),
                make_request(9000, 5, std::vector<int64_t>(18))};
  const ClampStats c = clamp_to_model_len(t, 8192);
  CHECK(c.prompts_truncated == 1);
  CHECK(c.outputs_clamped == 2);
  CHECK(t.requests[0].output_length == 10);
  CHECK(t.requests[1].output_length == 192);
  CHECK(t.requests[2].input_length == 8191);
  CHECK(t.requests[2].output_length == 1);
  CHECK(t.requests[2].hash_ids.size() == 16);
}

TEST_CASE("contiguous arena places first-fit and coalesces holes", "[simulator]") {
  ContiguousArena arena(100);
  CHECK(*arena.allocate(30) == 0);
  CHECK(*arena.allocate(30) == 30);
  CHECK(*arena.allocate(30) == 60);
  REQUIRE(arena.release(30).ok());
  // External fragmentation: 40 slots free, but no hole of 35.
  CHECK(arena.free_slots() == 40);
  absl::StatusOr<int64_t> big = arena.allocate(35);
  REQUIRE(absl::IsResourceExhausted(big.status()));
  CHECK(std::string(big.status().message()).find("largest hole 30") != std::string::npos);
  CHECK(*arena.allocate(10) == 30);  // first fit: the lower hole
  REQUIRE(arena.release(0).ok());
  REQUIRE(arena.release(30).ok());
  CHECK(arena.largest_hole() == 60);  // [0, 60) coalesced
  CHECK(arena.num_holes() == 2);
  CHECK(absl::IsInvalidArgument(arena.release(5)));
}

TEST_CASE("synthetic workloads are deterministic and carry sharing and forks", "[simulator]") {
  SyntheticOptions o;
  o.num_requests = 500;
  absl::StatusOr<Trace> a = generate_synthetic(o);
  absl::StatusOr<Trace> b = generate_synthetic(o);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->requests.size() == 500);
  int shared = 0, parallel = 0, beams = 0;
  for (size_t i = 0; i < a->requests.size(); ++i) {
    const Request& r = a->requests[i];
    CHECK(r.input_length == b->requests[i].input_length);
    CHECK(r.arrival_s == b->requests[i].arrival_s);
    shared += r.system_prompt_id >= 0;
    parallel += r.num_samples > 1;
    beams += r.beam_width > 1;
  }
  CHECK(shared > 350);
  CHECK(parallel > 60);
  CHECK(beams > 25);
  o.rate_per_s = 0;
  CHECK(absl::IsInvalidArgument(generate_synthetic(o).status()));
}

TEST_CASE("LRU replay on BlockPool matches the README's reference table", "[simulator]") {
  const std::string path = trace_path("synthetic_trace.jsonl");
  if (path.empty()) return;
  absl::StatusOr<Trace> trace = read_mooncake_jsonl(path);
  REQUIRE(trace.ok());
  REQUIRE(trace->requests.size() == 3993);
  const BlockStreams streams = block_streams(*trace);
  CHECK(distinct_blocks(streams) == 43924);
  absl::StatusOr<std::vector<EvictionRow>> rows =
      eviction_study(streams, {1024, 4096, 16384, 65536});
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 5);
  // shared/traces/README.md, "Reference LRU baseline".
  const double reference[] = {0.0850, 0.2437, 0.5316, 0.6396, 0.6396};
  for (size_t i = 0; i < rows->size(); ++i) {
    const EvictionRow& row = (*rows)[i];
    INFO("capacity " << row.capacity);
    CHECK(row.lru.total_blocks == 121877);
    CHECK(row.lru.hit_rate() == Approx(reference[i]).margin(0.005));
    CHECK(row.lru.unregistered == 0);
    // The offline optimum is never worse, and equal once nothing has to be evicted.
    CHECK(row.belady.total_blocks == 121877);
    CHECK(row.belady.hit_blocks >= row.lru.hit_blocks);
    if (i > 0) CHECK(row.belady.hit_blocks >= (*rows)[i - 1].belady.hit_blocks);
  }
  CHECK((*rows)[4].infinite);
  CHECK((*rows)[4].lru.evictions == 0);
  CHECK((*rows)[4].belady.hit_blocks == (*rows)[4].lru.hit_blocks);
  CHECK((*rows)[4].lru.hit_blocks == 77953);  // 121,877 - 43,924: every repeat hits
}

TEST_CASE("Belady beats LRU on a cyclic stream that LRU always misses", "[simulator]") {
  // Three single-block requests cycling through a 2-block pool: LRU evicts each block
  // just before it is needed again; MIN keeps two of them and bypasses the third.
  BlockStreams streams;
  for (int i = 0; i < 30; ++i) streams.push_back({i % 3});
  absl::StatusOr<ReplayResult> lru = replay_lru(streams, 2);
  absl::StatusOr<ReplayResult> min = replay_belady(streams, 2);
  REQUIRE(lru.ok());
  REQUIRE(min.ok());
  CHECK(lru->hit_blocks == 0);
  CHECK(min->hit_blocks == 18);  // keeps blocks 0 and 1, bypasses 2: 2 hits per later cycle
  CHECK(absl::IsInvalidArgument(replay_lru(streams, 0).status()));
  CHECK(absl::IsInvalidArgument(replay_lru({{1, 2, 3}}, 2).status()));
}

}  // namespace
}  // namespace pagedkv::sim
