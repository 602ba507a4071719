// File: pagedkv/remote_tier.h
//
// RemoteTier: the prefix cache's remote tier, shared by engines through a RemoteKvStore
// (Redis, a directory). An engine's computed blocks are written to the store; a sequence
// whose prompt continues past the engine's own cached prefix (device and host tier) has
// the rest looked up there, asynchronously, and the blocks found are loaded into its first
// device blocks instead of being computed. Every fetched value is verified like a device
// hit (namespace, hash, parent, tokens, extra keys) and by its checksums before it is
// used: anything else is a miss, counted (remote_block_format.h). docs/remote.md, "The
// tier", has the flow and the policies.
//
// The tier works beside KvCacheManager through its public calls, one scheduler thread:
//
//   each step    poll()                 takes the store's completions, verifies values
//   admission    start_lookup(seq)      gets the blocks after the local prefix
//                ready(seq)             whether the wait policy admits it now
//                match_prefix(seq)      (the manager: device and host hits, as always)
//                loadable_tokens(seq)   the verified fetched blocks continuing the claim
//                allocate_slots(seq)    (the manager: those tokens and the rest)
//                load(seq, slots)       plans their payloads into the first slots' blocks
//   after ops    run_loads(write)       writes the loaded payloads into their blocks,
//                                       after take_step_ops()' copies (a demotion may
//                                       still read a reused block), before compute
//   after compute write_computed(read)  puts the blocks the write policy chose
//
// It learns which blocks were computed from the manager's events: pass the tier as the
// manager's Options::event_sink; it forwards every event to Options::next_sink. Only a
// manager with one full-attention layer group (no layer groups) is supported.
//
// The scheduler never waits on the network: every call above returns without I/O (the
// store's threads do it); read and write of block bytes are the storage's copies.
//
// In the example, `store` is a RemoteKvStore, `storage` the KvStorage of the manager's
// device blocks, `spec` its KvCacheSpec and `digest` its remote_namespace_digest().
// Example (in a function returning a Status):
//   PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<RemoteTier> tier,
//       RemoteTier::create(store.get(), {.namespace_digest = digest,
//                                        .payload_bytes = spec.bytes_per_block()}));
//   PAGEDKV_ASSIGN_OR_RETURN(KvCacheManager manager,
//       KvCacheManager::create({.block_size = spec.block_size, .event_sink = tier.get(),
//                               .layer_groups = full_attention(storage.num_blocks())}));
//   PAGEDKV_RETURN_IF_ERROR(manager.add_sequence(seq, prompt));
//   PAGEDKV_RETURN_IF_ERROR(tier->start_lookup(seq, prompt, {}, manager));
//   tier->poll();  // every step; admit the sequence once tier->ready(seq):
//   PAGEDKV_ASSIGN_OR_RETURN(int32_t claimed, manager.match_prefix(seq));
//   const int32_t loadable = tier->loadable_tokens(seq, claimed);
//   const auto rest = static_cast<int32_t>(prompt.size()) - claimed - loadable;
//   PAGEDKV_ASSIGN_OR_RETURN(std::span<const int64_t> slots,
//                            manager.allocate_slots(seq, loadable + rest));
//   PAGEDKV_ASSIGN_OR_RETURN(int32_t loaded, tier->load(seq, claimed, slots));
//   PAGEDKV_RETURN_IF_ERROR(storage.run_step_ops(manager.take_step_ops()));
//   PAGEDKV_RETURN_IF_ERROR(tier->run_loads(
//       [&](BlockId b, std::span<const std::byte> in) { return storage.write_block(b, in); }));
//   // ... compute the prompt's last `rest` tokens into the last slots, then
//   PAGEDKV_RETURN_IF_ERROR(tier->write_computed(
//       manager, [&](BlockId b, std::span<std::byte> out) { return storage.read_block(b, out); }));
#ifndef PAGEDKV_REMOTE_TIER_H_
#define PAGEDKV_REMOTE_TIER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/block_hash.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_events.h"
#include "pagedkv/remote_kv_store.h"
#include "pagedkv/types.h"

