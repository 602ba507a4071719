// Tests of KvCacheManager::Options::shared_block_pool: the layer groups of a hybrid model
// draw from one device pool (vLLM's hybrid layout). One id space (no block in two groups'
// tables), one eviction order, a prefix index keyed by (hash, group), and a step that fits
// when the pool has the blocks of all groups together. A fresh pool hands out its clean
// blocks in id order, and groups take their blocks in group order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"

#include "pagedkv/kv_cache_manager.h"
#include "support/manager_test_util.h"

namespace pagedkv {
namespace {

using namespace pagedkv::testing;  // NOLINT: the shared test helpers

constexpr int32_t kFull = 0;  // group indices of the managers below
constexpr int32_t kWindow = 1;

// A full-attention group and a sliding window of 6 tokens sharing `num_blocks` blocks of 4
// tokens.
KvCacheManager::Options shared_options(int32_t num_blocks, KvEventSink* sink = nullptr) {
  return {.block_size = 4,
          .window_eviction_classes = false,
          .event_sink = sink,
          .layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = num_blocks},
                           {.kind = AttentionKind::kSlidingWindow,
                            .window = 6,
                            .num_blocks = num_blocks}},
          .shared_block_pool = true};
}

// Computes all of `prompt` as sequence `seq` in one step, then frees it: its full blocks
// stay cached, freed group by group, each tail first.
void compute_and_free(KvCacheManager& m, SeqId seq, const std::vector<TokenId>& prompt,
                      SequenceOptions options = {}) {
  admit(m, seq, prompt, std::move(options));
  allocate(m, seq, static_cast<int32_t>(prompt.size()));
  end_step(m);
  REQUIRE(m.free(seq).ok());
}

// `prompt` and three more tokens: a prompt whose hit may cover all of `prompt`'s blocks.
std::vector<TokenId> continued(std::vector<TokenId> prompt) {
  prompt.insert(prompt.end(), {7, 7, 7});
  return prompt;
}

// The group each event of type `Event` in `log` names, in order.
template <typename Event>
std::vector<int32_t> event_groups(const EventLog& log) {
  std::vector<int32_t> groups;
  for (const KvEvent& e : log.events) {
    if (const auto* event = std::get_if<Event>(&e)) {
      REQUIRE(event->group.has_value());
      groups.push_back(event->group->index);
    }
  }
  return groups;
}

TEST_CASE("a shared pool is refused where a pool per group is needed, naming the value",
          "[shared_pool]") {
  const auto refused = [](KvCacheManager::Options options, const std::string& fragment) {
    require_error(KvCacheManager::create(std::move(options)).status(),
                  absl::StatusCode::kInvalidArgument, "shared_block_pool: " + fragment);
  };
  KvCacheManager::Options unequal = shared_options(8);
  unequal.layer_groups[1].num_blocks = 6;
  refused(unequal, "layer_groups[1].num_blocks 6 != 8 of layer_groups[0]");
  KvCacheManager::Options host = shared_options(8);
  host.layer_groups[1].num_host_blocks = 4;
  refused(host, "layer_groups[1].num_host_blocks 4 must be 0");
  KvCacheManager::Options tier = shared_options(8);
  tier.enable_host_cache = true;
  refused(tier, "enable_host_cache is not supported");
  KvCacheManager::Options state = shared_options(8);
  state.layer_groups[1] = {.kind = AttentionKind::kState, .num_blocks = 8};
  refused(state, "layer_groups[1] is a state group");
  KvCacheManager::Options adaptive = shared_options(8);
  adaptive.eviction_policy = EvictionPolicy::kAdaptive;
  refused(adaptive, "eviction_policy must be kLru");
  KvCacheManager::Options partial = shared_options(8);
  partial.enable_partial_block_reuse = true;
  refused(partial, "enable_partial_block_reuse is not supported");
}

TEST_CASE("groups of a shared pool take distinct blocks of one pool", "[shared_pool]") {
  KvCacheManager m = make_manager(shared_options(16));
  CHECK(*m.device_pool(kFull) == *m.device_pool(kWindow));
  admit(m, 1, iota_tokens(14));
  // 14 tokens: 4 blocks in each group, the full group's first.
  CHECK(allocate(m, 1, 14) == Slots{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
  CHECK(table(m, 1, kFull) == Blocks{0, 1, 2, 3});
  CHECK(table(m, 1, kWindow) == Blocks{4, 5, 6, 7});
  CHECK(slots_of(m, kWindow).front() == 16);
  CHECK(m.stats().used_blocks == 8);
  CHECK(m.group_stats(kWindow)->used_blocks == 8);  // the same pool
  end_step(m);
  // Token 15 attends to [10, 15]: the window's entries 0 and 1 go back to the pool.
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{200}).ok());
  allocate(m, 1, 1);
  end_step(m);
  allocate(m, 1, 0);
  CHECK(table(m, 1, kWindow) == Blocks{kNoBlock, kNoBlock, 6, 7});
  CHECK(m.stats().used_blocks == 6);
  require_valid(m);
}

