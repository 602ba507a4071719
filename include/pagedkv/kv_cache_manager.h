// File: pagedkv/kv_cache_manager.h
//
// KvCacheManager: the per-sequence view of the KV cache that a serving engine's scheduler
// drives. It owns a device BlockPool (and an optional host pool for swapped sequences and
// the host tier of the prefix cache) and,
// per sequence, a block table, the token ids (for prefix hashing), the number of tokens
// whose KV is computed, a priority and an arrival order. It hands the engine slot
// mappings, copy-on-write copies, swap copies and batched block tables; it never touches
// KV bytes.
//
// One thread (the scheduler) owns a manager; there are no internal locks. Spans and views
// returned by a call stay valid until the next non-const call.
//
// Lifecycle of a sequence:
//   add_sequence -> peek_prefix, match_prefix (optional) -> allocate_slots ... append_tokens ->
//   allocate_slots(1) per decode step ... -> free
//   with fork() for parallel samples, preempt()/allocate_slots_or_preempt() under memory
//   pressure, swap_in() to resume a swapped sequence, and release_claim() to give back a
//   waiting sequence's claimed prefix.
//
// tests/doc_examples_test.cc compiles and runs the example below.
//
// Example (one request, prefill then one decode step, in a function returning a Status):
//   absl::StatusOr<KvCacheManager> manager =
//       KvCacheManager::create({.block_size = 16, .layer_groups = full_attention(4096)});
//   if (!manager.ok()) return manager.status();
//   if (absl::Status s = manager->add_sequence(/*seq=*/7, prompt); !s.ok()) return s;
//   const int32_t cached = *manager->match_prefix(7);  // tokens reused from cache
//   auto slots = manager->allocate_slots(7, static_cast<int32_t>(prompt.size()) - cached);
//   if (!slots.ok()) return slots.status();  // ResourceExhausted: preempt or wait
//   // ... run the engine's copies, write K/V of the new tokens into *slots, attend ...
//   if (absl::Status s = manager->append_tokens(7, {&next_token, 1}); !s.ok()) return s;
//   slots = manager->allocate_slots(7, 1);  // decode step
//   if (!slots.ok()) return slots.status();
//   return manager->free(7);  // blocks stay cached
#ifndef PAGEDKV_KV_CACHE_MANAGER_H_
#define PAGEDKV_KV_CACHE_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/block_copy.h"
#include "pagedkv/block_hash.h"
#include "pagedkv/block_pool.h"
#include "pagedkv/block_table.h"
#include "pagedkv/kv_events.h"
#include "pagedkv/kv_handoff.h"
#include "pagedkv/layer_group.h"
#include "pagedkv/prefix_hit.h"
#include "pagedkv/retention.h"
#include "pagedkv/step_ops.h"
#include "pagedkv/types.h"