namespace pagedkv {

// Which computed blocks the tier writes to the store.
enum class RemoteWritePolicy : uint8_t {
  // Every full block, once, after the step that computed it (LMCache's default): the
  // store holds what any engine computed, at the cost of writing blocks never reused.
  kWriteThrough,
  // A block when a lookup finds it in this engine's device cache (a local prefix hit):
  // only blocks with evidence of reuse travel (SGLang HiCache's write_through_selective).
  kSelective,
};

// When a sequence whose lookup is still in flight may be admitted (HiCache's names).
enum class RemoteWaitPolicy : uint8_t {
  kBestEffort,    // at once, with the blocks that have arrived (often none)
  kWaitComplete,  // when every get completed, however long the store takes
  kTimeout,       // when every get completed or timeout_ms passed, with what arrived
};

struct RemoteTierOptions {
  std::string namespace_digest = "";  // remote_namespace_digest() of the engine's cache
  int64_t payload_bytes = 0;          // KvCacheSpec::bytes_per_block() of the engine's cache
  RemoteWritePolicy write_policy = RemoteWritePolicy::kWriteThrough;
  RemoteWaitPolicy wait_policy = RemoteWaitPolicy::kTimeout;
  int32_t timeout_ms = 50;
  // A lookup's blocks go out in gets of this many, so that with a timeout the first
  // ones can be used while later ones are still in flight.
  int32_t blocks_per_get = 8;
  int32_t max_lookup_blocks = 1024;  // blocks one lookup fetches at most
  // Hashes remembered as in the store (written or loaded): not written again. Oldest
  // forgotten first.
  int32_t max_known_hashes = 1 << 20;
  BlockHashFn hash_fn = hash_block;  // the manager's Options::hash_fn
  KvEventSink* next_sink = nullptr;  // receives every event the manager sends; optional
};

struct RemoteTierStats {
  int64_t lookups = 0;         // start_lookup() calls that asked the store
  int64_t lookup_blocks = 0;   // blocks asked
  int64_t found_blocks = 0;    // fetched and verified
  int64_t missing_blocks = 0;  // not in the store
  int64_t corrupt_blocks = 0;  // failed the checksums or were cut (DataLoss)
  int64_t foreign_blocks = 0;  // intact, of another namespace or format (FailedPrecondition)
  int64_t other_blocks = 0;    // intact, of another block: hash, parent or tokens (NotFound)
  int64_t error_blocks = 0;    // the store failed (down, timeout)
  int64_t timed_out = 0;       // lookups admitted by the timeout before every get completed
  int64_t loaded_blocks = 0;   // loaded into device blocks (remote hits)
  int64_t loaded_tokens = 0;
  int64_t written_blocks = 0;  // put and stored
  int64_t written_bytes = 0;   // value bytes of those
  int64_t write_failures = 0;  // puts that failed or were dropped (written again later)
  int64_t skipped_writes = 0;  // chosen, but the block was evicted before it was read
};

class RemoteTier final : public KvEventSink {
 public:
  // A tier over `store` (not owned; must outlive the tier). Errors: InvalidArgument for
  // a null store, a digest that is not kRemoteNamespaceDigestChars lowercase hex digits,
  // payload_bytes <= 0, or a count option <= 0, naming the value.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RemoteTier>> create(
      RemoteKvStore* store, RemoteTierOptions options);

  // RemoteTier::poll()
  //
  // Takes the store's completions: verifies fetched values, settles writes. Never waits.
  void poll();

  // RemoteTier::start_lookup()
  //
  // Starts fetching the blocks of `prompt` (hashed with `extra_keys`, as the manager
  // hashes the sequence) after those the manager's device or host tier index holds, at
  // most max_lookup_blocks and never the block of the prompt's last token. Nothing to
  // fetch, or a lookup of `seq` already started: no request. With kSelective, the local
  // hits found on the way are chosen for writing.
  // Errors: InvalidArgument for an empty prompt; the store's refusal of a get.
  [[nodiscard]] absl::Status start_lookup(SeqId seq, std::span<const TokenId> prompt,
                                          std::span<const uint64_t> extra_keys,
                                          const KvCacheManager& manager);

  // Whether `seq` may be admitted now under the wait policy (true without a lookup).
  bool ready(SeqId seq) const;

  // RemoteTier::loadable_tokens()
  //
  // Tokens of the verified fetched blocks that continue, block by block, the
  // `claimed_tokens` that match_prefix() claimed for `seq`: the engine allocates slots for
  // them with the rest of its prompt. 0 without a lookup, or when the claim does not end
  // where a fetched block starts (the local cache lost a block meanwhile, or a claim ending
  // inside a block).
  int32_t loadable_tokens(SeqId seq, int32_t claimed_tokens) const;

