// Internal: one layer group's part of the KV cache (pagedkv/layer_group.h), and what the
// groups share with the coordinator (SharedState).
//
// Every group has a device pool and a host pool of its own, with blocks of its own layers'
// bytes, and its own host tier; the step ledger is shared (one step for all groups). A
// sequence holds one table per group (Sequence::tables), of the same block size, so entry
// i of every table holds the same tokens.
//
// GroupCache is the interface of a kind: which blocks a sequence needs (admission, a
// step's plan), where a prefix hit may end, how a hit is claimed, what is offered to the
// prefix index, how a sequence's blocks are released, swapped and checked. One class per
// kind answers:
//   FullAttentionGroup  every block of the context; hits are its verified chain
//                       (full_attention_group.h). The first full group is the anchor:
//                       the others verify their blocks along its chain.
//   WindowedGroup       sliding window and chunked local: the blocks from the window of
//                       the next token on; the rest is released (windowed_group.h).
//   StateGroup          state-space layers: one state slot per sequence, checkpoints of it
//                       at block boundaries as its cached blocks (state_group.h).
// The attention kinds share their K/V tables' mechanics (AttentionGroup,
// attention_group.h). CacheCoordinator (cache_coordinator.h) gives each group the same
// calls in turn and intersects their answers.
#ifndef PAGEDKV_CACHE_GROUP_CACHE_H_
#define PAGEDKV_CACHE_GROUP_CACHE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "cache/host_tier.h"
#include "cache/sequence.h"
#include "cache/step_ledger.h"
#include "pagedkv/block_pool.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_handoff.h"
#include "pagedkv/layer_group.h"
#include "pagedkv/prefix_hit.h"
#include "pool/block_pool_core.h"

namespace pagedkv::internal {

// What the coordinator and every group share: the manager's options, the step, the
// manager-wide counters and how many sequences run (the watermark applies while some do).
struct SharedState {
  SharedState(KvCacheManager::Options manager_options, int32_t num_groups)
      : options(std::move(manager_options)),
        block_size(options.block_size),
        num_groups(num_groups) {}

  const KvCacheManager::Options options;
  const int32_t block_size;
  const int32_t num_groups;
  StepLedger ledger;               // sized once every group's pools exist
  KvCacheManager::Stats counters;  // the manager's own; stats() adds the pools' and tiers'
  int32_t num_running = 0;         // sequences in state kRunning
  uint64_t batch_id = 0;           // counts batched calls (Sequence::preempted_batch)
  std::vector<BlockId> scratch_blocks;
  // export_sequence(): per exported sequence, the entries of each group it pinned.
  absl::flat_hash_map<SeqId, std::vector<KvHandoffGroup>> pins;
  // Options::shared_block_pool: the device pool of every group, once the first group
  // built it (make_group_cache()).
  std::shared_ptr<BlockPool> shared_device;
  BlockPoolCore* shared_device_core = nullptr;
};

// What allocate_slots() asks of every group: the same step for all.
struct StepRequest {
  int32_t num_new_tokens = 0;
  int64_t new_total = 0;     // computed tokens after the step
  int64_t slots_total = 0;   // new_total + lookahead: the slots the table must reach
  int64_t total_blocks = 0;  // entries those need
  int32_t write_block = 0;   // the entry the first new token goes into
  int32_t partial = 0;       // tokens already in it
  bool admission = false;    // the sequence was waiting: the watermark applies
  int32_t num_draft = 0;     // of the new tokens, the last ones that are drafts
  bool import = false;       // the new tokens' K/V comes from a transfer (import_slots())
};

// What allocate_slots() does in one group, decided before anything changes.
struct GroupPlan {
  int32_t release_end = 0;  // windowed: entries before it are released
  // Windowed import: entries after the table's end, behind the window at the import's
  // end, that the table gets unheld (kNoBlock) instead of allocated.
  int32_t skipped = 0;
  int32_t freed = 0;  // windowed: blocks the release frees (held by no one else)
  int64_t held = 0;   // entries the table holds after the step
  int32_t new_blocks = 0;
  bool copy_on_write = false;
};

// A group's two pools: the public faces (KvCacheManager::device_pool()) and the cores the
// manager drives. The device pool is the group's own, or with Options::shared_block_pool
// every group's.
struct GroupPools {
  std::shared_ptr<BlockPool> device;
  BlockPool host;
  BlockPoolCore* device_core = nullptr;
  BlockPoolCore* host_core = nullptr;
};

// What a group is built from (make_group_cache(), group_factory.h).
struct GroupParts {
  LayerGroup spec;
  int32_t index = 0;             // its place in the manager's groups
  int32_t watermark_blocks = 0;  // Options::watermark_blocks, scaled to the group's pool
  GroupPools pools;
  std::unique_ptr<HostTier> host_tier;  // null without Options::enable_host_cache
};

class GroupCache {
 public:
  GroupCache(GroupParts parts, SharedState& shared);
  GroupCache(const GroupCache&) = delete;
  GroupCache& operator=(const GroupCache&) = delete;
  virtual ~GroupCache();