namespace pagedkv {
namespace internal {
class CacheCoordinator;
}  // namespace internal

enum class PreemptionMode {
  kRecompute,  // blocks freed (hashed ones stay cached); the tokens are recomputed later
  kSwap,       // blocks copied to the host pool, copied back by swap_in()
};

// Which cached device blocks eviction demotes into the host tier (Options::host_admission).
enum class HostAdmission {
  kAll,  // every one, while a host block is free or holds an evictable tier block
  // Only blocks with evidence of reuse since they were computed: a full-block prefix hit
  // (on the device, or in the host tier: a promoted block), or computed while their hash
  // was a ghost, one of the hashes of the (device + host blocks) cached blocks that most
  // recently left both of the group's tiers. The rest are dropped, saving their copies
  // (docs/results.md, "Host-tier admission"). Costs a byte per device block and about 60
  // bytes of host memory per ghost.
  kReused,
};

enum class SequenceState {
  kWaiting,  // holds no blocks: new, or preempted by recompute
  kRunning,  // holds device blocks
  kSwapped,  // holds host blocks only
};

// What a victim policy sees of each candidate.
struct SequenceInfo {
  SeqId id = 0;
  int32_t priority = 0;    // larger runs first; the lowest is preempted first
  int64_t arrival = 0;     // order of add_sequence()/fork() calls, from 0
  int32_t num_blocks = 0;  // device blocks held
  int32_t num_tokens = 0;
  int32_t num_computed_tokens = 0;
};

struct Preemption {
  SeqId victim = 0;
  PreemptionMode mode = PreemptionMode::kRecompute;
};

// Picks the sequence to preempt among `running` (never empty; `requester` excluded), or
// nullopt to give up. The default: lowest priority, then latest arrival, in the
// manager's default mode (recompute when the host pool cannot hold the victim).
using VictimPolicy = std::function<std::optional<Preemption>(std::span<const SequenceInfo> running,
                                                             SeqId requester)>;

// The engine's side of preemption: called after the victim's blocks are released (recompute)
// or scheduled for copy to the host (swap, see take_step_ops()).
class PreemptionHooks {
 public:
  virtual ~PreemptionHooks() = default;
  virtual void on_preempt(SeqId victim, PreemptionMode mode) = 0;
  // allocate_slots_or_preempt() released the prefix a waiting sequence had claimed with
  // match_prefix() (see release_claim()): its computed count is 0 again, so call
  // match_prefix() again before admitting it.
  virtual void on_claim_released(SeqId /*seq*/) {}
};

// Read-only view of one sequence and its table in one layer group; valid until the next
// non-const call.
struct SequenceView {
  SeqId id = 0;
  SequenceState state = SequenceState::kWaiting;
  int32_t priority = 0;
  int64_t arrival = 0;
  int32_t num_computed_tokens = 0;  // tokens whose KV is (being) written
  std::span<const TokenId> tokens;  // prompt and generated tokens
  // Device blocks (running); a windowed group's entries before first_held_block are
  // kNoBlock (released: no future token attends to them).
  std::span<const BlockId> block_table;
  std::span<const BlockId> host_blocks;  // host blocks (swapped): entries first_held_block..
  int32_t first_held_block = 0;
  // Speculative decoding: the last num_draft_tokens of `tokens` (and of the computed ones)
  // are drafts that accept_draft() has not judged yet.
  int32_t num_draft_tokens = 0;
};

struct SequenceOptions {
  int32_t priority = 0;                   // larger runs first; the lowest is preempted first
  std::vector<uint64_t> extra_keys = {};  // hashed into every block: cache salt, adapter id
  // Retention of the sequence's blocks once freed; a later range overrides an earlier one
  // where they overlap; blocks outside every range keep the default priority. A block
  // shared by several sequences keeps the highest priority (and the longest duration of
  // it) that its holders gave it since it was last taken from the free queue (holders
  // that give none have no say). E.g. a system prompt of 512 tokens kept resident for
  // ten minutes:
  //   {.retention = {{.begin = 0, .end = 512, .priority = 90, .duration_ms = 600'000}}}
  std::vector<RetentionRange> retention = {};
};

class KvCacheManager {
 public:
  // The pools' sizes come only from `layer_groups` (full_attention() for a model of
  // full-attention layers), and with block_size from one KvCachePlan (kv_cache_plan.h) when
  // the engine also sizes its KV storage, so that the two cannot disagree.
  struct Options {
    int32_t block_size = 16;  // tokens per block, > 0, in every group
    // Host tier of the prefix cache: a cached device block that eviction takes is demoted
    // to a host block (StepOps::demote) instead of being lost; match_prefix() continues
    // from device hits into host hits and promotes them (StepOps::promote). Needs prefix
    // caching and host blocks in every group (LayerGroup::num_host_blocks, which swapped
    // sequences and the tier share: swap first, the tier caches in the rest; see
    // kv_storage.h).
    bool enable_host_cache = false;
    HostAdmission host_admission = HostAdmission::kAll;  // which evictions the tier takes
    // The order in which the full-attention groups' device pools evict cached free blocks
    // of one retention priority (retention.h): LRU, or adaptive (recency against frequency,
    // never a parent before its cached children; a parent so counts at least its cached
    // children's priority). Windowed and state groups evict by their own classes, in LRU.
    EvictionPolicy eviction_policy = EvictionPolicy::kLru;
    int32_t max_model_len = 1 << 20;  // most tokens one sequence may hold
    // Partial-block reuse: where a prompt continues past its full-block hit into the first
    // k < block_size tokens of a cached block (in every group), match_prefix() reuses
    // those k tokens through a copy-on-write copy of that block instead of leaving them to
    // be recomputed. Each device pool then also indexes its cached blocks by their first
    // token (a hash-map entry per cached block).
    bool enable_partial_block_reuse = false;
    // Windowed groups' eviction (docs/allocator.md, "Eviction in windowed groups"): a block
    // released behind a window, or with its sequence, keeps a retention class by the hit
    // points whose windows it completes: where a match's full-group chain and its hit
    // ended (branch points), then checkpoints every window_checkpoint_tokens and each of
    // window_checkpoint_levels - 1 finer levels at half the spacing; the rest is evicted
    // first. 0 tokens or 0 levels: no checkpoint classes.
    int32_t window_checkpoint_tokens = 16384;
    int32_t window_checkpoint_levels = 5;
    // false: no classes at all (neither branch points nor checkpoints): released windowed
    // blocks are evicted in LRU order with every other block of their pool, the entries
    // one call releases last entry first, as vLLM's are.
    bool window_eviction_classes = true;
    // State groups (kState, docs/allocator.md "State groups"): besides the checkpoints at
    // the end of each prompt's last full block and at the branch point of its match, one
    // every this many blocks of a sequence (0: none).
    int32_t state_checkpoint_interval_blocks = 0;
    int32_t watermark_blocks = 0;  // blocks an admission leaves free while others run
    bool enable_prefix_caching = true;
    PreemptionMode preemption_mode = PreemptionMode::kRecompute;  // default policy's mode
    BlockHashFn hash_fn = hash_block;                             // injectable for collision tests
    KvEventSink* event_sink = nullptr;                            // optional, not owned
    PreemptionHooks* preemption_hooks = nullptr;                  // optional, not owned
    VictimPolicy victim_policy = nullptr;                         // empty: the default policy
    // Milliseconds for retention durations; empty: std::chrono::steady_clock. Called only
    // while a block with a retention duration is free.
    std::function<int64_t()> clock = nullptr;
    // The layer groups (layer_group.h), at least one, each with device and host pools of
    // its own sizes (KvCachePlan and KvCacheConfig split byte budgets into them; a model of
    // full-attention layers only is full_attention(num_blocks, num_host_blocks)). A state
    // group's pools hold state slots: one per sequence that has started, the rest
    // checkpoints; its host pool serves swapping and the host tier (demoted checkpoints),
    // it has no slot mapping, and partial-block reuse is refused with it.
    // watermark_blocks applies to the first group and, scaled to its size (rounded up), to
    // each other group. A windowed or state group with prefix caching needs a
    // full-attention group beside it: hits are verified along the first full group's chain.
    std::vector<LayerGroup> layer_groups = {};
    // One device pool for all layer groups, for engines whose KV tensors give every group's
    // layers the same pages (vLLM's hybrid layout): one id space, free queue and eviction
    // order, a prefix index keyed by (hash, group), and a step that fits when the pool has
    // the blocks of all groups together (docs/allocator.md, "One pool for all groups").
    // Needs attention groups (no state group) with equal num_blocks, the pool's, no host
    // blocks, LRU eviction and no partial-block reuse. device_pool(g) is then the same pool
    // for every g; its public hash lookups (BlockPool::indexed_block()) are group 0's.
    bool shared_block_pool = false;
  };

