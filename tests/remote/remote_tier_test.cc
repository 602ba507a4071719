// RemoteTier: engines (a KvCacheManager each, with a byte array as its KV storage)
// sharing blocks through a directory store or a store whose completions the test
// releases by hand: loads equal what the reader would have computed, corrupt values are
// misses, the wait policies, the write policies.
#include "pagedkv/remote_tier.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <deque>
#include <thread>

#include "events/temp_dir.h"
#include "pagedkv/directory_kv_store.h"
#include "pagedkv/remote_namespace.h"
#include "remote/store_test_util.h"

namespace pagedkv {
namespace {

constexpr int32_t kBlockSize = 4;
constexpr int64_t kPayloadBytes = 64;

const std::string& digest() {
  static const std::string d = remote_namespace_digest({.model_id = "remote-tier-test"});
  return d;
}

// What computing block `index` of a prompt writes: depends on the prompt up to its end,
// so that a block loaded for another prompt differs.
std::string computed_payload(std::span<const TokenId> prompt, int32_t index) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t i = 0; i < (index + 1) * kBlockSize; ++i) h = (h ^ prompt[i]) * 1099511628211ull;
  std::string payload(kPayloadBytes, '\0');
  for (int64_t i = 0; i < kPayloadBytes; ++i) payload[i] = static_cast<char>((h >> (i % 56)) + i);
  return payload;
}

std::vector<TokenId> prompt_of(int32_t shared_tokens, int32_t own_tokens, TokenId own_base) {
  std::vector<TokenId> prompt;
  for (int32_t i = 0; i < shared_tokens; ++i) prompt.push_back(1000 + i);
  for (int32_t i = 0; i < own_tokens; ++i) prompt.push_back(own_base + i);
  return prompt;
}

// One engine: a manager whose events feed the tier, and its blocks' bytes.
struct Engine {
  std::unique_ptr<RemoteTier> tier;
  std::unique_ptr<KvCacheManager> manager;
  std::vector<std::string> blocks = std::vector<std::string>(32, std::string(kPayloadBytes, '?'));

  Engine(RemoteKvStore& store, RemoteTierOptions options) {
    options.namespace_digest = digest();
    options.payload_bytes = kPayloadBytes;
    auto t = RemoteTier::create(&store, options);
    REQUIRE(t.ok());
    tier = *std::move(t);
    auto m = KvCacheManager::create(
        {.block_size = kBlockSize, .event_sink = tier.get(), .layer_groups = full_attention(32)});
    REQUIRE(m.ok());
    manager = std::make_unique<KvCacheManager>(*std::move(m));
  }

  RemoteTier::WriteBlock write() {
    return [this](BlockId b, std::span<const std::byte> in) {
      blocks[b].assign(reinterpret_cast<const char*>(in.data()), in.size());
      return absl::OkStatus();
    };
  }
  RemoteTier::ReadBlock read() {
    return [this](BlockId b, std::span<std::byte> out) {
      std::memcpy(out.data(), blocks[b].data(), out.size());
      return absl::OkStatus();
    };
  }

  void poll_until_ready(SeqId seq) {
    for (int i = 0; i < 10000 && !tier->ready(seq); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      tier->poll();
    }
    REQUIRE(tier->ready(seq));
  }