  const LayerGroup& spec() const { return spec_; }
  AttentionKind kind() const { return spec_.kind; }
  int32_t index() const { return index_; }
  int32_t watermark_blocks() const { return watermark_blocks_; }
  const BlockPool& device_pool() const { return *pools_.device; }
  const BlockPool& host_pool() const { return pools_.host; }
  BlockPoolCore& device() { return *pools_.device_core; }
  BlockPoolCore& host() { return *pools_.host_core; }
  const BlockPoolCore& device() const { return *pools_.device_core; }
  const BlockPoolCore& host() const { return *pools_.host_core; }
  HostTier* host_tier() { return host_tier_.get(); }
  const HostTier* host_tier() const { return host_tier_.get(); }
  // The group's pools and cache traffic.
  KvCacheManager::GroupStats stats() const;
  // The key space of this group's hashes in its device pool: its own in a shared pool
  // (PoolRoles::key_spaces), the only one otherwise.
  int32_t key_space() const { return shared_.options.shared_block_pool ? index_ : 0; }
  GroupTable& table(Sequence& seq) const { return seq.tables[index_]; }
  const GroupTable& table(const Sequence& seq) const { return seq.tables[index_]; }

  // --- admission -------------------------------------------------------------------------
  // The blocks a sequence of `prompt_tokens` needs here to compute one token, once alone in
  // the pool: add_sequence() refuses a prompt that needs more than the pool has.
  virtual int64_t blocks_to_run(int64_t prompt_tokens) const = 0;

  // --- prefix hits (match_prefix) --------------------------------------------------------
  // Starts a match of at most `max_blocks` blocks of `seq`; returns the most this group
  // can serve without looking at the others (the anchor verifies its chain here, before
  // any group's longest_hit()).
  virtual int32_t begin_match(const Sequence& seq, int32_t max_blocks) = 0;
  // The longest hit of at most `p` blocks that this group can serve. Changes nothing.
  virtual int32_t longest_hit(const Sequence& seq, int32_t p) = 0;

  // --- a step (allocate_slots) -------------------------------------------------------------
  // Decides what `step` does here, or the error that refuses the call. Changes nothing.
  virtual absl::Status plan_step(const Sequence& seq, const StepRequest& step,
                                 GroupPlan& plan) const = 0;
  // Carries out the releases of `plan` (a windowed group's entries behind the window):
  // before any group's apply_step(), so that a pool the groups share has their blocks back
  // first.
  virtual void release_before_step(Sequence&, const GroupPlan&) {}
  // Carries the rest of `plan` out and writes the new tokens' slots into `slots` (-1
  // without slots).
  virtual void apply_step(Sequence& seq, const StepRequest& step, const GroupPlan& plan,
                          std::span<int64_t> slots) = 0;