  // Pool figures are those of group 0 (the only one of a model without layer groups; see
  // group_stats() for the others); the rest count sequences and hits, for all groups.
  struct Stats {
    int32_t num_blocks = 0;
    int32_t used_blocks = 0;
    int32_t free_blocks = 0;
    int32_t cached_free_blocks = 0;
    int32_t num_host_blocks = 0;
    int32_t used_host_blocks = 0;
    int64_t prefix_query_tokens = 0;  // prompt tokens looked up by match_prefix
    int64_t prefix_hit_tokens = 0;    // of those, found in the cache
    int64_t partial_hit_tokens = 0;   // of those, reused from part of a cached block
    int64_t evictions = 0;
    int64_t cow_copies = 0;
    int64_t preemptions_recompute = 0;
    int64_t preemptions_swap = 0;
    int64_t blocks_swapped_out = 0;
    int64_t blocks_swapped_in = 0;
    int64_t claims_released = 0;  // claimed prefixes given back (release_claim, or to preempt)
    // Host tier.
    int32_t cached_host_blocks = 0;  // host blocks holding a cached block's K/V
    int64_t host_hit_tokens = 0;     // of prefix_hit_tokens, found in the host tier
    int64_t blocks_demoted = 0;      // device -> host copies of cached blocks (demote, exchange)
    int64_t blocks_promoted = 0;     // host -> device copies of host hits (promote, exchange)
    int64_t host_evictions = 0;      // host-tier blocks dropped to reuse their host block
    // HostAdmission::kReused: evicted blocks dropped for want of evidence of reuse, and
    // blocks computed while their hash was a ghost.
    int64_t blocks_not_admitted = 0;
    int64_t ghost_hits = 0;
    // EvictionPolicy::kAdaptive: blocks cached while their hash was a ghost of a block
    // evicted once-used (the policy then favours recency) or reused (frequency).
    int64_t recent_ghost_hits = 0;
    int64_t frequent_ghost_hits = 0;
    // Speculative decoding: draft tokens given slots (allocate_draft_slots()) and, of those
    // judged by accept_draft(), the accepted ones.
    int64_t draft_tokens = 0;
    int64_t accepted_draft_tokens = 0;
    // Disaggregated prefill and decode: sequences exported and blocks of every group still
    // pinned by exports; of the tokens imports brought, those complete_import() counted
    // and those it discarded (recomputed).
    int64_t exported_sequences = 0;
    int32_t pinned_blocks = 0;
    int64_t imported_tokens = 0;
    int64_t discarded_import_tokens = 0;
  };

  // One layer group's pools and cache traffic.
  struct GroupStats {
    int32_t num_blocks = 0;
    int32_t used_blocks = 0;
    int32_t free_blocks = 0;
    int32_t cached_free_blocks = 0;
    int32_t num_host_blocks = 0;
    int32_t used_host_blocks = 0;
    int32_t cached_host_blocks = 0;
    int64_t evictions = 0;
    int64_t host_evictions = 0;
    int64_t hit_blocks = 0;       // blocks prefix hits claimed from the group's cache
    int64_t released_blocks = 0;  // windowed: blocks released behind the window
    int64_t blocks_demoted = 0;
    int64_t blocks_promoted = 0;
    int64_t blocks_not_admitted = 0;
    int64_t ghost_hits = 0;
    // State groups: checkpoints saved (StepOps::save_state) and restored by prefix hits.
    // With the host tier, blocks_demoted counts checkpoints demoted and blocks_promoted
    // those of checkpoints_restored restored from the tier.
    int64_t checkpoints_saved = 0;
    int64_t checkpoints_restored = 0;
  };