  // Admits `seq` as a scheduler would: lookup, local claim, remote load, the rest
  // computed; runs the step's loads and writes. Returns the tokens loaded.
  int32_t admit_and_compute(SeqId seq, const std::vector<TokenId>& prompt) {
    REQUIRE(manager->add_sequence(seq, prompt).ok());
    REQUIRE(tier->start_lookup(seq, prompt, {}, *manager).ok());
    poll_until_ready(seq);
    const absl::StatusOr<int32_t> claimed = manager->match_prefix(seq);
    REQUIRE(claimed.ok());
    const int32_t loadable = tier->loadable_tokens(seq, *claimed);
    const int32_t first_new = *claimed + loadable;
    const auto rest = static_cast<int32_t>(prompt.size()) - first_new;
    const absl::StatusOr<std::span<const int64_t>> slots =
        manager->allocate_slots(seq, loadable + rest);
    REQUIRE(slots.ok());
    const absl::StatusOr<int32_t> loaded = tier->load(seq, *claimed, *slots);
    REQUIRE(loaded.ok());
    REQUIRE(*loaded == loadable);
    const std::vector<int64_t> new_slots(slots->begin() + loadable, slots->end());
    (void)manager->take_step_ops();
    REQUIRE(tier->run_loads(write()).ok());
    // Compute: the blocks that the new tokens fill.
    for (int32_t t = first_new; t < std::ssize(prompt); ++t) {
      if ((t + 1) % kBlockSize == 0) {
        blocks[new_slots[t - first_new] / kBlockSize] = computed_payload(prompt, t / kBlockSize);
      }
    }
    REQUIRE(tier->write_computed(*manager, read()).ok());
    REQUIRE(manager->check_invariants().ok());
    return *loaded;
  }

  // The bytes of the sequence's i-th block.
  const std::string& block_of(SeqId seq, int32_t i) {
    BlockTables tables;
    REQUIRE(manager->build_block_tables({&seq, 1}, &tables).ok());
    return blocks[tables.block_table[i]];
  }

  void wait_written(int64_t blocks_written) {
    for (int i = 0; i < 10000 && tier->stats().written_blocks < blocks_written; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      tier->poll();
    }
    REQUIRE(tier->stats().written_blocks == blocks_written);
  }
};

std::unique_ptr<RemoteKvStore> directory_store(const std::string& path) {
  auto store = create_directory_kv_store({.directory = path});
  REQUIRE(store.ok());
  return *std::move(store);
}

TEST_CASE("remote tier: a second engine loads the first one's blocks, exactly", "[remote][tier]") {
  testing::TempDir dir;
  auto store_a = directory_store(dir.path());
  auto store_b = directory_store(dir.path());  // another process on the same directory
  Engine a(*store_a, {.wait_policy = RemoteWaitPolicy::kWaitComplete});
  Engine b(*store_b, {.wait_policy = RemoteWaitPolicy::kWaitComplete});

  const std::vector<TokenId> first = prompt_of(16, 2, 1);  // 4 shared full blocks, then 2 tokens
  REQUIRE(a.admit_and_compute(1, first) == 0);
  CHECK(a.tier->stats().missing_blocks == 4);
  a.wait_written(4);

  // 16 shared tokens, 5 of its own: blocks 0-3 load, block 4 is computed and written.
  const std::vector<TokenId> second = prompt_of(16, 5, 500);
  REQUIRE(b.admit_and_compute(7, second) == 16);
  for (int32_t i = 0; i < 4; ++i) CHECK(b.block_of(7, i) == computed_payload(second, i));
  const RemoteTierStats s = b.tier->stats();
  CHECK(s.lookups == 1);
  CHECK(s.lookup_blocks == 5);
  CHECK(s.found_blocks == 4);
  CHECK(s.missing_blocks == 1);
  CHECK(s.loaded_blocks == 4);
  CHECK(s.loaded_tokens == 16);
  b.wait_written(1);  // its own block only: the loaded ones are in the store already
  CHECK(b.manager->stats().prefix_hit_tokens == 0);

  // A third prompt sharing 8 tokens: 2 blocks load, the rest is computed.
  Engine c(*store_b, {.wait_policy = RemoteWaitPolicy::kWaitComplete});
  const std::vector<TokenId> third = prompt_of(8, 9, 900);
  REQUIRE(c.admit_and_compute(3, third) == 8);
  CHECK(c.block_of(3, 1) == computed_payload(third, 1));
}

