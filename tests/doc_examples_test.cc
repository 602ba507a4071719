// The usage examples of the public headers and of the README, compiled as written: at build
// time tests/doc_examples/extract.cmake copies each example into doc_examples/<name>.inc,
// and each function below gives one the names it assumes (the prompt, buffers, a storage)
// and #includes it as its body. A header whose example no function here includes fails
// the build (see the list at the end). The allocator examples also run here; the kernel
// examples only compile (they need KV tensors).
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"  // PAGEDKV_RETURN_IF_ERROR, used by the kernel examples
#include "pagedkv/attention.h"
#include "pagedkv/block_pool.h"
#include "pagedkv/block_table.h"
#include "pagedkv/decode_plan.h"
#include "pagedkv/device.h"
#include "pagedkv/kv_cache_config.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_cache_metrics.h"
#include "pagedkv/kv_cache_plan.h"
#include "pagedkv/kv_cache_spec.h"
#include "pagedkv/kv_cache_view.h"
#include "pagedkv/kv_event_publisher.h"
#include "pagedkv/kv_events.h"
#include "pagedkv/kv_storage.h"
#include "pagedkv/kv_transfer.h"
#include "pagedkv/kv_transfer_faults.h"
#include "pagedkv/kv_transport.h"
#include "pagedkv/merge_state.h"
#include "pagedkv/prefix_hit.h"
#include "pagedkv/remote_block_format.h"
#include "pagedkv/remote_kv_store.h"
#include "pagedkv/remote_namespace.h"
#if PAGEDKV_HAVE_REMOTE
#include "pagedkv/directory_kv_store.h"
#include "pagedkv/redis_kv_store.h"
#include "pagedkv/remote_tier.h"
#endif
#if PAGEDKV_HAVE_PLANNER
#include "pagedkv/capacity_plan.h"
#include "pagedkv/hf_model_config.h"
#endif