  // RemoteTier::load()
  //
  // After allocate_slots() for `seq` succeeded with its loadable_tokens() first: plans
  // writing those blocks' payloads into the blocks of `slots` (its slot mapping, from the
  // first of those tokens), which run_loads() runs, and ends the lookup. Returns the
  // tokens loaded (loadable_tokens()); 0, ending the lookup, when there are none.
  // Errors: InvalidArgument when `slots` is shorter than the loadable tokens (nothing
  // planned).
  [[nodiscard]] absl::StatusOr<int32_t> load(SeqId seq, int32_t claimed_tokens,
                                             std::span<const int64_t> slots);

  // Forgets `seq`'s lookup (the sequence left); its completions are ignored.
  void cancel(SeqId seq);

  // How the tier writes and reads a device block's payload (payload_bytes: every layer's
  // K and V in the storage layout): KvStorage::write_block() and read_block(), e.g.
  //   [&](BlockId b, std::span<const std::byte> in) { return storage.write_block(b, in); }
  // Functions rather than KvStorage, so that the tier needs no kernels library.
  using WriteBlock = std::function<absl::Status(BlockId, std::span<const std::byte>)>;
  using ReadBlock = std::function<absl::Status(BlockId, std::span<std::byte>)>;

  // RemoteTier::run_loads()
  //
  // Writes the payloads load() planned into their device blocks. Call after the step's
  // take_step_ops() copies ran, before the step's compute. Errors: write_block's (the
  // loads not written yet stay planned).
  [[nodiscard]] absl::Status run_loads(const WriteBlock& write_block);

  // RemoteTier::write_computed()
  //
  // Reads the blocks the write policy chose since the last call and puts them (one
  // batch). Call after the step's compute, before the next step's allocations: a chosen
  // block that was evicted meanwhile is skipped. Errors: read_block's; the store's refusal.
  [[nodiscard]] absl::Status write_computed(const KvCacheManager& manager,
                                            const ReadBlock& read_block);

  // KvEventSink: device blocks stored are candidates for writing; forwarded.
  void on_event(const KvEvent& event) override;

  const RemoteTierStats& stats() const { return stats_; }
  const RemoteTierOptions& options() const { return options_; }

 private:
  // What names a block in the store and verifies it: see RemoteBlockIdentity.
  struct BlockInfo {
    BlockHash hash;
    std::optional<BlockHash> parent;
    std::vector<TokenId> tokens;
    std::vector<uint64_t> extra_keys;
  };
  struct FetchedBlock {
    enum class State : uint8_t { kPending, kFound, kMissing };
    State state = State::kPending;
    std::string value;       // the verified value
    int64_t payload_at = 0;  // where its payload starts in `value`
  };
  struct Lookup {
    int32_t block_size = 0;
    int32_t first_block = 0;        // prompt index of blocks[0]
    std::vector<BlockInfo> blocks;  // to fetch, in order
    std::vector<FetchedBlock> fetched;
    int32_t gets_in_flight = 0;
    std::chrono::steady_clock::time_point started;
  };
  struct Get {
    SeqId seq = 0;
    int32_t first = 0;  // index into the lookup's blocks
  };
  struct Put {
    std::vector<BlockHash> hashes;
    std::vector<int64_t> value_bytes;
  };
  struct PendingLoad {
    BlockId block = kNoBlock;
    std::string value;
    int64_t payload_at = 0;
  };

  RemoteTier(RemoteKvStore* store, RemoteTierOptions options)
      : store_(store), options_(std::move(options)) {}

  void settle_get(RemoteCompletion& c, const Get& get);
  void settle_put(const RemoteCompletion& c, const Put& put);
  void verify(std::string value, const BlockInfo& block, FetchedBlock& out);
  void remember(const BlockHash& hash);
  void forget(const BlockHash& hash);
  void choose_for_writing(const BlockInfo& block);
  int32_t loadable_blocks(const Lookup& lookup, int32_t claimed_tokens) const;

  RemoteKvStore* store_;
  const RemoteTierOptions options_;
  RemoteTierStats stats_;
  absl::flat_hash_map<SeqId, Lookup> lookups_;
  absl::flat_hash_map<RemoteRequestId, Get> gets_;
  absl::flat_hash_map<RemoteRequestId, Put> puts_;
  std::vector<PendingLoad> loads_;
  std::vector<BlockInfo> to_write_;
  // kSelective: the device blocks stored, by hash, until they are written or removed.
  absl::flat_hash_map<BlockHash, BlockInfo> candidates_;
  absl::flat_hash_set<BlockHash> known_;  // in the store (written, being written or loaded)
  std::deque<BlockHash> known_order_;     // oldest first, for max_known_hashes
  std::vector<RemoteCompletion> completions_;
};

}  // namespace pagedkv

#endif  // PAGEDKV_REMOTE_TIER_H_