TEST_CASE("a step of a shared pool fits when the pool has every group's blocks together",
          "[shared_pool]") {
  KvCacheManager m = make_manager(shared_options(10));
  admit(m, 9, iota_tokens(4, 900));
  allocate(m, 9, 4);  // blocks 0 and 1: one per group
  admit(m, 1, iota_tokens(16));
  // 4 blocks in each group: the 8 free blocks, exactly.
  CHECK(allocate(m, 1, 16).size() == 16);
  end_step(m);
  REQUIRE(m.free(1).ok());
  admit(m, 2, iota_tokens(20, 500));
  const Blocks queue = m.device_pool(kFull).value()->free_queue_order();
  require_error(m.allocate_slots(2, 20).status(), absl::StatusCode::kResourceExhausted,
                "need 10 blocks (by group 0: 5, 1: 5), 8 free of 10 in the pool all groups share");
  CHECK(m.device_pool(kFull).value()->free_queue_order() == queue);
  CHECK(table(m, 2, kFull).empty());
  // What could never fit the pool, even alone, is refused as such.
  require_error(m.allocate_slots(2, 20, 8).status(), absl::StatusCode::kInvalidArgument,
                "28 slots need 14 blocks in all groups together; the shared pool has 10");
  REQUIRE(m.free(2).ok());
  require_error(m.add_sequence(3, iota_tokens(33)), absl::StatusCode::kInvalidArgument,
                "needs 12 blocks of 4 tokens in all groups together; the shared pool has 10");
  require_valid(m);
}

TEST_CASE("a shared pool counts the window's releases of a step in its fit", "[shared_pool]") {
  // 7 blocks: after 12 tokens, 3 in each group and one free.
  KvCacheManager m = make_manager(shared_options(7));
  admit(m, 1, iota_tokens(16));
  allocate(m, 1, 12);
  end_step(m);
  CHECK(m.stats().free_blocks == 1);
  // Tokens 12-15 need a block in each group, 2 of 1 free; the window's entry 0 (block 3:
  // token 12 attends from token 7) goes back first, so the step fits. Releases come before
  // any group's allocation: the full group takes the clean block 6 at the queue's head,
  // the window the cached block 3 behind it.
  CHECK(allocate(m, 1, 4) == Slots{24, 25, 26, 27});
  CHECK(table(m, 1, kFull) == Blocks{0, 1, 2, 6});
  CHECK(slots_of(m, kWindow) == Slots{12, 13, 14, 15});
  CHECK(table(m, 1, kWindow) == Blocks{kNoBlock, 4, 5, 3});
  require_valid(m);
}

TEST_CASE("the same hash in two groups of a shared pool names two blocks", "[shared_pool]") {
  KvCacheManager m = make_manager(shared_options(16));
  compute_and_free(m, 1, iota_tokens(16));
  admit(m, 2, continued(iota_tokens(16)));
  // Each group hits its own copies: token 16 attends to [11, 16], the window's entries 2
  // and 3 (blocks 6 and 7), the full group's all four (blocks 0 to 3).
  CHECK(*m.match_prefix(2) == 16);
  CHECK(table(m, 2, kFull) == Blocks{0, 1, 2, 3});
  CHECK(table(m, 2, kWindow) == Blocks{kNoBlock, kNoBlock, 6, 7});
  require_valid(m);
}

TEST_CASE("groups of a shared pool evict each other's cached blocks in one LRU order",
          "[shared_pool]") {
  EventLog log;
  KvCacheManager m = make_manager(shared_options(8, &log));
  compute_and_free(m, 1, iota_tokens(16));  // full 0-3, window 4-7
  // Freed group by group, each tail first: the full group's, then the window's.
  CHECK(m.device_pool(kFull).value()->free_queue_order() == Blocks{3, 2, 1, 0, 7, 6, 5, 4});
  log.events.clear();
  // A new prompt of 8 tokens takes 2 blocks per group from the head: the full group's
  // cached 3 and 2, then 1 and 0 for the window.
  admit(m, 2, iota_tokens(8, 500));
  allocate(m, 2, 8);
  CHECK(table(m, 2, kFull) == Blocks{3, 2});
  CHECK(table(m, 2, kWindow) == Blocks{1, 0});
  // Each removal names the group whose block it was: the four evicted full blocks. The
  // window's blocks cached after them stay cached, in their place in the LRU order, as
  // vLLM's do: they verify again once the contents before them are computed again.
  CHECK(event_groups<BlockRemoved>(log) == std::vector<int32_t>{kFull, kFull, kFull, kFull});
  CHECK(m.device_pool(kFull).value()->free_queue_order() == Blocks{7, 6, 5, 4});
  require_valid(m);
}