namespace pagedkv::doc_examples {

// --- allocator: compiled and run -------------------------------------------------------------

absl::Status example_kv_cache_manager(std::span<const TokenId> prompt, TokenId next_token){
#include "doc_examples/kv_cache_manager.inc"
}

absl::Status example_prefix_hit(KvCacheManager& manager, std::span<const TokenId> prompt){
#include "doc_examples/prefix_hit.inc"
}

absl::Status example_block_pool(){
#include "doc_examples/block_pool.inc"
}

std::vector<KvEvent> example_kv_events() {
  std::vector<KvEvent> forwarded;
  auto forward_to_router = [&](const KvEvent& e) { forwarded.push_back(e); };
  KvCacheManager::Options options{.block_size = 2, .layer_groups = full_attention(8)};
#include "doc_examples/kv_events.inc"
  // The example's manager calls, with the sink it set up: two full blocks are stored, in
  // one event.
  auto manager = KvCacheManager::create(options);
  const TokenId prompt[] = {1, 2, 3, 4, 5};
  if (!manager.ok() || !manager->add_sequence(1, prompt).ok() ||
      !manager->allocate_slots(1, 5).ok()) {
    return {};
  }
  for (const KvEvent& e : events.take()) forward_to_router(e);
  return forwarded;
}

// --- events and metrics: compiled only (they bind ports), when built ------------------------
// Without libzmq or prometheus-cpp those libraries are not built (src/events/CMakeLists.txt)
// and their examples cannot link; the empty functions keep the list below complete.

#if PAGEDKV_HAVE_EVENTS
absl::Status example_kv_event_publisher(KvCacheManager::Options& options) {
#include "doc_examples/kv_event_publisher.inc"
  return absl::OkStatus();
}
#else
void example_kv_event_publisher() {}
#endif

#if PAGEDKV_HAVE_METRICS
absl::Status example_kv_cache_metrics(const KvCacheManager& manager) {
#include "doc_examples/kv_cache_metrics.inc"
  return absl::OkStatus();
}
#else
void example_kv_cache_metrics() {}
#endif

// --- the remote KV store: compiled only (they need a server or write to /mnt) ----------------
// The interface's example calls a RemoteKvStore through its vtable and links without the
// library; the backends' examples need pagedkv::remote (built when hiredis is found).

absl::Status example_remote_kv_store(RemoteKvStore* store, std::string_view ns,
                                     const BlockHash& hash, std::string payload,
                                     const std::function<void(const std::string&)>& use) {
#include "doc_examples/remote_kv_store.inc"
  return absl::OkStatus();
}

// The value format's examples run: a namespace's key, then a block encoded and verified,
// once against nothing fetched (corrupt) and once against its own value.
std::string example_remote_namespace(const BlockHash& hash, KvCacheSpec* spec_out) {
#include "doc_examples/remote_namespace.inc"
  CHECK(std::ssize(digest) == kRemoteNamespaceDigestChars);
  CHECK(key == "pagedkv:" + digest + ":00000000000000010000000000000002");
  *spec_out = spec;
  return digest;
}

absl::Status example_remote_block_format(std::string_view digest, const KvCacheSpec& spec,
                                         std::string_view fetched, std::string* encoded,
                                         int& corrupt) {
  const BlockHash hash{.lo = 2, .hi = 1};
  const std::optional<BlockHash> parent = BlockHash{.lo = 4, .hi = 3};
  const std::vector<uint64_t> extra_keys = {42};
  const std::vector<TokenId> block_tokens(spec.block_size, 7);
  const std::vector<std::byte> bytes(static_cast<size_t>(spec.bytes_per_block()), std::byte{5});
  const std::span<const std::byte> payload(bytes);
#include "doc_examples/remote_block_format.inc"
  *encoded = value;
  PAGEDKV_RETURN_IF_ERROR(verified.status());
  CHECK(verified->size() == bytes.size());
  return absl::OkStatus();
}

TEST_CASE("the remote namespace and block format examples run", "[docs]") {
  KvCacheSpec spec;
  const std::string digest = example_remote_namespace(BlockHash{.lo = 2, .hi = 1}, &spec);
  std::string encoded;
  int corrupt = 0;
  CHECK(example_remote_block_format(digest, spec, "", &encoded, corrupt).code() ==
        absl::StatusCode::kDataLoss);
  CHECK(corrupt == 1);
  const std::string fetched = encoded;
  CHECK(example_remote_block_format(digest, spec, fetched, &encoded, corrupt).ok());
  CHECK(corrupt == 1);
}

// --- KV transfer: compiled only (each side needs a peer) ------------------------------------

absl::Status example_kv_transport() {
#include "doc_examples/kv_transport.inc"
  return transport.status();
}

absl::Status example_kv_transfer(KvTransportListener* listener, const std::string& digest,
                                 const KvCacheSpec& spec, KvTransferId request, const BlockHash& h0,
                                 MutableByteSpan dst0) {
#include "doc_examples/kv_transfer.inc"
  return absl::OkStatus();
}

absl::Status example_kv_transfer_faults(std::unique_ptr<KvTransport> transport,
                                        const KvTransferOptions& options) {
#include "doc_examples/kv_transfer_faults.inc"
  return sender.status();
}

#if PAGEDKV_HAVE_REMOTE
absl::Status example_redis_kv_store() {
#include "doc_examples/redis_kv_store.inc"
  return absl::OkStatus();
}

absl::Status example_directory_kv_store() {
#include "doc_examples/directory_kv_store.inc"
  return absl::OkStatus();
}
// Runs: a lookup that finds nothing, then the prompt's blocks written (zeros).
absl::Status example_remote_tier(const std::unique_ptr<RemoteKvStore>& store, KvStorage& storage,
                                 const KvCacheSpec& spec, const std::string& digest, SeqId seq,
                                 const std::vector<TokenId>& prompt) {
#include "doc_examples/remote_tier.inc"
  CHECK(loaded == 0);
  CHECK(std::ssize(slots) == loadable + rest);
  CHECK(tier->stats().lookups == 1);
  return absl::OkStatus();
}

TEST_CASE("the remote tier's example runs on a directory store", "[docs]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("pagedkv-doc-remote-tier-" + std::to_string(::getpid()));
  {
    auto store = create_directory_kv_store({.directory = dir});
    REQUIRE(store.ok());
    const KvCacheSpec spec{.num_layers = 2,
                           .num_kv_heads = 1,
                           .head_dim = 8,
                           .dtype = DType::kFloat32,
                           .block_size = 4};
    absl::StatusOr<KvStorage> storage = KvStorage::create(spec, 16, {.device = Device::kCpu});
    REQUIRE(storage.ok());
    const std::string digest = remote_namespace_digest({.model_id = "doc-example"});
    const absl::Status status =
        example_remote_tier(*store, *storage, spec, digest, 1, std::vector<TokenId>(13, 3));
    INFO(status.ToString());
    CHECK(status.ok());
  }
  std::filesystem::remove_all(dir);
}
#else
void example_redis_kv_store() {}
void example_directory_kv_store() {}
void example_remote_tier() {}
#endif

// --- the capacity planner: run when built (it needs nlohmann-json) -----------------------------

#if PAGEDKV_HAVE_PLANNER
absl::StatusOr<HfModelConfig> example_hf_model_config() {
#include "doc_examples/hf_model_config.inc"
  return model;
}

// Compiled only: it reads a config.json by a relative path.
absl::Status example_capacity_plan() {
#include "doc_examples/capacity_plan.inc"
  return plan.status();
}
#else
void example_hf_model_config() {}
void example_capacity_plan() {}
#endif

// The README's block is written at file level with a `seq`, a `prompt` and a `sampled`
// token in scope and `PAGEDKV_OK` standing for the reader's status handling.
#define PAGEDKV_OK(expr)                                              \
  do {                                                                \
    if (absl::Status status_ = (expr); !status_.ok()) return status_; \
  } while (false)
absl::Status example_readme_1(SeqId seq, const std::vector<TokenId>& prompt, TokenId sampled) {
#include "doc_examples/readme_1.inc"
  return slots.status();
}
#undef PAGEDKV_OK

// --- kernels and storage: compiled -------------------------------------------------------------

absl::Status example_attention(const KvStorage& storage, int32_t layer, const void* k,
                               const void* v, const int64_t* slots, int32_t num_seqs,
                               const BlockTables& tables, const void* q, void* out, int32_t max_len,
                               const void* q_new, void* out_new, const int32_t* qo_indptr,
                               int32_t longest_prompt) {
#include "doc_examples/attention.inc"
  return absl::OkStatus();
}

absl::Status example_kv_storage(KvCacheManager& manager) {
#include "doc_examples/kv_storage.inc"
  return absl::OkStatus();
}

int64_t example_kv_cache_view(void* k_pool, void* v_pool) {
#include "doc_examples/kv_cache_view.inc"
  return e;
}

// --- small values: compiled and run -------------------------------------------------------------

DecodePlan example_decode_plan() {
#include "doc_examples/decode_plan.inc"
  return plan;
}

void example_device(){
#include "doc_examples/device.inc"
}

absl::StatusOr<int32_t> example_kv_cache_spec() {
#include "doc_examples/kv_cache_spec.inc"
  return n;
}

// Returns the manager and storage it made, for the test to check.
absl::Status example_kv_cache_plan(std::optional<KvCacheManager>& made,
                                   std::vector<KvStorage>& made_storage) {
#include "doc_examples/kv_cache_plan.inc"
  made.emplace(*std::move(manager));
  made_storage = std::move(storage);
  return absl::OkStatus();
}

absl::StatusOr<PoolSplit> example_kv_cache_config() {
#include "doc_examples/kv_cache_config.inc"
  return split;
}

constexpr int D = 4;
std::vector<float> example_merge_state(const MergeState* part, const float (*part_o)[D],
                                       int num_splits) {
#include "doc_examples/merge_state.inc"
  std::vector<float> output(o, o + D);
  for (float& x : output) x *= inv_sum(total);
  return output;
}

TEST_CASE("the KvCacheManager header example runs as written", "[docs]") {
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5};
  const absl::Status status = example_kv_cache_manager(prompt, /*next_token=*/6);
  INFO(status.ToString());
  REQUIRE(status.ok());
}