  // Returns InvalidArgument for no layer groups, a group's num_blocks or block_size outside
  // BlockPool's limits ([1, BlockPool::kMaxBlocks], [1, BlockPool::kMaxBlockSize], at most
  // BlockPool::kMaxTokenSlots slots), a negative num_host_blocks or watermark, a
  // watermark that leaves no block to allocate, enable_host_cache without prefix caching
  // or host blocks, a windowed group without a window, or windowed or state groups with
  // prefix caching but no full-attention group; ResourceExhausted when the host memory for
  // the bookkeeping cannot be allocated.
  [[nodiscard]] static absl::StatusOr<KvCacheManager> create(Options options);

  KvCacheManager(KvCacheManager&&) noexcept;
  KvCacheManager& operator=(KvCacheManager&&) noexcept;
  ~KvCacheManager();

  // KvCacheManager::add_sequence()
  //
  // Registers a waiting sequence holding `prompt` (at least one token). No blocks yet.
  // Errors: AlreadyExists (id in use); InvalidArgument (empty prompt, longer than
  // max_model_len, needing more blocks than the pool has, or a retention range with
  // begin < 0, end < begin, a priority outside [kMinRetentionPriority,
  // kMaxRetentionPriority] or a negative duration).
  [[nodiscard]] absl::Status add_sequence(SeqId seq, std::span<const TokenId> prompt,
                                          SequenceOptions options = {});

  // KvCacheManager::append_tokens()
  //
  // Appends generated tokens to a sequence (before allocate_slots() reserves their KV).
  // Errors: NotFound; InvalidArgument beyond max_model_len; FailedPrecondition while drafts
  // wait for accept_draft().
  [[nodiscard]] absl::Status append_tokens(SeqId seq, std::span<const TokenId> tokens);

  // KvCacheManager::match_prefix()
  //
  // Claims the longest verified cached prefix of a waiting sequence, in full blocks, and
  // returns its length in tokens; those tokens count as computed. Never the whole token
  // list: at most len - 1 tokens, since the last token's logits must be computed.
  // Returns 0 with prefix caching off. Counts prefix query and hit tokens. With
  // Options::enable_partial_block_reuse, the claim may end in a partial block: the first k
  // tokens of a cached block that continues the prompt, reused through a copy-on-write copy
  // (StepOps::copy_on_write, so the sequence counts as scheduled in this step).
  // With the host tier, the prefix continues past the device hits into host hits, as far
  // as free device blocks allow (leaving watermark_blocks free while others run): each is
  // promoted into a new device block (a StepOps::promote copy, so the sequence counts as
  // scheduled in this step) and leaves the host tier. When that device block held an
  // evicted cached block, the two trade places (a StepOps::exchange copy): promotions never
  // evict host-tier blocks.
  // With state groups, the hit also ends where every state group holds a checkpoint
  // (saved in an earlier step, verified like a block): the sequence takes a state slot
  // per state group and a StepOps::copy_state restores the checkpoint into it (so it
  // counts as scheduled in this step); a checkpoint found only in the host tier is
  // restored straight from its host slot (a StepOps::promote) and stays in the tier. No
  // free slot: no hit.
  // Errors: NotFound; FailedPrecondition unless the sequence is waiting.
  [[nodiscard]] absl::StatusOr<int32_t> match_prefix(SeqId seq);

  // KvCacheManager::peek_prefix()
  //
  // The hit match_prefix() would claim now, without claiming it (prefix_hit.h): its tokens
  // and, per layer group, the blocks the claim would hold and how many free blocks it
  // would take. Takes no reference, moves no block in the eviction order, records no copy
  // and counts no query: a scheduler decides whether the claim and the prompt's new blocks
  // fit, then calls match_prefix(), which returns num_tokens when nothing changed between
  // the calls. NOTE: with both the host tier and partial-block reuse, a promotion of the
  // claim may evict the block a partial hit would copy, so num_partial_tokens is then an
  // upper bound. With prefix caching off: an empty hit.
  // Errors: NotFound; FailedPrecondition unless the sequence is waiting without blocks
  // (match_prefix()'s).
  [[nodiscard]] absl::StatusOr<PrefixHit> peek_prefix(SeqId seq);