TEST_CASE("remote tier: a corrupt value is a counted miss, and the blocks before it load",
          "[remote][tier]") {
  testing::TempDir dir;
  auto store = directory_store(dir.path());
  Engine a(*store, {.wait_policy = RemoteWaitPolicy::kWaitComplete});
  const std::vector<TokenId> prompt = prompt_of(16, 1, 1);
  REQUIRE(a.admit_and_compute(1, prompt) == 0);
  a.wait_written(4);

  // Flip a payload byte of block 2's value.
  BlockHash hash;
  for (int32_t i = 0; i <= 2; ++i) {
    const BlockHash parent = hash;
    hash =
        hash_block(i == 0 ? nullptr : &parent,
                   std::span(prompt).subspan(static_cast<size_t>(i) * kBlockSize, kBlockSize), {});
  }
  testing::Poller poller(*store);
  const std::string key = remote_block_key(digest(), hash);
  const auto get = store->get({key});
  REQUIRE(get.ok());
  std::string value = poller.wait(*get).values.at(0);
  value.back() ^= 0x10;
  const auto put = store->put({key}, {value});
  REQUIRE(put.ok());
  REQUIRE(poller.wait(*put).results.at(0) == RemoteKeyResult::kOk);

  Engine b(*store, {.wait_policy = RemoteWaitPolicy::kWaitComplete});
  REQUIRE(b.admit_and_compute(2, prompt) == 8);
  CHECK(b.tier->stats().corrupt_blocks == 1);
  CHECK(b.tier->stats().found_blocks == 3);                // block 3 verifies, but follows a miss
  CHECK(b.block_of(2, 2) == computed_payload(prompt, 2));  // computed, not loaded
}

// A store that completes requests only when the test says so.
class HeldStore final : public RemoteKvStore {
 public:
  absl::StatusOr<RemoteRequestId> put(std::vector<std::string> keys,
                                      std::vector<std::string>) override {
    return hold(RemoteOp::kPut, keys.size());
  }
  absl::StatusOr<RemoteRequestId> get(std::vector<std::string> keys) override {
    return hold(RemoteOp::kGet, keys.size());
  }
  absl::StatusOr<RemoteRequestId> exists(std::vector<std::string> keys) override {
    return hold(RemoteOp::kExists, keys.size());
  }
  size_t poll(std::vector<RemoteCompletion>* out, size_t max_completions) override {
    size_t n = 0;
    for (; n < max_completions && !released_.empty(); ++n) {
      out->push_back(std::move(released_.front()));
      released_.pop_front();
    }
    return n;
  }
  RemoteKvStats stats() const override { return {}; }

  // Completes every held request: puts stored, gets and exists not found.
  void release_all() {
    for (RemoteCompletion& c : held_) {
      c.results.assign(c.results.size(),
                       c.op == RemoteOp::kPut ? RemoteKeyResult::kOk : RemoteKeyResult::kNotFound);
      if (c.op == RemoteOp::kGet) c.values.assign(c.results.size(), "");
      released_.push_back(std::move(c));
    }
    held_.clear();
  }
  size_t held() const { return held_.size(); }

 private:
  RemoteRequestId hold(RemoteOp op, size_t keys) {
    held_.push_back({.id = ++next_id_, .op = op, .results = std::vector<RemoteKeyResult>(keys)});
    return next_id_;
  }
  RemoteRequestId next_id_ = 0;
  std::vector<RemoteCompletion> held_;
  std::deque<RemoteCompletion> released_;
};