TEST_CASE("the PrefixHit header example admits a sequence that fits", "[docs]") {
  auto manager = KvCacheManager::create({.block_size = 4, .layer_groups = full_attention(8)});
  REQUIRE(manager.ok());
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6};
  REQUIRE(manager->add_sequence(7, prompt).ok());
  const absl::Status status = example_prefix_hit(*manager, prompt);
  INFO(status.ToString());
  REQUIRE(status.ok());
  CHECK(manager->sequence(7)->state == SequenceState::kRunning);
  REQUIRE(manager->check_invariants().ok());
}

TEST_CASE("the BlockPool header example runs as written", "[docs]") {
  REQUIRE(example_block_pool().ok());
}

TEST_CASE("the KV events header example forwards the stored blocks", "[docs]") {
  const std::vector<KvEvent> forwarded = example_kv_events();
  REQUIRE(forwarded.size() == 1);  // one BlockStored per call, as vLLM groups them
  const auto& stored = std::get<BlockStored>(forwarded[0]);
  REQUIRE(stored.block_hashes.size() == 2);
  REQUIRE(stored.token_ids == std::vector<TokenId>{1, 2, 3, 4});
}

TEST_CASE("the README example runs as written", "[docs]") {
  const absl::Status status = example_readme_1(/*seq=*/3, {10, 11, 12, 13, 14}, /*sampled=*/15);
  INFO(status.ToString());
  REQUIRE(status.ok());
}