  // KvCacheManager::allocate_slots()
  //
  // Reserves slots for the next `num_new_tokens` tokens of `seq` (those after its computed
  // tokens, which must already be in its token list) plus `num_lookahead` spare slots,
  // marks the new tokens computed, enters newly filled full blocks into the prefix index,
  // and returns the slot mapping (block * block_size + offset) of the new tokens. A shared
  // partially filled last block is copied first (copy-on-write, see
  // take_step_ops()). A waiting sequence's first call is its admission: while
  // another sequence is running it must leave watermark_blocks free (headroom for the
  // running ones to grow); with none running it may use every block, so a sequence
  // preempted after growing past num_blocks - watermark_blocks can always come back.
  // State groups: the admission also takes one state slot per state group (a sequence
  // admitted with no computed tokens starts from the zero state; the engine clears it),
  // and where the new tokens reach a checkpoint position (docs/allocator.md, "State
  // groups") the call records a StepOps::save_state into a new checkpoint slot, if one is
  // free beyond the watermark (checkpoints are best effort; they never fail the call).
  // Errors: NotFound; InvalidArgument (negative counts, more tokens than the sequence
  // has); FailedPrecondition (swapped: call swap_in() first; drafts wait for
  // accept_draft(); or a copy-on-write that would copy tokens whose K/V this step has not
  // written yet); ResourceExhausted when the pool
  // lacks blocks (nothing changes; the caller may preempt and retry).
  [[nodiscard]] absl::StatusOr<std::span<const int64_t>> allocate_slots(SeqId seq,
                                                                        int32_t num_new_tokens,
                                                                        int32_t num_lookahead = 0);

  // KvCacheManager::slot_mapping()
  //
  // The slot mapping of layer group `group` (in [0, num_groups())) from the last
  // allocate_slots() or allocate_slots_or_preempt() call that succeeded: each group's K/V
  // goes into its own pool, so each has its own slots; group 0's is what the call
  // returned. A state group has no slots: its entries are -1. Valid until the next
  // non-const call. Errors: InvalidArgument for a group out of range.
  [[nodiscard]] absl::StatusOr<std::span<const int64_t>> slot_mapping(int32_t group) const;

  // KvCacheManager::allocate_slots_or_preempt()
  //
  // allocate_slots(), making room while the pool lacks blocks: first by releasing the
  // claims of waiting sequences (other than `seq`) that hold a block nobody else holds,
  // lowest priority then latest arrival first (see release_claim(); each calls
  // PreemptionHooks::on_claim_released), then by preempting victims chosen by the victim
  // policy. Candidates are the running sequences other than `seq` that have not been
  // scheduled in this step (see preempt()). Each preemption calls the hooks. Returns
  // ResourceExhausted when no candidate is left or the policy gives up; releases and
  // preemptions made before that stay made.
  [[nodiscard]] absl::StatusOr<std::span<const int64_t>> allocate_slots_or_preempt(
      SeqId seq, int32_t num_new_tokens, int32_t num_lookahead = 0);

  // KvCacheManager::preempt()
  //
  // Preempts a running sequence. Recompute: its blocks are freed (hashed ones stay cached)
  // and it is waiting again with all its tokens to recompute. Swap: host blocks are
  // allocated, swap-out copies recorded, device blocks freed; it is swapped. Calls the
  // hooks. Errors: NotFound; FailedPrecondition unless running, or when the sequence was
  // scheduled in this step (it got slots or was swapped in since the last take_step_ops()):
  // its new K/V is not written yet, so neither a swap-out nor a later prefix hit could
  // read it; ResourceExhausted when the host pool lacks blocks for a swap.
  [[nodiscard]] absl::Status preempt(SeqId seq, PreemptionMode mode);

  // KvCacheManager::swap_in()
  //
  // Moves a swapped sequence back to device blocks, recording swap-in copies and freeing
  // its host blocks. Errors: NotFound; FailedPrecondition unless swapped;
  // ResourceExhausted when device blocks are short (nothing changes).
  [[nodiscard]] absl::Status swap_in(SeqId seq);

  // KvCacheManager::fork()
  //
  // Creates `child` sharing every block that holds `parent`'s computed tokens (ref +1),
  // with the same tokens, computed count, priority and extra keys, and a new arrival.
  // Copy-on-write happens on the next append to a shared partial block.
  // Errors: NotFound (unknown parent); AlreadyExists (child id in use);
  // FailedPrecondition (parent swapped). A child forked from a parent scheduled in this
  // step shares its unwritten tokens: it may append only after the step (see
  // allocate_slots()). State groups: the child takes a slot of its own and a
  // StepOps::copy_state copies the parent's into it; FailedPrecondition when the parent
  // holds a slot and was scheduled in this step (its state is not computed yet: fork
  // after the step), ResourceExhausted when a state group has no free slot.
  [[nodiscard]] absl::Status fork(SeqId parent, SeqId child);

  // KvCacheManager::allocate_draft_slots()
  //
  // Speculative decoding (EAGLE, MTP, n-gram drafts): a step that verifies `draft`, tokens
  // proposed after `seq`'s tokens. Reserves slots for the sequence's next `num_new_tokens`
  // tokens (at least the last sampled one; they must be in its token list, as for
  // allocate_slots()) and for the drafts after them, and returns the slot mapping of all of
  // them (num_new_tokens + draft.size() entries): the engine writes K/V for every one while
  // its target model scores them. The drafts join the token list and count as computed for
  // the step (block tables include them), but none is verified: none is hashed, cached or
  // announced by an event, nor saved as a state checkpoint, until accept_draft() keeps the
  // accepted ones. State groups: each draft token gets a state slot of its own, which
  // receives the state after that token (slot_mapping(g): the entries of the drafts; the
  // other entries are -1: their state is updated in place in the sequence's slot), so that
  // the accepted position's state can be kept. Until accept_draft(), the sequence takes no
  // other call but free() and the lookups.
  // Errors: those of allocate_slots() (ResourceExhausted: nothing changes); InvalidArgument
  // for num_new_tokens < 1, an empty draft, or drafts beyond max_model_len;
  // FailedPrecondition while earlier drafts wait for accept_draft().
  [[nodiscard]] absl::StatusOr<std::span<const int64_t>> allocate_draft_slots(
      SeqId seq, int32_t num_new_tokens, std::span<const TokenId> draft);