  // --- fork, release, swap -----------------------------------------------------------------
  // Why `parent` cannot be forked here now (OK: it can).
  virtual absl::Status check_fork(const Sequence& parent, const char* caller) const = 0;
  // Gives `child`, a copy of its parent holding `context_blocks` entries of computed
  // tokens, its own references (or slot).
  virtual void fork(Sequence& child, int32_t context_blocks) = 0;
  // Releases `seq`'s device blocks (tail first, as one free; hashed ones stay cached).
  void release(Sequence& seq);
  // Releases `seq`'s host blocks (a swapped sequence's).
  void release_host(Sequence& seq);
  // Releases the table's draft slots (a state group's, allocate_draft_slots()).
  void release_draft_slots(GroupTable& t);
  // The entries of `seq`'s table a swap copies to host blocks, and the valid tokens of
  // entry i in such a copy.
  virtual int32_t held_entries(const Sequence& seq) const = 0;
  virtual int32_t entry_tokens(const Sequence& seq, int32_t entry) const = 0;
  // Swap-out: copies `seq`'s held entries to host blocks (the host pool must have
  // held_entries() free) and releases its device blocks; the table keeps first_held.
  void swap_out(Sequence& seq);
  // Swap-in: back into device blocks (as many free as host blocks held).
  void swap_in(Sequence& seq);
  // Whether releasing `seq`'s table frees a block: one it alone holds.
  bool holds_a_block_alone(const Sequence& seq) const;
  // accept_draft() or complete_import(): `seq`'s unverified tokens are judged, its computed
  // tokens already cut after the kept ones (`num_accepted` of its drafts; 0 for an
  // import): releases what held only the others.
  virtual void roll_back(Sequence& seq, int32_t num_accepted) = 0;

  // --- hand-offs (export_sequence(), import_slots(), complete_import()) --------------------
  // The entries `seq` holds for its computed tokens, which an export pins.
  virtual KvHandoffGroup export_entries(const Sequence& seq) const = 0;
  // import_slots(), once the import's slots are allocated: releases the entries the import
  // does not fill and no later token needs.
  virtual void release_unimported(Sequence& seq);
  // The entries `seq`'s pending import fills.
  virtual KvHandoffGroup import_entries(const Sequence& seq) const = 0;
  // Whether this group serves the import's first `p` tokens once the first `verified` of
  // its import_entries() arrived intact: every entry a token at p needs is local or among
  // those.
  virtual bool serves_import(const Sequence& seq, int32_t p, int32_t verified) const = 0;
  // Releases `blocks`, held once more each (an export's pins), tail first as one free.
  void release_blocks(std::span<const BlockId> blocks);

  // --- the anchor's chain ----------------------------------------------------------------
  // Drops the cached blocks entered after the contents `content_key` names, which left the
  // anchor's pools: no hit can verify them again (groups that verify along the anchor).
  void forget_children(uint64_t content_key);

  // --- checks ----------------------------------------------------------------------------
  // `seq`'s table here agrees with its state and computed tokens.
  virtual absl::Status check_table(const Sequence& seq) const = 0;
  // Ref counts of the device or host pool equal the holds of the tables, pending copies and
  // pins of `sharers`, the groups whose blocks it holds (this one, or every group of a
  // shared pool); a block of a shared pool is held by one group only.
  absl::Status check_pool_balance(std::span<const Sequence* const> sequences, bool host,
                                  std::span<const GroupCache* const> sharers) const;
  // The pools, the host tier, and host-tier blocks held by no sequence. The device pool's
  // balance is that of `device_sharers`, unchecked when empty (a shared pool's is checked
  // once, with its first group).
  absl::Status check_pools(std::span<const Sequence* const> sequences,
                           std::span<const GroupCache* const> device_sharers) const;

 protected:
  // Whether release() gives `seq`'s entries a retention (set_release_retention()) first.
  virtual bool retains_on_release(const Sequence& seq) const;
  // The retention of `seq`'s entry as it releases it.
  virtual void set_release_retention(const Sequence& seq, int32_t entry);
  // Device allocation with the host tier's side: cached blocks it evicts are demoted.
  void allocate_device_blocks(std::span<BlockId> out);
  // Free device blocks this group may fill with promotions once `free_hits` free blocks
  // are shared: the watermark stays free while others run.
  int32_t room(int32_t free_hits) const;
  // " in group g" for models of several groups: messages of one-group models stay as
  // they were.
  std::string in_group() const;
  HostTier::Pools tier_pools() { return {device(), host(), shared_.ledger, index_}; }

  SharedState& shared_;
  KvCacheManager::GroupStats counters_;  // hits, window releases, checkpoints

 private:
  const LayerGroup spec_;
  const int32_t index_;
  const int32_t watermark_blocks_;
  GroupPools pools_;
  std::unique_ptr<HostTier> host_tier_;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_GROUP_CACHE_H_