TEST_CASE("the small-value header examples compute what their comments say", "[docs]") {
  const DecodePlan plan = example_decode_plan();
  CHECK(plan.num_splits == 43);
  CHECK(plan.tokens_per_split == 768);
  const absl::StatusOr<int32_t> blocks = example_kv_cache_spec();
  REQUIRE(blocks.ok());
  CHECK(*blocks == 4096);
  // 64 GiB split for 32K Gemma-3-27B sequences: 1,447 sliding and 44,903 full blocks
  // (tests/kv_cache_config_test.cc works them out).
  const absl::StatusOr<PoolSplit> split = example_kv_cache_config();
  REQUIRE(split.ok());
  REQUIRE(split->groups.size() == 2);
  CHECK(split->groups[0].num_blocks == 1447);
  CHECK(split->groups[1].num_blocks == 44903);
  example_device();
  // Two splits of one key each, equal scores: the output is the mean of their values.
  const MergeState part[2] = {{.m = 0.0f, .l = 1.0f}, {.m = 0.0f, .l = 1.0f}};
  const float part_o[2][D] = {{1, 2, 3, 4}, {3, 4, 5, 6}};
  CHECK(example_merge_state(part, part_o, 2) == std::vector<float>{2, 3, 4, 5});
}

TEST_CASE("the KvCachePlan header example sizes a manager and its storage alike", "[docs]") {
  std::optional<KvCacheManager> manager;
  std::vector<KvStorage> storage;
  const absl::Status status = example_kv_cache_plan(manager, storage);
  INFO(status.ToString());
  REQUIRE(status.ok());
  REQUIRE(manager->num_groups() == 2);
  REQUIRE(storage.size() == 2);
  for (int32_t g = 0; g < 2; ++g) {
    const absl::StatusOr<LayerGroup> group = manager->layer_group(g);
    REQUIRE(group.ok());
    CHECK(storage[g].num_blocks() == group->num_blocks);
    CHECK(storage[g].layer_group() == g);
    CHECK(storage[g].spec().block_size == manager->options().block_size);
    CHECK(group->num_host_blocks > 0);
  }
}

#if PAGEDKV_HAVE_PLANNER
TEST_CASE("the config.json reader's header example reads two groups", "[docs]") {
  const absl::StatusOr<HfModelConfig> model = example_hf_model_config();
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  REQUIRE(model->kv.groups.size() == 2);
  CHECK(model->kv.groups[0].kind == AttentionKind::kSlidingWindow);
  CHECK(model->kv.groups[0].shape.num_layers == 2);
  CHECK(model->kv.bytes_per_token(0) == 4096);
}
#endif

// Every extracted example has a function above; a new one without fails to compile here.
TEST_CASE("every header and README example is compiled", "[docs]") {
  int examples = 0;
#define PAGEDKV_DOC_EXAMPLE(name) \
  (void)&example_##name;          \
  ++examples;
#include "doc_examples/list.inc"
#undef PAGEDKV_DOC_EXAMPLE
  CHECK(examples == 27);
}

}  // namespace pagedkv::doc_examples