  // KvCacheManager::accept_draft()
  //
  // Ends the verification of `seq`'s drafts, after the step that wrote their K/V (after
  // take_step_ops()): the first `num_accepted` stay, verified (full blocks are offered to
  // the prefix cache and announced), and the rest are rolled back: the token list and the
  // computed tokens end after the accepted ones, and the blocks that held only rejected
  // tokens are released (never cached). The K/V of rejected tokens in the last kept block is
  // overwritten by later tokens; a block copied on write by the draft step keeps its copy.
  // State groups: the state after the last accepted token becomes the sequence's (the
  // slot of that draft, or its own slot when none is accepted); the other slots are
  // released. Checkpoints are not saved at positions that were drafts.
  // Errors: NotFound; FailedPrecondition when the sequence holds no drafts, or when the
  // step that writes them has not ended; InvalidArgument for num_accepted outside
  // [0, number of drafts].
  [[nodiscard]] absl::Status accept_draft(SeqId seq, int32_t num_accepted);

  // Disaggregated prefill and decode (pagedkv/kv_handoff.h has the flow on both ends).
  //
  // KvCacheManager::export_sequence()
  //
  // The sender's side: hands `seq`'s computed K/V to another engine. Returns the entries
  // of each layer group it held and ends the sequence here as free() does, except that
  // those blocks stay pinned (held: never evicted, reused or written) until
  // release_export(seq), so that the engine can send their bytes. Full blocks stay in the
  // prefix cache. Call it after the step that computed the K/V ended (after
  // take_step_ops()).
  // Errors: NotFound; FailedPrecondition unless the sequence is running with computed
  // tokens, none of them drafts or imports, and its step has ended; AlreadyExists while an
  // export of `seq` is pinned.
  [[nodiscard]] absl::StatusOr<KvExport> export_sequence(SeqId seq);

  // KvCacheManager::release_export()
  //
  // Unpins the blocks of `seq`'s export once the receiver answered (or the transfer
  // failed, timed out or was cancelled, and the transport no longer reads them): they are
  // released tail first, cached ones staying cached.
  // Errors: NotFound when `seq` has no export pinned.
  [[nodiscard]] absl::Status release_export(SeqId seq);

  // KvCacheManager::import_slots()
  //
  // The receiver's side: admits waiting sequence `seq` (after add_sequence(), and
  // match_prefix() for the tokens its own cache holds) with its first `num_tokens` tokens
  // computed elsewhere, as allocate_slots() admits a prompt, and returns the entries of
  // each layer group that a transfer must fill: those past the local prefix hit (a
  // windowed group: those of the window at num_tokens, the only ones it allocates, so a
  // prompt longer than its pool imports; held hits behind it are released at once; a
  // state group: the state slot). The engine starts the transfer into those blocks only
  // after running this step's ops (take_step_ops()): a copy may still read or write them.
  // Until complete_import() the imported tokens count as computed but none is verified
  // (hashed, cached, announced or checkpointed) and the sequence takes no call but
  // complete_import(), free() and the lookups: no kernel reads a pending import (block
  // tables refuse it), and no preemption picks it. free() releases it uncached once the
  // transfer is over or cancelled.
  // Errors: those of allocate_slots() for num_tokens - match_prefix() new tokens, a
  // windowed group counting its window's blocks only (ResourceExhausted: nothing
  // changes); InvalidArgument for num_tokens outside
  // (tokens claimed, tokens]; FailedPrecondition unless the sequence is waiting.
  [[nodiscard]] absl::StatusOr<KvImport> import_slots(SeqId seq, int32_t num_tokens);

  // KvCacheManager::complete_import()
  //
  // Ends `seq`'s import, in a step after import_slots() (after take_step_ops()):
  // `verified_blocks[g]` is how many leading entries of group g's KvImport arrived
  // verified (KvReceiveCompletion::verified_prefix(g)). Returns p, the tokens that count
  // as computed: the longest prefix that every group serves from its local and verified
  // entries (a full group: every entry before p; a windowed group: those of the window at
  // p; a state group: its slot, so p is 0 or every token when there is one). The full
  // blocks before p are verified (cached and announced); the blocks past p are released
  // uncached, and the sequence computes tokens [p, tokens) like a prefilling one; with p
  // == 0 it is waiting again, holding nothing, like one preempted by recompute.
  // Errors: NotFound; FailedPrecondition when no import is pending, or in the step of
  // import_slots(); InvalidArgument when verified_blocks does not hold one count per group
  // within [0, the group's import entries].
  [[nodiscard]] absl::StatusOr<int32_t> complete_import(SeqId seq,
                                                        std::span<const int32_t> verified_blocks);

