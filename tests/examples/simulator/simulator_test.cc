// Tests of the workload simulator (examples/simulator): trace readers, token derivation,
// the contiguous first-fit baseline, the eviction study against the reference LRU table
// of shared/traces/README.md, and quick engine runs on each shipped trace. Trace-based
// tests WARN and return when the traces are absent (PAGEDKV_TRACES_DIR overrides the
// default PAGEDKV_SOURCE_DIR/../shared/traces). Nothing here is timed.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "cluster.h"
#include "engine.h"
#include "eviction.h"
#include "report.h"
#include "shared_tier.h"
#include "simulate.h"
#include "studies/belady.h"
#include "studies/contiguous_arena.h"
#include "support/skip.h"
#include "synthetic.h"
#include "tokens.h"
#include "trace.h"

namespace pagedkv::sim {
namespace {

std::string traces_dir() {
  if (const char* dir = std::getenv("PAGEDKV_TRACES_DIR")) return dir;
  return std::string(PAGEDKV_SOURCE_DIR) + "/../shared/traces";
}

// The path of a shipped trace, or "" (after reporting a skip) when it is absent or this
// build checks invariants after every call.
std::string trace_path(const std::string& name) {
  if (pagedkv::testing::skipped_under_expensive_checks()) return "";  // a whole trace
  const std::string path = traces_dir() + "/" + name;
  if (!std::filesystem::exists(path)) {
    pagedkv::testing::report_skip("trace " + path + " not found (set PAGEDKV_TRACES_DIR)");
    return "";
  }
  return path;
}

// The Mooncake trace's block streams, one per request; nullopt (the skip reported) when
// the trace is absent.
std::optional<BlockStreams> mooncake_streams() {
  const std::string path = trace_path("synthetic_trace.jsonl");
  if (path.empty()) return std::nullopt;
  absl::StatusOr<Trace> trace = read_mooncake_jsonl(path);
  REQUIRE(trace.ok());
  return block_streams(*trace);
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

// The error for a trace whose first line is good and whose second is `bad_row`.
std::string second_row_error(const std::string& bad_row) {
  absl::StatusOr<Trace> t = parse_mooncake_jsonl(
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 6, \"hash_ids\": [0]}\n" +
          bad_row + "\n",
      "mc");
  REQUIRE(absl::IsInvalidArgument(t.status()));
  return std::string(t.status().message());
}

TEST_CASE("malformed Mooncake rows name the line and what is wrong", "[simulator]") {
  SECTION("bad JSON: the column and the syntax error") {
    CHECK(second_row_error("{\"timestamp\": 5,, \"input_length\": 10}") ==
          "mc:2: invalid JSON at column 17: syntax error while parsing object key - unexpected "
          "','; expected string literal");
  }
  SECTION("not an object") {
    CHECK(second_row_error("[1, 2]") == "mc:2: expected a JSON object, got [1,2]");
  }
  SECTION("missing field") {
    CHECK(second_row_error("{\"timestamp\": 5, \"input_length\": 10, \"hash_ids\": [0]}") ==
          "mc:2: missing \"output_length\" (a positive int32, in tokens)");
    CHECK(second_row_error("{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 6}") ==
          "mc:2: missing \"hash_ids\" (an array of integers)");
  }
  SECTION("wrong type") {
    CHECK(second_row_error(
              "{\"timestamp\": \"5\", \"input_length\": 10, \"output_length\": 6, \"hash_ids\": "
              "[0]}") == "mc:2: \"timestamp\" must be an integer >= 0, in ms, got \"5\"");
    CHECK(second_row_error(
              "{\"timestamp\": 5, \"input_length\": 10.5, \"output_length\": 6, \"hash_ids\": "
              "[0]}") == "mc:2: \"input_length\" must be a positive int32, in tokens, got 10.5");
    CHECK(second_row_error(
              "{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 6, \"hash_ids\": 0}") ==
          "mc:2: \"hash_ids\" must be an array of integers, got 0");
    CHECK(second_row_error("{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 6, "
                           "\"hash_ids\": [null]}") ==
          "mc:2: \"hash_ids\"[0] must be an int64, got null");
  }
  SECTION("out of range") {
    CHECK(second_row_error(
              "{\"timestamp\": -1, \"input_length\": 10, \"output_length\": 6, \"hash_ids\": "
              "[0]}") == "mc:2: \"timestamp\" must be an integer >= 0, in ms, got -1");
    CHECK(second_row_error("{\"timestamp\": 5, \"input_length\": 2147483648, \"output_length\": "
                           "6, \"hash_ids\": [0]}") ==
          "mc:2: \"input_length\" must be a positive int32, in tokens, got 2147483648");
    CHECK(second_row_error("{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 6, "
                           "\"hash_ids\": [9223372036854775808]}") ==
          "mc:2: \"hash_ids\"[0] must be an int64, got 9223372036854775808");
  }
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
  const std::optional<BlockStreams> trace = mooncake_streams();
  if (!trace) return;
  const BlockStreams& streams = *trace;
  REQUIRE(streams.size() == 3993);
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
  absl::StatusOr<ReplayResult> lru = replay_block_pool(streams, 2);
  absl::StatusOr<ReplayResult> min = replay_belady(streams, 2);
  REQUIRE(lru.ok());
  REQUIRE(min.ok());
  CHECK(lru->hit_blocks == 0);
  CHECK(min->hit_blocks == 18);  // keeps blocks 0 and 1, bypasses 2: 2 hits per later cycle
  CHECK(absl::IsInvalidArgument(replay_block_pool(streams, 0).status()));
  CHECK(absl::IsInvalidArgument(replay_block_pool({{1, 2, 3}}, 2).status()));
}

// --- tier study ---------------------------------------------------------------------------

TEST_CASE("tiers: a cycle the device cannot hold hits in the host tier", "[simulator]") {
  // Four single-block requests cycling over 2 device + 2 host blocks: each block is
  // demoted as it ages and promoted when it comes round again.
  BlockStreams streams;
  for (int i = 0; i < 30; ++i) streams.push_back({i % 4});
  absl::StatusOr<TieredReplayResult> t =
      replay_tiers(streams, {.device_blocks = 2, .host_blocks = 2});
  REQUIRE(t.ok());
  CHECK(t->total_blocks == 30);
  CHECK(t->device_hit_blocks == 0);
  CHECK(t->host_hit_blocks == 26);  // every reference after the first cycle
  CHECK(t->promotions == 26);
  CHECK(t->demotions == 28);  // every request after the first two pushes one block out
  CHECK(t->dropped == 0);
  // One pool of 4 holds the cycle too; one of 2 (the device alone) never hits.
  CHECK(replay_block_pool(streams, 4)->hit_blocks == 26);
  CHECK(replay_block_pool(streams, 2)->hit_blocks == 0);
  // Without a host tier the device drops what it evicts, as the single pool does.
  absl::StatusOr<TieredReplayResult> device_only = replay_tiers(streams, {.device_blocks = 2});
  REQUIRE(device_only.ok());
  CHECK(device_only->hit_blocks() == 0);
  CHECK(device_only->demotions == 0);
  CHECK(device_only->dropped == 28);
}

TEST_CASE("tiers: a hit chain runs from device into host blocks", "[simulator]") {
  // 4 device + 3 host blocks (a sequence also holds its last token, never computed). After
  // {0,1,2} then {0,7,8}, block 2 (the least recent) sits in the host tier while 0 and 1
  // are on the device: {0,1,2} hits 0 and 1 on the device and 2 in the host, whose
  // promotion demotes 8 (the least recent of 1, 8, 7).
  const BlockStreams streams = {{0, 1, 2}, {0, 7, 8}, {0, 1, 2}};
  absl::StatusOr<TieredReplayResult> t =
      replay_tiers(streams, {.device_blocks = 4, .host_blocks = 3});
  REQUIRE(t.ok());
  CHECK(t->total_blocks == 9);
  CHECK(t->device_hit_blocks == 3);  // 0 in request 2; 0 and 1 in request 3
  CHECK(t->host_hit_blocks == 1);    // 2 in request 3
  CHECK(t->demotions == 2);          // 2 (for 7 and 8), then 8 (for the promotion of 2)
  CHECK(t->dropped == 0);
  CHECK(replay_block_pool(streams, 7)->hit_blocks == t->hit_blocks());
  CHECK(replay_block_pool(streams, 4)->hit_blocks == t->device_hit_blocks);
  // A host tier of one block is enough: 2 leaves it (promoted) as 8 is demoted into it.
  absl::StatusOr<TieredReplayResult> small =
      replay_tiers(streams, {.device_blocks = 4, .host_blocks = 1});
  REQUIRE(small.ok());
  CHECK(small->host_hit_blocks == 1);
  CHECK(small->dropped == 0);
}

TEST_CASE("retention priorities keep request heads past plain LRU", "[simulator]") {
  // 4 device blocks. Plain LRU: {5,6,7} evicts 1, then {8} evicts 0, the least recent, so
  // the last {0} misses. Retaining each request's first block (a priority above the
  // default) evicts the tails 1 and 7 instead, and {0} hits.
  const BlockStreams streams = {{0, 1}, {5, 6, 7}, {8}, {0}};
  CHECK(replay_block_pool(streams, 4)->hit_blocks == 0);
  CHECK(replay_tiers(streams, {.device_blocks = 4})->hit_blocks() == 0);
  absl::StatusOr<TieredReplayResult> retained =
      replay_tiers(streams, {.device_blocks = 4, .retained_head_blocks = 1});
  REQUIRE(retained.ok());
  CHECK(retained->device_hit_blocks == 1);
  CHECK(retained->dropped == 2);  // 1, then 7
}

TEST_CASE("tiers: bad sizes and requests larger than the device are refused", "[simulator]") {
  const BlockStreams streams = {{1, 2, 3}};
  CHECK(absl::IsInvalidArgument(
      replay_tiers(streams, {.device_blocks = 4, .retained_head_blocks = -1}).status()));
  CHECK(absl::IsInvalidArgument(
      replay_tiers(streams, {.device_blocks = 0, .host_blocks = 4}).status()));
  CHECK(absl::IsInvalidArgument(
      replay_tiers(streams, {.device_blocks = 4, .host_blocks = -1}).status()));
  absl::StatusOr<TieredReplayResult> big =
      replay_tiers(streams, {.device_blocks = 2, .host_blocks = 100});
  REQUIRE(absl::IsInvalidArgument(big.status()));
  CHECK(std::string(big.status().message()).find("needs 4 blocks, more than the device tier's 2") !=
        std::string::npos);
}

TEST_CASE("tiers on the Mooncake trace lose nothing against one pool of the same size",
          "[simulator]") {
  const std::optional<BlockStreams> trace = mooncake_streams();
  if (!trace) return;
  const BlockStreams& streams = *trace;
  absl::StatusOr<std::vector<TierRow>> rows =
      tier_study(streams, {{.device_blocks = 1024, .host_blocks = 3072},
                           {.device_blocks = 4096, .host_blocks = 12288}});
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 2);
  for (const TierRow& row : *rows) {
    const TieredReplayResult& t = row.tiered;
    INFO("device " << t.size.device_blocks << " + host " << t.size.host_blocks << ": device hits "
                   << t.device_hit_blocks << ", host hits " << t.host_hit_blocks << ", single pool "
                   << row.single.hit_blocks);
    CHECK(t.total_blocks == 121877);
    CHECK(row.single.capacity == t.size.device_blocks + t.size.host_blocks);
    // Issue 13's criterion, then the exact identity behind it: every host block is older
    // than every unpinned device block, so the tiers hold the D + H most recent blocks.
    CHECK(std::abs(t.hit_rate() - row.single.hit_rate()) <= 0.005);
    CHECK(t.hit_blocks() == row.single.hit_blocks);
    // The device tier alone behaves as a single pool of its size.
    absl::StatusOr<ReplayResult> device_alone = replay_block_pool(streams, t.size.device_blocks);
    REQUIRE(device_alone.ok());
    CHECK(t.device_hit_blocks == device_alone->hit_blocks);
    // The host tier is used: hits there, each promoted, and every promoted block was
    // demoted first.
    CHECK(t.host_hit_blocks > 0);
    CHECK(t.promotions == t.host_hit_blocks);
    CHECK(t.demotions >= t.promotions);
  }
  // Without a host tier the manager is the single pool.
  absl::StatusOr<TieredReplayResult> no_host = replay_tiers(streams, {.device_blocks = 1024});
  REQUIRE(no_host.ok());
  CHECK(no_host->hit_blocks() == (*rows)[0].tiered.device_hit_blocks);
  CHECK(no_host->host_hit_blocks == 0);
}

// --- eviction beyond LRU (issue 24) -------------------------------------------------------

TEST_CASE("host admission: only blocks with evidence of reuse are demoted", "[simulator]") {
  // 2 device + 2 host blocks. A is hit, so its eviction by C demotes it; B (used once) is
  // demoted by demote-all but dropped by the rule when D comes. B's return is a host hit
  // for demote-all; for the rule it is a miss that finds B's ghost, so B counts as reused.
  const BlockStreams streams = {{'A'}, {'A'}, {'B'}, {'C'}, {'D'}, {'B'}, {'A'}};
  const TierSize size{.device_blocks = 2, .host_blocks = 2};
  absl::StatusOr<TieredReplayResult> all = replay_tiers(streams, size, HostAdmission::kAll);
  absl::StatusOr<TieredReplayResult> reused = replay_tiers(streams, size, HostAdmission::kReused);
  REQUIRE(all.ok());
  REQUIRE(reused.ok());
  // Demote-all: A (for C), B (for D), C (for B's promotion), D (for A's); A and B come
  // back from the host.
  CHECK(all->demotions == 4);
  CHECK(all->not_admitted == 0);
  CHECK(all->host_hit_blocks == 2);
  // The rule: A is demoted; B, C and D, never hit, are dropped.
  CHECK(reused->demotions == 1);
  CHECK(reused->not_admitted == 3);
  CHECK(reused->host_hit_blocks == 1);  // A
  CHECK(reused->device_hit_blocks == all->device_hit_blocks);
}

TEST_CASE("BlockPool's adaptive policy keeps a reused prompt through scans longer than the pool",
          "[simulator]") {
  // A 4-block prompt used twice, then three one-off 4-block prompts before each of its
  // next 20 uses, a 10-block pool: 12 blocks of one-offs push it out of LRU every time.
  BlockStreams streams = {{1, 2, 3, 4}, {1, 2, 3, 4}};
  int64_t next_id = 100;
  for (int round = 0; round < 20; ++round) {
    for (int one_off = 0; one_off < 3; ++one_off) {
      streams.push_back({next_id, next_id + 1, next_id + 2, next_id + 3});
      next_id += 4;
    }
    streams.push_back({1, 2, 3, 4});
  }
  const absl::StatusOr<ReplayResult> lru = replay_block_pool(streams, 10);
  const absl::StatusOr<ReplayResult> adaptive =
      replay_block_pool(streams, 10, EvictionPolicy::kAdaptive);
  REQUIRE(lru.ok());
  REQUIRE(adaptive.ok());
  INFO("LRU " << lru->hit_blocks << ", adaptive " << adaptive->hit_blocks);
  CHECK(lru->hit_blocks == 4);  // only the immediate reuse
  // Hit twice, the prompt is frequent (T2) and the one-offs (T1, over the target 0) go
  // first: every use hits whole.
  CHECK(adaptive->hit_blocks == 4 + 20 * 4);
}

TEST_CASE(
    "eviction policies on the Mooncake trace: adaptive never below LRU, admission "
    "halves demotions",
    "[simulator]") {
  const std::optional<BlockStreams> trace = mooncake_streams();
  if (!trace) return;
  const BlockStreams& streams = *trace;
  absl::StatusOr<std::vector<PolicyRow>> rows = policy_study(streams, {1024, 4096, 16384, 65536});
  REQUIRE(rows.ok());
  for (const PolicyRow& row : *rows) {
    INFO("capacity " << row.capacity << ": LRU " << row.lru.hit_blocks << ", adaptive "
                     << row.adaptive.hit_blocks << ", Belady " << row.belady.hit_blocks);
    CHECK(row.adaptive.total_blocks == 121877);
    CHECK(row.adaptive.hit_blocks >= row.lru.hit_blocks);
    CHECK(row.adaptive.hit_blocks <= row.belady.hit_blocks);
  }
  // Issue 24's admission criteria: at least half the demotions saved, the combined hit
  // rate within 1 % of demote-all's (which is LRU at 4,096, as the tier study shows).
  absl::StatusOr<AdmissionRow> admission =
      admission_study(streams, {.device_blocks = 1024, .host_blocks = 3072});
  REQUIRE(admission.ok());
  CHECK(admission->all.hit_blocks() == (*rows)[1].lru.hit_blocks);
  CHECK(admission->demotions_saved() >= 0.5);
  CHECK(admission->reused.hit_rate() >= 0.99 * admission->all.hit_rate());
}

// --- engine model ------------------------------------------------------------------------

Trace one_request_trace() {
  Trace t;
  t.name = "one";
  t.requests = {make_request(10, 3)};
  return t;
}

TEST_CASE("engine: utilization is token slots over reserved slots, step by step", "[simulator]") {
  // One request, prompt 10, output 3: step 1 computes the prompt (10 tokens), steps 2
  // and 3 one generated token each (11, 12 tokens). Paged with 4-token blocks holds
  // 3 blocks = 12 slots throughout; contiguous-max reserves max_model_len = 16.
  const Trace trace = one_request_trace();
  EngineOptions engine;  // 20 ms per step + 50 ms per 1,000 prompt tokens
  const double dt1 = 0.020 + 0.050 * 10 / 1000, dt = 0.020;
  const double paged_mean = (10.0 / 12 * dt1 + 11.0 / 12 * dt + 12.0 / 12 * dt) / (dt1 + 2 * dt);
  const double max_mean = (10.0 / 16 * dt1 + 11.0 / 16 * dt + 12.0 / 16 * dt) / (dt1 + 2 * dt);
  for (AllocatorKind kind : {AllocatorKind::kPaged, AllocatorKind::kPagedPrefix,
                             AllocatorKind::kContiguousMax, AllocatorKind::kContiguousOracle}) {
    AllocatorSetup setup;
    setup.config = {.kind = kind, .block_size = 4};
    setup.budget_tokens = 64;
    setup.max_model_len = 16;
    setup.watermark_fraction = 0;
    absl::StatusOr<EngineResult> r = run_engine(trace, setup, engine);
    REQUIRE(r.ok());
    INFO(r->allocator);
    CHECK(r->completed == 1);
    CHECK(r->steps == 3);
    CHECK(r->generated_tokens == 3);
    CHECK(r->sim_time_s == Approx(dt1 + 2 * dt));
    CHECK(r->peak_concurrency == 1);
    CHECK(r->preemptions == 0);
    // Oracle reserves prompt + output - 1 = 12 slots: the same as three 4-token blocks.
    CHECK(r->mean_utilization ==
          Approx(kind == AllocatorKind::kContiguousMax ? max_mean : paged_mean));
  }
}

TEST_CASE("engine: chunked prefill computes a prompt over several steps", "[simulator]") {
  // Prompt 40 tokens, output 3, 16 prompt tokens per step: steps 1-3 compute 16, 16 and 8
  // prompt tokens (the third also generates the first token), steps 4 and 5 one token each.
  Trace t;
  t.name = "chunked";
  t.requests = {make_request(40, 3)};
  AllocatorSetup setup;
  setup.config = {.kind = AllocatorKind::kPaged, .block_size = 4};
  setup.budget_tokens = 256;
  setup.max_model_len = 64;
  setup.watermark_fraction = 0;
  EngineOptions engine;
  engine.chunked_prefill = true;
  engine.max_prefill_tokens = 16;
  engine.check_invariants = true;
  absl::StatusOr<EngineResult> r = run_engine(t, setup, engine);
  REQUIRE(r.ok());
  CHECK(r->completed == 1);
  CHECK(r->steps == 5);
  CHECK(r->generated_tokens == 3);
  CHECK(r->sim_time_s == Approx(5 * 0.020 + 0.050 * 40 / 1000));
  engine.chunked_prefill = false;
  r = run_engine(t, setup, engine);
  REQUIRE(r.ok());
  CHECK(r->steps == 3);
}

TEST_CASE("engine: hybrid pools count KV bytes against the analytic need", "[simulator]") {
  // One request of 100 prompt + 2 output tokens, window 32, blocks of 16: the window group
  // holds the blocks of the last chunk and those before it that its first token attends to.
  Trace t;
  t.name = "hybrid";
  t.requests = {make_request(100, 2)};
  const KvCacheConfig config{
      .groups = {{.kind = AttentionKind::kSlidingWindow, .window = 32, .shape = {.num_layers = 3}},
                 {.kind = AttentionKind::kFull, .shape = {.num_layers = 1}}},
      .block_size = 16};
  AllocatorSetup setup;
  setup.config = {.kind = AllocatorKind::kPaged, .block_size = 16};
  setup.budget_tokens = 1;
  setup.max_model_len = 128;
  setup.watermark_fraction = 0;
  setup.hybrid =
      HybridPools{.groups = {{.kind = AttentionKind::kSlidingWindow, .window = 32, .num_blocks = 8},
                             {.kind = AttentionKind::kFull, .num_blocks = 16}},
                  .pools = config,
                  .model = config,
                  .budget_bytes = 8 * config.page_bytes(0) + 16 * config.page_bytes(1)};
  EngineOptions engine;
  engine.chunked_prefill = true;
  engine.max_prefill_tokens = 32;
  engine.check_invariants = true;
  absl::StatusOr<EngineResult> r = run_engine(t, setup, engine);
  REQUIRE(r.ok());
  CHECK(r->completed == 1);
  CHECK(r->steps == 5);  // 32 + 32 + 32 + 4 prompt tokens, then one decode step
  CHECK(r->mean_utilization > 0.3);
  CHECK(r->mean_utilization < 1.0);
  CHECK(r->mean_reserved < 1.0);
  // The whole prompt in one step would need 7 window blocks; a pool of 4 refuses it.
  setup.hybrid->groups[0].num_blocks = 4;
  engine.chunked_prefill = false;
  r = run_engine(t, setup, engine);
  REQUIRE(r.ok());
  CHECK(r->rejected == 1);
}

TEST_CASE("engine: a pool too small for two growing requests preempts and still finishes",
          "[simulator]") {
  // Two requests of 6 prompt + 12 output tokens in 6 blocks of 4 tokens: both are
  // admitted (2 blocks each), then decode needs 5 blocks each, so one is preempted
  // (recompute) and resumes after the other finishes.
  Trace t;
  t.name = "two";
  t.requests = {make_request(6, 12), make_request(6, 12)};
  AllocatorSetup setup;
  setup.config = {.kind = AllocatorKind::kPaged, .block_size = 4};
  setup.budget_tokens = 24;
  setup.max_model_len = 32;
  setup.watermark_fraction = 0;
  EngineOptions checked;
  checked.check_invariants = true;
  absl::StatusOr<EngineResult> r = run_engine(t, setup, checked);
  REQUIRE(r.ok());
  CHECK(r->completed == 2);
  CHECK(r->preemptions >= 1);
  CHECK(r->generated_tokens >= 24);
  CHECK(r->peak_concurrency == 2);

  // Swap mode with host space: the victim is swapped out and back instead.
  setup.preemption_mode = PreemptionMode::kSwap;
  setup.host_budget_tokens = 64;
  absl::StatusOr<EngineResult> swapped = run_engine(t, setup, checked);
  REQUIRE(swapped.ok());
  CHECK(swapped->completed == 2);
  CHECK(swapped->preemptions_swap >= 1);
  CHECK(swapped->generated_tokens == 24);  // nothing recomputed
}

TEST_CASE("engine: requests that can never fit are rejected, bad traces refused", "[simulator]") {
  Trace t;
  t.name = "big";
  t.requests = {make_request(40, 2), make_request(4, 2)};
  AllocatorSetup setup;
  setup.config = {.kind = AllocatorKind::kPaged, .block_size = 4};
  setup.budget_tokens = 32;
  setup.max_model_len = 64;
  absl::StatusOr<EngineResult> r = run_engine(t, setup, EngineOptions{});
  REQUIRE(r.ok());
  CHECK(r->rejected == 1);
  CHECK(r->completed == 1);
  setup.max_model_len = 16;
  absl::StatusOr<EngineResult> bad = run_engine(t, setup, EngineOptions{});
  REQUIRE(absl::IsInvalidArgument(bad.status()));
  CHECK(std::string(bad.status().message()).find("request 0") != std::string::npos);
}

TEST_CASE("engine: parallel samples share the prompt only when paged", "[simulator]") {
  // One request with 4 samples, prompt 64, output 8. Paged (no prefix caching) shares
  // the prompt's blocks between the forks; contiguous copies it into 4 reservations.
  Trace t;
  t.name = "n4";
  t.requests = {make_request(64, 8)};
  t.requests[0].num_samples = 4;
  for (AllocatorKind kind : {AllocatorKind::kPaged, AllocatorKind::kContiguousOracle}) {
    AllocatorSetup setup;
    setup.config = {.kind = kind, .block_size = 16};
    setup.budget_tokens = 1024;
    setup.max_model_len = 128;
    absl::StatusOr<EngineResult> r = run_engine(t, setup, EngineOptions{});
    REQUIRE(r.ok());
    INFO(r->allocator);
    CHECK(r->completed == 1);
    CHECK(r->generated_tokens == 32);
    if (kind == AllocatorKind::kPaged) {
      // The 64-token prompt fills 4 blocks exactly, so the samples share them and each
      // appends into a block of its own: no copy-on-write.
      CHECK(r->cow_copies == 0);
      CHECK(r->mean_utilization > 0.6);
    } else {
      CHECK(r->mean_utilization > 0.85);
    }
  }
}

TEST_CASE("engine: an evicted prompt comes back from the host tier", "[simulator]") {
  // 128 device blocks of 16 tokens, requests 10 s apart (each done in two steps: prefill,
  // then one decode step that takes a 65th block for token 1,025). Request 0's 1,024-token
  // prompt (64 blocks) is evicted by requests 1-4 (unrelated prompts); request 5's first
  // 1,024 tokens are the same. A freed sequence's blocks join the LRU tail last block
  // first, its partial block the clean head.
  //   request 1: 64 blocks from the clean ones, its 65th evicts 1 of request 0's blocks;
  //   requests 2-4: each takes the previous partial block and evicts 63 + 1 blocks.
  //   request 5: 69 blocks (1,100 tokens): the partial block and 68 evictions.
  // 1 + 3 * 64 + 68 = 261 evictions.
  Trace t;
  t.name = "tier";
  t.requests.push_back(make_request(1024, 2, {1, 2}));
  for (int64_t i = 1; i <= 4; ++i)
    t.requests.push_back(make_request(1024, 2, {10 * i, 10 * i + 1}));
  t.requests.push_back(make_request(1100, 2, {1, 2, 99}));
  for (size_t i = 0; i < t.requests.size(); ++i) t.requests[i].arrival_s = 10.0 * i;
  AllocatorSetup setup;
  setup.config = {.kind = AllocatorKind::kPagedPrefix, .block_size = 16};
  setup.budget_tokens = 128 * 16;
  setup.max_model_len = 2048;
  setup.watermark_fraction = 0;
  EngineOptions engine;
  engine.check_invariants = true;
  absl::StatusOr<EngineResult> device_only = run_engine(t, setup, engine);
  REQUIRE(device_only.ok());
  CHECK(device_only->completed == 6);
  CHECK(device_only->prefix_hit_tokens == 0);  // evicted before request 5 arrives
  CHECK(device_only->evictions == 261);
  CHECK(device_only->blocks_demoted == 0);

  // A host tier of 512 blocks: requests 1-4 demote the 193 blocks they evict, request 0's
  // 64 among them (no host eviction). Request 5 hits those 64 in the host tier; the
  // promotion takes 64 device blocks: the partial block (a plain promotion) and 63 evicted
  // cached blocks, each exchanged with the host block it vacates (a demotion too). Its
  // last 76 tokens take 5 more blocks, evicting and demoting 5.
  setup.host_cache_tokens = 512 * 16;
  absl::StatusOr<EngineResult> tiered = run_engine(t, setup, engine);
  REQUIRE(tiered.ok());
  CHECK(tiered->completed == 6);
  CHECK(tiered->prefix_query_tokens == 5 * 1024 + 1100);
  CHECK(tiered->prefix_hit_tokens == 1024);  // the shared 64 blocks, all from the host
  CHECK(tiered->prefix_host_hit_tokens == 1024);
  CHECK(tiered->blocks_promoted == 64);
  CHECK(tiered->evictions == 261);       // the same blocks leave the device
  CHECK(tiered->blocks_demoted == 261);  // 193 + 63 exchanges + 5: every eviction
  CHECK(tiered->host_evictions == 0);    // 512 blocks hold them all
  // 64 blocks of 16 tokens at 128 KiB per token over 55 GB/s, instead of the prefill of
  // 1,024 tokens at 50 ms per 1,000: request 5 finishes that much earlier.
  const double promote_s = 64.0 * 16 * 131072 / 55e9;
  CHECK(tiered->promote_time_s == Approx(promote_s));
  CHECK(device_only->sim_time_s - tiered->sim_time_s == Approx(0.050 * 1024 / 1000 - promote_s));
}

TEST_CASE("engine: host hits beyond the device room are promoted when the admission retries",
          "[simulator]") {
  // 128 device blocks of 16 tokens, a host tier of 512. Request 0 (1,024 tokens, 64
  // blocks, freed after two steps) is demoted whole by request 1, whose 2,048-token
  // prompt takes all 128 blocks (64 clean, 64 evictions) and which finishes in its
  // prefill step. At t = 20 request 2 (1,590 tokens, 100 blocks, 11 output tokens, so
  // never a 101st block) evicts and demotes 100 of request 1's blocks, and request 3
  // (request 0's 1,024 tokens + 76) matches in the same step: the 28 free device blocks
  // (request 1's first 28, exchanged into the host) are room for 28 of its 64 host hits,
  // and its admission fails. Each retry gives the claim back and matches again: 28 device
  // hits, no room for more until request 2 is done (step 11). Step 12 promotes the other
  // 36 (exchanged with request 2's last blocks) and admits it with 76 tokens to prefill
  // in 5 more blocks (5 evictions, demoted).
  Trace t;
  t.name = "retry";
  t.requests = {make_request(1024, 2, {1, 2}), make_request(2048, 1, {10, 11, 12, 13}),
                make_request(1590, 11, {20, 21, 22, 23}), make_request(1100, 2, {1, 2, 99})};
  t.requests[0].arrival_s = 0;
  t.requests[1].arrival_s = 10;
  t.requests[2].arrival_s = 20;
  t.requests[3].arrival_s = 20;
  AllocatorSetup setup;
  setup.config = {.kind = AllocatorKind::kPagedPrefix, .block_size = 16};
  setup.budget_tokens = 128 * 16;
  setup.max_model_len = 4096;
  setup.watermark_fraction = 0;
  EngineOptions engine;
  engine.check_invariants = true;
  absl::StatusOr<EngineResult> device_only = run_engine(t, setup, engine);
  REQUIRE(device_only.ok());
  CHECK(device_only->completed == 4);
  CHECK(device_only->prefix_hit_tokens == 0);
  // 64 + 100 + request 3's 69 blocks (28 of request 1's, 41 of request 2's).
  CHECK(device_only->evictions == 233);

  setup.host_cache_tokens = 512 * 16;
  absl::StatusOr<EngineResult> tiered = run_engine(t, setup, engine);
  REQUIRE(tiered.ok());
  CHECK(tiered->completed == 4);
  CHECK(tiered->prefix_query_tokens == 1024 + 2048 + 1590 + 1100);
  CHECK(tiered->prefix_hit_tokens == 1024);
  CHECK(tiered->prefix_host_hit_tokens == 1024);  // 28 blocks at t = 20, 36 at step 12
  CHECK(tiered->blocks_promoted == 64);
  CHECK(tiered->evictions == 233);       // 64 + 100 + 28 + 36 + 5
  CHECK(tiered->blocks_demoted == 233);  // every eviction, 64 of them by exchange
  CHECK(tiered->host_evictions == 0);
  const double block_s = 16.0 * 131072 / 55e9;  // promoting one block
  CHECK(tiered->promote_time_s == Approx(64 * block_s));
  const double saved_s = 0.050 * 1024 / 1000 - 64 * block_s;
  CHECK(device_only->sim_time_s - tiered->sim_time_s == Approx(saved_s));
  // The first 28 promotions lengthen the step at t = 20: request 2 finishes 28 blocks'
  // time later, request 3 saved_s earlier (means over the 4 requests).
  CHECK(tiered->mean_latency_s - device_only->mean_latency_s ==
        Approx((28 * block_s - saved_s) / 4));
}

// --- quick runs on the shipped traces -------------------------------------------------------

SimOptions quick_options() {
  SimOptions o;
  o.traces_dir = traces_dir();
  o.quick = true;
  o.eviction = false;
  return o;
}

const EngineResult& find_result(const TraceRun& run, const std::string& name) {
  for (const EngineResult& r : run.results) {
    if (r.allocator == name) return r;
  }
  FAIL("no allocator " << name);
  return run.results.front();
}

// Properties every quick run must show: all requests served, paging keeps ~all reserved
// memory busy, contiguous max reservation wastes most of it, and paging runs more
// requests at once.
void check_paging_beats_contiguous(const TraceRun& run, int32_t contiguous_slots) {
  REQUIRE(run.results.size() == 8);
  for (const EngineResult& r : run.results) {
    INFO(run.trace << " " << r.allocator);
    CHECK(r.completed + r.rejected == r.requests);
    CHECK(r.rejected == 0);
    CHECK(r.mean_utilization <= 1.0);
    CHECK(r.allocator_ns_per_step == 0);  // not measured in tests
  }
  const EngineResult& max = find_result(run, "contiguous-max");
  const EngineResult& oracle = find_result(run, "contiguous-oracle");
  CHECK(max.peak_concurrency == contiguous_slots);
  CHECK(max.mean_utilization < 0.35);
  for (int32_t bs : {8, 16, 32}) {
    for (const char* kind : {"paged/", "paged+prefix/"}) {
      const EngineResult& paged = find_result(run, kind + std::to_string(bs));
      INFO(paged.allocator);
      CHECK(paged.mean_utilization > 0.97);
      CHECK(paged.mean_utilization > oracle.mean_utilization);
      CHECK(paged.peak_concurrency >= 4 * max.peak_concurrency);
      CHECK(paged.mean_concurrency > 2.5 * max.mean_concurrency);
      CHECK(paged.throughput_rps > max.throughput_rps);
    }
  }
  // Larger blocks waste more of each sequence's last block.
  CHECK(find_result(run, "paged/8").mean_utilization >=
        find_result(run, "paged/16").mean_utilization);
  CHECK(find_result(run, "paged/16").mean_utilization >=
        find_result(run, "paged/32").mean_utilization);
  CHECK(find_result(run, "paged/16").prefix_hit_tokens == 0);
}

TEST_CASE("quick run on the Azure code trace: paging beats contiguous reservation", "[simulator]") {
  const std::string path = trace_path("AzureLLMInferenceTrace_code.csv");
  if (path.empty()) return;
  absl::StatusOr<Trace> trace = read_trace(path);
  REQUIRE(trace.ok());
  REQUIRE(trace->requests.size() == 8819);
  absl::StatusOr<TraceRun> run = run_trace(*trace, TraceKind::kAzure, quick_options());
  REQUIRE(run.ok());
  CHECK(run->requests == 400);
  CHECK(run->budget_tokens == 65536);  // 8 GiB at 128 KiB per token
  check_paging_beats_contiguous(*run, 65536 / 8192);
  const EngineResult& max = find_result(*run, "contiguous-max");
  CHECK(max.mean_utilization == Approx(0.317).margin(0.01));
}

TEST_CASE("quick run on the Azure conv trace: paging beats contiguous reservation", "[simulator]") {
  const std::string path = trace_path("AzureLLMInferenceTrace_conv.csv");
  if (path.empty()) return;
  absl::StatusOr<Trace> trace = read_trace(path);
  REQUIRE(trace.ok());
  REQUIRE(trace->requests.size() == 19366);
  absl::StatusOr<TraceRun> run = run_trace(*trace, TraceKind::kAzure, quick_options());
  REQUIRE(run.ok());
  check_paging_beats_contiguous(*run, 65536 / 8192);
  const EngineResult& max = find_result(*run, "contiguous-max");
  CHECK(max.mean_utilization == Approx(0.137).margin(0.01));
  // Conversation outputs are long: paging serves several times more requests per second.
  CHECK(find_result(*run, "paged/16").throughput_rps > 3 * max.throughput_rps);
}

TEST_CASE("quick run on the Mooncake trace: prefix caching hits shared prefixes", "[simulator]") {
  const std::string path = trace_path("synthetic_trace.jsonl");
  if (path.empty()) return;
  absl::StatusOr<Trace> trace = read_trace(path);
  REQUIRE(trace.ok());
  absl::StatusOr<TraceRun> run = run_trace(*trace, TraceKind::kMooncake, quick_options());
  REQUIRE(run.ok());
  CHECK(run->budget_tokens == 524288);  // 64 GiB
  check_paging_beats_contiguous(*run, 524288 / 131072);
  for (int32_t bs : {8, 16, 32}) {
    const EngineResult& prefix = find_result(*run, "paged+prefix/" + std::to_string(bs));
    INFO(prefix.allocator);
    CHECK(prefix.prefix_hit_tokens > 0);
    CHECK(prefix.prefix_hit_tokens <= prefix.prefix_query_tokens);
    CHECK(prefix.evictions > 0);
  }
}

TEST_CASE("quick run on the Mooncake trace: a host tier raises the prefix hit rate",
          "[simulator]") {
  const std::string path = trace_path("synthetic_trace.jsonl");
  if (path.empty()) return;
  absl::StatusOr<Trace> trace = read_trace(path);
  REQUIRE(trace.ok());
  SimOptions o = quick_options();
  o.quick_requests = 200;  // two runs: keep the sanitizer build quick
  o.block_sizes = {16};
  o.contiguous_oracle = false;
  o.budget_gib = 8;  // forces evictions
  absl::StatusOr<TraceRun> device_only = run_trace(*trace, TraceKind::kMooncake, o);
  o.host_cache_gib = 48;
  absl::StatusOr<TraceRun> tiered = run_trace(*trace, TraceKind::kMooncake, o);
  REQUIRE(device_only.ok());
  REQUIRE(tiered.ok());
  const EngineResult& a = find_result(*device_only, "paged+prefix/16");
  const EngineResult& b = find_result(*tiered, "paged+prefix/16");
  INFO("hit rate " << a.prefix_hit_rate() << " -> " << b.prefix_hit_rate() << " (host "
                   << b.prefix_host_hit_tokens << " tokens)");
  CHECK(a.completed == b.completed);
  CHECK(a.evictions > 0);
  CHECK(b.prefix_host_hit_tokens > 0);
  CHECK(b.blocks_promoted * 16 == b.prefix_host_hit_tokens);
  CHECK(b.prefix_hit_rate() > a.prefix_hit_rate());
  // Only paged+prefix has a host tier.
  CHECK(find_result(*tiered, "paged/16").blocks_demoted == 0);
}

TEST_CASE("quick run on the generated workload: prefix caching multiplies concurrency",
          "[simulator]") {
  if (pagedkv::testing::skipped_under_expensive_checks()) return;
  SimOptions o = quick_options();
  o.traces.clear();
  o.synthetic = true;
  o.engine.check_invariants = true;  // KvCacheManager::check_invariants() after every step
  absl::StatusOr<SimReport> report = run_simulation(o);
  REQUIRE(report.ok());
  REQUIRE(report->runs.size() == 1);
  const TraceRun& run = report->runs[0];
  CHECK(run.trace == "generated");
  const EngineResult& paged = find_result(run, "paged/16");
  const EngineResult& prefix = find_result(run, "paged+prefix/16");
  CHECK(prefix.completed == 400);
  CHECK(prefix.prefix_hit_rate() > 0.5);  // 80% of prompts start with a 1,024-token system prompt
  CHECK(prefix.peak_concurrency > paged.peak_concurrency);
  CHECK(prefix.throughput_rps > paged.throughput_rps);
  CHECK(paged.cow_copies > 0);  // beams fork mid-block
  // The JSON and the SVG carry every allocator.
  const std::string json = to_json(*report);
  const std::string svg = to_svg(*report);
  CHECK(json.find("\"name\": \"paged+prefix/32\"") != std::string::npos);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(svg.find("contiguous-max") != std::string::npos);
}

// --- cluster mode (cluster.h) -------------------------------------------------------------

// A request whose whole prompt is shared prompt `prompt_id`: equal ids give equal tokens.
Request prompt_request(double arrival_s, int32_t prompt_id, int32_t length, int32_t output) {
  Request r = make_request(length, output);
  r.arrival_s = arrival_s;
  r.system_prompt_id = prompt_id;
  r.system_prompt_length = length;
  return r;
}

// paged+prefix engines of 16-token blocks with `budget_tokens` of device KV each.
AllocatorSetup cluster_engine(int64_t budget_tokens) {
  AllocatorSetup setup;
  setup.config = {.kind = AllocatorKind::kPagedPrefix, .block_size = 16};
  setup.budget_tokens = budget_tokens;
  setup.max_model_len = 128;
  setup.watermark_fraction = 0;
  return setup;
}

EngineOptions checked_engine() {
  EngineOptions engine;
  engine.check_invariants = true;
  return engine;
}

ClusterResult run_checked_cluster(const Trace& trace, const AllocatorSetup& setup,
                                  const ClusterOptions& options) {
  absl::StatusOr<ClusterResult> r = run_cluster(trace, setup, checked_engine(), options);
  REQUIRE(r.ok());
  CHECK(r->completed == r->requests);
  CHECK(r->device_hit_tokens + r->host_hit_tokens + r->shared_hit_tokens + r->recomputed_tokens ==
        r->prompt_tokens);
  return *std::move(r);
}

TEST_CASE(
    "shared tier: LRU over block hashes, written once at the step's end, prefixes read "
    "in order",
    "[simulator][cluster]") {
  const BlockHash h1{1, 0}, h2{2, 0}, h3{3, 0};
  SharedTier tier(2);
  tier.stage(std::vector{h1, h2});
  CHECK(tier.read_prefix(std::vector{h1}, 10.0) == 0);  // staged, not written yet
  tier.publish(1.0);
  CHECK(tier.read_prefix(std::vector{h1}, 0.5) == 0);  // written at 1 s, not readable before
  tier.stage(std::vector{h1});  // held already: not written again, keeps its place
  tier.stage(std::vector{h3});
  tier.publish(2.0);  // h3 evicts h1, the least recent
  CHECK(tier.size() == 2);
  CHECK(tier.blocks_written() == 3);
  CHECK(tier.blocks_evicted() == 1);
  CHECK(tier.read_prefix(std::vector{h1, h2}, 2.0) == 0);  // stops at the missing h1
  CHECK(tier.read_prefix(std::vector{h2, h3}, 2.0) == 2);  // h2, then h3, most recent
  tier.stage(std::vector{h1});
  tier.publish(3.0);  // evicts h2
  CHECK(tier.read_prefix(std::vector{h3, h1}, 3.0) == 2);
  CHECK(tier.read_prefix(std::vector{h2}, 3.0) == 0);
}

TEST_CASE("cluster: round robin recomputes a repeated prompt, KV-aware routes it to its cache",
          "[simulator][cluster]") {
  // Two engines, the same 64-token prompt at t = 0 and t = 1 s (the first is done by then).
  // Round robin sends the second to the other engine, which computes it again; the KV-aware
  // router sees the first engine's BlockStored events and sends it there, where it hits
  // every full block before its last token.
  Trace t;
  t.name = "repeat";
  t.requests = {prompt_request(0, 0, 64, 2), prompt_request(1, 0, 64, 2)};
  const int64_t hit = (64 - 1) / 16 * 16;
  ClusterOptions options{.num_engines = 2, .router = RouterKind::kRoundRobin};
  const ClusterResult rr = run_checked_cluster(t, cluster_engine(256), options);
  CHECK(rr.requests_per_engine == std::vector<int64_t>{1, 1});
  CHECK(rr.prompt_tokens == 128);
  CHECK(rr.device_hit_tokens == 0);
  CHECK(rr.recomputed_tokens == 128);
  CHECK(rr.routed_cached_tokens == 0);
  options.router = RouterKind::kKvAware;
  const ClusterResult kv = run_checked_cluster(t, cluster_engine(256), options);
  CHECK(kv.requests_per_engine == std::vector<int64_t>{2, 0});
  CHECK(kv.device_hit_tokens == hit);
  CHECK(kv.routed_cached_tokens == hit);  // the index saw exactly what the engine hit
  CHECK(kv.recomputed_tokens == 128 - hit);
  CHECK(kv.throughput_rps > rr.throughput_rps);  // the second prefill is shorter
}

TEST_CASE("cluster: KV-aware spreads requests that arrive before anything is cached",
          "[simulator][cluster]") {
  // The same prompt twice at t = 0: the first engine has nothing cached yet but the first
  // request queued (cost 4 new + 4 active + 4 queued blocks against 4), so the second goes
  // to the other engine.
  Trace t;
  t.name = "together";
  t.requests = {prompt_request(0, 0, 64, 2), prompt_request(0, 0, 64, 2)};
  const ClusterResult kv = run_checked_cluster(t, cluster_engine(256),
                                               {.num_engines = 2, .router = RouterKind::kKvAware});
  CHECK(kv.requests_per_engine == std::vector<int64_t>{1, 1});
  CHECK(kv.device_hit_tokens == 0);
}

TEST_CASE(
    "cluster: the shared tier turns the second engine's miss into a hit, and its "
    "bandwidth changes time, not hits",
    "[simulator][cluster]") {
  // Round robin over two engines, the same 64-token prompt at t = 0 and t = 1 s: the first
  // engine computes it and writes its 4 full blocks to the tier; the second misses on its
  // device and reads the full blocks before the last token from the tier instead.
  Trace t;
  t.name = "repeat";
  t.requests = {prompt_request(0, 0, 64, 2), prompt_request(1, 0, 64, 2)};
  const int64_t read = (64 - 1) / 16 * 16;
  ClusterOptions options{.num_engines = 2,
                         .router = RouterKind::kRoundRobin,
                         .shared_tier_blocks = 100,
                         .shared_tier_bytes_per_s = 25e9};
  const ClusterResult fast = run_checked_cluster(t, cluster_engine(256), options);
  CHECK(fast.requests_per_engine == std::vector<int64_t>{1, 1});
  CHECK(fast.device_hit_tokens == 0);
  CHECK(fast.shared_hit_tokens == read);
  CHECK(fast.recomputed_tokens == 128 - read);
  CHECK(fast.shared_blocks_written == 4);  // the second engine's blocks are held already
  const double bytes = static_cast<double>(read * checked_engine().kv_bytes_per_token);
  CHECK(fast.shared_read_time_s == Approx(bytes / 25e9));

  options.shared_tier_bytes_per_s = 2.5e9;
  const ClusterResult slow = run_checked_cluster(t, cluster_engine(256), options);
  CHECK(slow.shared_hit_tokens == fast.shared_hit_tokens);
  CHECK(slow.recomputed_tokens == fast.recomputed_tokens);
  CHECK(slow.shared_read_time_s == Approx(bytes / 2.5e9));
  // Only the second request's prefill step reads, so only it finishes later, by the
  // difference.
  CHECK(slow.mean_latency_s - fast.mean_latency_s ==
        Approx((slow.shared_read_time_s - fast.shared_read_time_s) / 2));
}

TEST_CASE("cluster: bad options are refused with the value and the limit", "[simulator][cluster]") {
  Trace t;
  t.name = "one";
  t.requests = {prompt_request(0, 0, 64, 2)};
  absl::StatusOr<ClusterResult> r =
      run_cluster(t, cluster_engine(256), EngineOptions{}, {.num_engines = 0});
  REQUIRE(absl::IsInvalidArgument(r.status()));
  CHECK(std::string(r.status().message()).find("0 engines; need 1 to 1024") != std::string::npos);
  AllocatorSetup paged = cluster_engine(256);
  paged.config.kind = AllocatorKind::kPaged;
  r = run_cluster(t, paged, EngineOptions{}, {});
  REQUIRE(absl::IsInvalidArgument(r.status()));
  CHECK(std::string(r.status().message()).find("paged+prefix") != std::string::npos);
  absl::StatusOr<RouterKind> router = parse_router("random");
  REQUIRE(absl::IsInvalidArgument(router.status()));
  CHECK(std::string(router.status().message()) ==
        "router 'random': must be round-robin or kv-aware");
}

TEST_CASE("cluster: four engines on the first 400 Mooncake requests", "[simulator][cluster]") {
  const std::string path = trace_path("synthetic_trace.jsonl");
  if (path.empty()) return;
  SimOptions o = quick_options();
  o.traces = {path};
  std::vector<ClusterResult> rows;
  for (const ClusterOptions& cluster :
       {ClusterOptions{.router = RouterKind::kRoundRobin},
        ClusterOptions{.router = RouterKind::kKvAware},
        ClusterOptions{.router = RouterKind::kKvAware, .shared_tier_blocks = 1 << 17}}) {
    o.cluster = cluster;
    absl::StatusOr<SimReport> report = run_simulation(o);
    REQUIRE(report.ok());
    REQUIRE(report->clusters.size() == 1);
    REQUIRE(report->runs.empty());
    rows.push_back(report->clusters[0]);
    const ClusterResult& r = rows.back();
    CHECK(r.completed == 400);
    CHECK(r.requests_per_engine.size() == 4);
    CHECK(r.recomputed_tokens > 0);
    CHECK(to_json(*report).find("\"clusters\"") != std::string::npos);
  }
  INFO(format_cluster_table(rows));
  // This trace's multi-turn conversations come back to the engine that holds them.
  CHECK(rows[1].device_hit_tokens > rows[0].device_hit_tokens);
  CHECK(rows[2].shared_hit_tokens > 0);
  CHECK(rows[2].recomputed_tokens < rows[1].recomputed_tokens);
}
}  // namespace
}  // namespace pagedkv::sim