TEST_CASE("remote tier: the wait policies decide when a sequence with gets in flight is ready",
          "[remote][tier]") {
  HeldStore store;
  const std::vector<TokenId> prompt = prompt_of(40, 1, 1);  // 10 blocks: 2 gets of 8 and 2
  SECTION("wait complete: not before the last get completes") {
    Engine e(store, {.wait_policy = RemoteWaitPolicy::kWaitComplete});
    REQUIRE(e.manager->add_sequence(1, prompt).ok());
    REQUIRE(e.tier->start_lookup(1, prompt, {}, *e.manager).ok());
    CHECK(store.held() == 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    e.tier->poll();
    CHECK_FALSE(e.tier->ready(1));
    store.release_all();
    e.tier->poll();
    CHECK(e.tier->ready(1));
    CHECK(e.tier->stats().missing_blocks == 10);
  }
  SECTION("timeout: after timeout_ms with nothing; a late completion is ignored") {
    Engine e(store, {.wait_policy = RemoteWaitPolicy::kTimeout, .timeout_ms = 20});
    REQUIRE(e.manager->add_sequence(1, prompt).ok());
    REQUIRE(e.tier->start_lookup(1, prompt, {}, *e.manager).ok());
    CHECK_FALSE(e.tier->ready(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    CHECK(e.tier->ready(1));
    const absl::StatusOr<int32_t> claimed = e.manager->match_prefix(1);
    REQUIRE(claimed.ok());
    CHECK(e.tier->loadable_tokens(1, *claimed) == 0);
    const absl::StatusOr<int32_t> loaded = e.tier->load(1, *claimed, {});
    REQUIRE(loaded.ok());
    CHECK(*loaded == 0);
    CHECK(e.tier->stats().timed_out == 1);
    store.release_all();
    e.tier->poll();  // the gets of a finished lookup: ignored
    CHECK(e.tier->stats().missing_blocks == 0);
  }
  SECTION("best effort: at once") {
    Engine e(store, {.wait_policy = RemoteWaitPolicy::kBestEffort});
    REQUIRE(e.manager->add_sequence(1, prompt).ok());
    REQUIRE(e.tier->start_lookup(1, prompt, {}, *e.manager).ok());
    CHECK(e.tier->ready(1));
    e.tier->cancel(1);
    store.release_all();
    e.tier->poll();
    CHECK(e.tier->stats().missing_blocks == 0);
  }
}

TEST_CASE("remote tier: selective writes only blocks a lookup found as local hits",
          "[remote][tier]") {
  testing::TempDir dir;
  auto store = directory_store(dir.path());
  Engine e(*store, {.write_policy = RemoteWritePolicy::kSelective,
                    .wait_policy = RemoteWaitPolicy::kWaitComplete});
  const std::vector<TokenId> prompt = prompt_of(12, 3, 1);  // 3 full blocks, and 3 tokens
  REQUIRE(e.admit_and_compute(1, prompt) == 0);
  e.tier->poll();
  CHECK(e.tier->stats().written_blocks == 0);
  // Another sequence with the first 8 tokens: its lookup finds blocks 0 and 1 cached.
  const std::vector<TokenId> shorter = prompt_of(8, 1, 77);
  REQUIRE(e.manager->add_sequence(2, shorter).ok());
  REQUIRE(e.tier->start_lookup(2, shorter, {}, *e.manager).ok());
  REQUIRE(e.tier->write_computed(*e.manager, e.read()).ok());
  e.wait_written(2);
}

TEST_CASE("remote tier: bad options are refused with the value", "[remote][tier]") {
  HeldStore store;
  const auto refused = [&](RemoteTierOptions options, std::string_view what) {
    const auto tier = RemoteTier::create(&store, std::move(options));
    REQUIRE(absl::IsInvalidArgument(tier.status()));
    CHECK_THAT(std::string(tier.status().message()), Catch::Contains(std::string(what)));
  };
  refused({.namespace_digest = "ns", .payload_bytes = 64}, "namespace_digest 'ns'");
  refused({.namespace_digest = digest(), .payload_bytes = 0}, "payload_bytes 0");
  refused({.namespace_digest = digest(), .payload_bytes = 64, .timeout_ms = -1}, "timeout_ms -1");
  refused({.namespace_digest = digest(), .payload_bytes = 64, .blocks_per_get = 0},
          "blocks_per_get 0");
  CHECK(absl::IsInvalidArgument(
      RemoteTier::create(nullptr, {.namespace_digest = digest(), .payload_bytes = 64}).status()));
}

}  // namespace
}  // namespace pagedkv