  // KvCacheManager::release_claim()
  //
  // Gives back the cached prefix a waiting sequence claimed with match_prefix(): its
  // blocks are released tail first (cached ones stay cached and may be claimed again) and
  // its computed count returns to 0. A waiting sequence without a claim is unchanged.
  // Use it to make room for running sequences while a request waits.
  // Errors: NotFound; FailedPrecondition unless the sequence is waiting.
  [[nodiscard]] absl::Status release_claim(SeqId seq);

  // KvCacheManager::free()
  //
  // Releases a sequence in any state, returning its blocks tail first so that its later
  // blocks are evicted before its (more shared) beginning. Hashed blocks stay cached,
  // except blocks it filled in this step and holds alone: their K/V may never be written.
  // NOTE: an engine computes every sequence it scheduled in a step; free (abort) it after.
  // Errors: NotFound.
  [[nodiscard]] absl::Status free(SeqId seq);

  // KvCacheManager::allocate_slots_batch()
  //
  // allocate_slots() (or allocate_slots_or_preempt() when `preempt`) for every sequence of
  // `seqs`, in order, in one call: a decode step is append_tokens_batch() and this.
  // `num_new_tokens` holds one count per sequence, or one count for all (1 for a decode
  // step). Each sequence succeeds or fails on its own, as the single call would; a
  // sequence that an earlier entry of the batch preempted fails with FailedPrecondition
  // instead of being admitted again. The result's spans are valid until the next
  // non-const call. Errors (nothing changes): InvalidArgument when num_new_tokens has
  // neither 1 nor seqs.size() entries, or a count above max_model_len.
  struct SlotBatch {
    // The sequences' slot mappings concatenated, max(count, 0) entries each; -1 in the
    // entries of a sequence that failed.
    std::span<const int64_t> slots;
    std::span<const absl::Status> statuses;  // per sequence
    int32_t num_failed = 0;
  };
  [[nodiscard]] absl::StatusOr<SlotBatch> allocate_slots_batch(
      std::span<const SeqId> seqs, std::span<const int32_t> num_new_tokens,
      int32_t num_lookahead = 0, bool preempt = false);

  // KvCacheManager::batch_slot_mapping()
  //
  // The slots of layer group `group` from the last allocate_slots_batch() call, laid out as
  // its SlotBatch::slots (which are group 0's). Valid until the next non-const call.
  // Errors: InvalidArgument for a group out of range.
  [[nodiscard]] absl::StatusOr<std::span<const int64_t>> batch_slot_mapping(int32_t group) const;

  // KvCacheManager::append_tokens_batch()
  //
  // append_tokens() for every sequence of `seqs`: one token each (tokens[i] for sequence
  // i) when `indptr` is empty, else tokens[indptr[i], indptr[i + 1]). Returns the status
  // of each, valid until the next non-const call. Errors (nothing changes):
  // InvalidArgument when tokens (without indptr) or indptr (seqs.size() + 1 entries) has
  // the wrong size, or an indptr range is not a range of `tokens`.
  [[nodiscard]] absl::StatusOr<std::span<const absl::Status>> append_tokens_batch(
      std::span<const SeqId> seqs, std::span<const TokenId> tokens,
      std::span<const int32_t> indptr = {});

  // KvCacheManager::allocate_draft_slots_batch()
  //
  // allocate_draft_slots() for every sequence of `seqs`, in order, in one call: a
  // speculative step is append_tokens_batch() and this, then accept_draft_batch() after
  // it. Sequence i computes its num_new_tokens[i] (one count per sequence, or one for all)
  // and verifies drafts draft_tokens[draft_indptr[i], draft_indptr[i + 1]). Each succeeds
  // or fails on its own, as the single call would. The result's slots hold count + drafts
  // entries per sequence (-1 in those of a failed one), group 0's; batch_slot_mapping(g)
  // gives the other groups' in the same layout. Errors (nothing changes): InvalidArgument
  // when num_new_tokens has neither 1 nor seqs.size() entries, draft_indptr is not
  // seqs.size() + 1 ascending offsets into draft_tokens, or a count is above max_model_len.
  [[nodiscard]] absl::StatusOr<SlotBatch> allocate_draft_slots_batch(
      std::span<const SeqId> seqs, std::span<const int32_t> num_new_tokens,
      std::span<const TokenId> draft_tokens, std::span<const int32_t> draft_indptr);

  // KvCacheManager::accept_draft_batch()
  //
  // accept_draft(seqs[i], num_accepted[i]) for every sequence, after the step that wrote
  // the drafts. Returns the status of each, valid until the next non-const call. Errors
  // (nothing changes): InvalidArgument when num_accepted has not seqs.size() entries.
  [[nodiscard]] absl::StatusOr<std::span<const absl::Status>> accept_draft_batch(
      std::span<const SeqId> seqs, std::span<const int32_t> num_accepted);