TEST_CASE("blocks cached after evicted contents verify again once those are computed again",
          "[shared_pool]") {
  KvCacheManager m = make_manager(shared_options(12));
  // Entries 1 to 3 of the prompt are kept longer (retention), entry 0 is not.
  const std::vector<TokenId> prompt = iota_tokens(16);
  // Full 0-3, window 4-7.
  compute_and_free(m, 1, prompt, {.retention = {{.begin = 4, .end = 16, .priority = 60}}});
  // 12 other tokens take the 4 clean blocks and evict entry 0 of each group (blocks 0, 4);
  // freed, they go to the default class, evicted before the retained entries.
  admit(m, 2, iota_tokens(12, 500));
  allocate(m, 2, 12);
  CHECK(table(m, 2, kWindow) == Blocks{11, 0, 4});
  end_step(m);
  REQUIRE(m.free(2).ok());
  // Entry 0 computed again (block 10): it takes back the content key of the evicted
  // block 0, so the cached full blocks 1 to 3 and window blocks 5 to 7 follow it again.
  std::vector<TokenId> first = iota_tokens(4);
  first.push_back(7);
  admit(m, 3, first);
  CHECK(*m.match_prefix(3) == 0);
  allocate(m, 3, 5);
  CHECK(table(m, 3, kFull) == Blocks{10, 9});
  end_step(m);
  admit(m, 4, continued(prompt));
  // Without the key taken back the full chain would end after entry 0: a hit of 4.
  CHECK(*m.match_prefix(4) == 16);
  CHECK(table(m, 4, kFull) == Blocks{10, 1, 2, 3});
  CHECK(table(m, 4, kWindow) == Blocks{kNoBlock, kNoBlock, 6, 7});
  require_valid(m);
}

TEST_CASE("a chain of evicted contents revives block by block when computed again",
          "[shared_pool]") {
  KvCacheManager m = make_manager(shared_options(12));
  const std::vector<TokenId> prompt = iota_tokens(16);
  // Full 0-3, window 4-7; entries 2 and 3 kept longer.
  compute_and_free(m, 1, prompt, {.retention = {{.begin = 8, .end = 16, .priority = 60}}});
  // 16 other tokens take the 4 clean blocks and evict, in this order, full entries 1 and 0
  // and window entries 1 and 0. Entry 1's contents are remembered for the cached full
  // entry 2 after them; entry 0's for entry 1's remembered contents, after window
  // entry 1 left too.
  admit(m, 2, iota_tokens(16, 500));
  allocate(m, 2, 16);
  CHECK(table(m, 2, kWindow) == Blocks{1, 0, 5, 4});
  end_step(m);
  REQUIRE(m.free(2).ok());
  // Entries 0 and 1 computed again take back both content keys, in chain order.
  std::vector<TokenId> first = iota_tokens(8);
  first.push_back(7);
  admit(m, 3, first);
  allocate(m, 3, 9);
  end_step(m);
  admit(m, 4, continued(prompt));
  CHECK(*m.match_prefix(4) == 16);
  CHECK(table(m, 4, kFull)[2] == 2);
  CHECK(table(m, 4, kWindow) == Blocks{kNoBlock, kNoBlock, 6, 7});
  require_valid(m);
}

TEST_CASE("a shared pool announces each group's blocks under its group, reset once",
          "[shared_pool]") {
  EventLog log;
  KvCacheManager m = make_manager(shared_options(16, &log));
  admit(m, 1, iota_tokens(8));
  allocate(m, 1, 8);
  CHECK(event_groups<BlockStored>(log) == std::vector<int32_t>{kFull, kWindow});
  end_step(m);
  REQUIRE(m.free(1).ok());
  log.events.clear();
  m.reset_prefix_cache();
  REQUIRE(log.events.size() == 1);
  CHECK(std::holds_alternative<AllBlocksCleared>(log.events[0]));
  CHECK(m.stats().cached_free_blocks == 0);
  require_valid(m);
}