  // KvCacheManager::take_step_ops()
  //
  // Ends the step: returns every copy recorded since the last call (swap and host-tier
  // copies, copy-on-write), in the lists of StepOps. Run them every step, in StepOps'
  // order, before the step's K/V writes (KvStorage::run_step_ops() does). Sequences
  // scheduled before the call count as computed from then on (they may be preempted or
  // forked again), and blocks released while a pending copy still named them (a
  // copy-on-write source whose sibling finished, a host block a swap-in or promotion
  // reads or a demotion fills) are free again.
  [[nodiscard]] StepOps take_step_ops();

  // KvCacheManager::build_block_tables()
  //
  // Fills `out` (padded and CSR) for `seqs` in order with their tables of layer group
  // `group` (an attention group: a state group's are write_state_slots()), using each
  // sequence's computed tokens as its context length. A windowed
  // group's released entries (before the window of the next token) hold kPaddingBlock:
  // kernels start reading at first_attended() of their queries, so they never read them.
  // Reuses out's buffers. Errors: NotFound; FailedPrecondition for a sequence that is not
  // running; InvalidArgument for a null `out`, a group out of range or a state group.
  [[nodiscard]] absl::Status build_block_tables(std::span<const SeqId> seqs, BlockTables* out,
                                                int32_t group = 0) const;

  // Same, into caller-provided buffers: block_table [seqs.size(), max_blocks], context_lens
  // [seqs.size()]. Errors as above, and InvalidArgument when a buffer is too small or a
  // sequence needs more than max_blocks entries.
  [[nodiscard]] absl::Status write_block_tables(std::span<const SeqId> seqs, int32_t max_blocks,
                                                std::span<int32_t> block_table,
                                                std::span<int32_t> context_lens,
                                                int32_t group = 0) const;

  // Same in CSR form: indptr [seqs.size() + 1], indices [total blocks], last_page_len
  // [seqs.size()].
  [[nodiscard]] absl::Status write_csr_block_tables(std::span<const SeqId> seqs,
                                                    std::span<int32_t> indptr,
                                                    std::span<int32_t> indices,
                                                    std::span<int32_t> last_page_len,
                                                    int32_t group = 0) const;

  // KvCacheManager::write_state_slots()
  //
  // The state slot of each running sequence of `seqs` in state group `group`, into `out`
  // (seqs.size() entries): where a state-space kernel reads and updates each sequence's
  // state (vLLM's state indices). Errors: NotFound; FailedPrecondition for a sequence that
  // is not running; InvalidArgument for a group out of range or not a state group, or an
  // `out` too small. Nothing is written on error.
  [[nodiscard]] absl::Status write_state_slots(std::span<const SeqId> seqs, int32_t group,
                                               std::span<int32_t> out) const;

  // KvCacheManager::reset_prefix_cache()
  //
  // A flush: empties the prefix index of both tiers (see BlockPool::reset_prefix_cache()),
  // and no K/V computed before it is ever shared after it. Sequences that hold computed tokens keep
  // running on their blocks, but none of their blocks is indexed again, including blocks
  // they fill later, swap back in or pass to forks, until they are recomputed from
  // scratch (preempted by recompute, or their claim released). Emits AllBlocksCleared.
  void reset_prefix_cache();

  // Lookups. sequence(): its table of layer group `group` (NotFound; InvalidArgument for
  // a group out of range).
  bool contains(SeqId seq) const;
  [[nodiscard]] absl::StatusOr<SequenceView> sequence(SeqId seq, int32_t group = 0) const;
  int32_t num_sequences() const;
  // Running sequences, in arrival order.
  std::vector<SequenceInfo> running_sequences() const;
  Stats stats() const;
  const Options& options() const;
  // The layer groups and their pools and figures. Errors: InvalidArgument for a group
  // outside [0, num_groups()). The pools stay valid while the manager lives.
  int32_t num_groups() const;
  [[nodiscard]] absl::StatusOr<LayerGroup> layer_group(int32_t group) const;
  [[nodiscard]] absl::StatusOr<GroupStats> group_stats(int32_t group) const;
  [[nodiscard]] absl::StatusOr<const BlockPool*> device_pool(int32_t group = 0) const;
  [[nodiscard]] absl::StatusOr<const BlockPool*> host_pool(int32_t group = 0) const;

  // Checks every invariant of DESIGN.md and of both pools, clause by clause: ref counts
  // equal table entries per block, table lengths cover computed tokens, hashed blocks hold
  // their sequence's hashes, states agree with held blocks, host pool balanced, pending
  // copies hold the blocks they name, host-tier blocks held by no sequence. Returns
  // Internal naming the first broken clause and its values.
  [[nodiscard]] absl::Status check_invariants() const;

 private:
  explicit KvCacheManager(std::unique_ptr<internal::CacheCoordinator> core);

  // The coordinator of the layer groups (src/cache/cache_coordinator.h) does the work.
  std::unique_ptr<internal::CacheCoordinator> core_;
};

}  // namespace pagedkv

#endif  // PAGEDKV_KV_CACHE_MANAGER_H_