// What a refused call must leave as it was: the pool's counts and order, and every
// sequence's tables and computed tokens.
std::string fingerprint(const KvCacheManager& m, const std::vector<SeqId>& seqs) {
  const BlockPool& pool = **m.device_pool(0);
  std::string out = absl::StrCat(pool.num_free_blocks(), "|", m.stats().cached_free_blocks, "|");
  for (const BlockId b : pool.free_queue_order()) absl::StrAppend(&out, b, ",");
  for (const SeqId id : seqs) {
    for (int32_t g = 0; g < m.num_groups(); ++g) {
      const SequenceView v = *m.sequence(id, g);
      absl::StrAppend(&out, "|", id, ":", v.num_computed_tokens, ":", v.block_table.size(), ":");
      for (const BlockId b : v.block_table) absl::StrAppend(&out, b, ",");
    }
  }
  return out;
}

// Random steps (prompts from a few shared prefixes, prefills in chunks, decodes, frees,
// preemptions, forks, flushes) on shared pools of a few shapes, the anchor not always
// group 0: after each call every invariant holds (one group per block, ref counts the
// tables' holds across groups), and a refused call changes nothing.
TEST_CASE("random steps on a shared pool keep every invariant", "[shared_pool]") {
  const uint64_t seed = 20261207;
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t n) { return static_cast<int32_t>(rng() % static_cast<uint64_t>(n)); };
  int64_t steps = 0;
  int64_t exhausted = 0;
  for (int run = 0; run < 60; ++run) {
    INFO("seed " << seed << " run " << run);
    const int32_t num_blocks = 12 + pick(20);
    const LayerGroup full{.kind = AttentionKind::kFull, .num_blocks = num_blocks};
    const LayerGroup window{
        .kind = pick(2) == 0 ? AttentionKind::kSlidingWindow : AttentionKind::kChunkedLocal,
        .window = 2 + pick(10),
        .num_blocks = num_blocks};
    KvCacheManager::Options options{
        .block_size = 4, .window_eviction_classes = pick(2) == 0, .watermark_blocks = pick(3)};
    switch (pick(3)) {
      case 0:
        options.layer_groups = {full, window};
        break;
      case 1:
        options.layer_groups = {window, full};
        break;
      default:
        options.layer_groups = {full, window, full};
        break;
    }
    options.shared_block_pool = true;
    KvCacheManager m = make_manager(options);
    std::vector<SeqId> seqs;
    SeqId next = 1;
    for (int op = 0; op < 150; ++op, ++steps) {
      const int32_t kind = pick(9);
      const std::string before = fingerprint(m, seqs);
      absl::Status status;
      bool preempts = false;  // allocate_slots_or_preempt(): its preemptions stay made
      if (kind == 0 || seqs.empty()) {
        std::vector<TokenId> prompt = iota_tokens(4 * pick(4), 1000 * (1 + pick(3)));
        for (int32_t i = 1 + pick(10); i > 0; --i) prompt.push_back(pick(50));
        status = m.add_sequence(next, prompt);
        if (status.ok()) {
          seqs.push_back(next);
          if (pick(2) == 0) status = m.match_prefix(next).status();
        }
        ++next;
      } else {
        const SeqId id = seqs[pick(std::ssize(seqs))];
        const SequenceView v = *m.sequence(id);
        const auto left = static_cast<int32_t>(v.tokens.size()) - v.num_computed_tokens;
        switch (kind) {
          case 1:
          case 2:
          case 3:
            if (left == 0) status = m.append_tokens(id, std::vector<TokenId>{pick(50)});
            if (status.ok()) {
              const int32_t n = 1 + pick(std::max(left, 1));
              preempts = kind == 3;
              status = kind == 3 ? m.allocate_slots_or_preempt(id, n, pick(3)).status()
                                 : m.allocate_slots(id, n, pick(2)).status();
            }
            break;
          case 4:
            status = m.free(id);
            if (status.ok()) seqs.erase(std::find(seqs.begin(), seqs.end(), id));
            break;
          case 5:
            status = m.preempt(id, PreemptionMode::kRecompute);
            break;
          case 6:
            status = m.fork(id, next);
            if (status.ok()) seqs.push_back(next);
            ++next;
            break;
          case 7:
            (void)m.take_step_ops();
            break;
          default:
            if (pick(8) == 0) m.reset_prefix_cache();
            break;
        }
      }
      const absl::Status valid = m.check_invariants();
      INFO("op " << op << " kind " << kind << ": " << status << "; " << valid);
      REQUIRE(valid.ok());
      if (status.code() == absl::StatusCode::kResourceExhausted) {
        ++exhausted;
        if (!preempts) REQUIRE(fingerprint(m, seqs) == before);
      }
    }
  }
  // The pools were tight: refusals for want of blocks happened.
  CHECK(exhausted > 0);
  CHECK(steps == 60 * 150);
}

}  // namespace
}  // namespace pagedkv
