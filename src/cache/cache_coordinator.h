// Internal: what KvCacheManager (pagedkv/kv_cache_manager.h) is: the coordinator of the
// layer groups. It owns the sequences and the state every group shares (SharedState: the
// step ledger, counters), validates every call before anything changes, and gives each
// group the same calls in turn, intersecting their answers:
//   - a prefix hit is the longest that every group can serve: the full groups' verified
//     chains, cut by the windowed and state groups until a whole round agrees;
//   - a step's slots succeed only when every group can plan them;
//   - forks, frees, preemptions and swaps go to every group.
// Which blocks a group needs and where its hits may end is the group's kind's
// (group_cache.h). A model without layer groups is one full-attention group, served by
// the decode step's fast path (decode_in_place()) without a group call.
//
// Files: cache_coordinator.cc (sequences, slots, forks, frees, the step, lookups),
// prefix_match.cc (hits, offers, the flush), preemption.cc (claims, preemption, swaps),
// drafts.cc (speculative decoding), handoff.cc (exports and imports), batched_calls.cc,
// block_tables.cc, invariants.cc, create.cc.
#ifndef PAGEDKV_CACHE_CACHE_COORDINATOR_H_
#define PAGEDKV_CACHE_CACHE_COORDINATOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/attention_group.h"
#include "cache/full_attention_group.h"
#include "cache/group_cache.h"
#include "cache/sequence.h"
#include "cache/state_group.h"
#include "cache/step_ledger.h"
#include "common/check.h"
#include "pagedkv/kv_cache_manager.h"

namespace pagedkv::internal {

class CacheCoordinator {
 public:
  using Options = KvCacheManager::Options;

  // Validates `options` (KvCacheManager::create()'s errors) and builds every group's pools.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CacheCoordinator>> create(Options options);
  CacheCoordinator(Options options, std::span<const LayerGroup> layer_groups);
  CacheCoordinator(const CacheCoordinator&) = delete;
  CacheCoordinator& operator=(const CacheCoordinator&) = delete;
  ~CacheCoordinator();

  // KvCacheManager's calls, with its contracts.
  absl::Status add_sequence(SeqId seq, std::span<const TokenId> prompt, SequenceOptions options);
  absl::Status append_tokens(SeqId seq, std::span<const TokenId> tokens);
  absl::StatusOr<int32_t> match_prefix(SeqId seq);
  absl::StatusOr<PrefixHit> peek_prefix(SeqId seq);
  absl::StatusOr<std::span<const int64_t>> allocate_slots(SeqId seq, int32_t num_new_tokens,
                                                          int32_t num_lookahead);
  absl::StatusOr<std::span<const int64_t>> slot_mapping(int32_t group) const;
  absl::StatusOr<std::span<const int64_t>> allocate_draft_slots(SeqId seq, int32_t num_new_tokens,
                                                                std::span<const TokenId> draft);
  absl::Status accept_draft(SeqId seq, int32_t num_accepted);
  absl::StatusOr<KvExport> export_sequence(SeqId seq);
  absl::Status release_export(SeqId seq);
  absl::StatusOr<KvImport> import_slots(SeqId seq, int32_t num_tokens);
  absl::StatusOr<int32_t> complete_import(SeqId seq, std::span<const int32_t> verified_blocks);
  absl::StatusOr<std::span<const int64_t>> allocate_slots_or_preempt(SeqId seq,
                                                                     int32_t num_new_tokens,
                                                                     int32_t num_lookahead);
  absl::Status preempt(SeqId seq, PreemptionMode mode);
  absl::Status swap_in(SeqId seq);
  absl::Status fork(SeqId parent, SeqId child);
  absl::Status release_claim(SeqId seq);
  absl::Status free(SeqId seq);
  absl::StatusOr<KvCacheManager::SlotBatch> allocate_slots_batch(
      std::span<const SeqId> seqs, std::span<const int32_t> num_new_tokens, int32_t num_lookahead,
      bool preempt);
  absl::StatusOr<std::span<const int64_t>> batch_slot_mapping(int32_t group) const;
  absl::StatusOr<std::span<const absl::Status>> append_tokens_batch(
      std::span<const SeqId> seqs, std::span<const TokenId> tokens,
      std::span<const int32_t> indptr);
  absl::StatusOr<KvCacheManager::SlotBatch> allocate_draft_slots_batch(
      std::span<const SeqId> seqs, std::span<const int32_t> num_new_tokens,
      std::span<const TokenId> draft_tokens, std::span<const int32_t> draft_indptr);
  absl::StatusOr<std::span<const absl::Status>> accept_draft_batch(
      std::span<const SeqId> seqs, std::span<const int32_t> num_accepted);
  StepOps take_step_ops();
  absl::Status build_block_tables(std::span<const SeqId> seqs, BlockTables* out,
                                  int32_t group) const;
  absl::Status write_block_tables(std::span<const SeqId> seqs, int32_t max_blocks,
                                  std::span<int32_t> block_table, std::span<int32_t> context_lens,
                                  int32_t group) const;
  absl::Status write_csr_block_tables(std::span<const SeqId> seqs, std::span<int32_t> indptr,
                                      std::span<int32_t> indices, std::span<int32_t> last_page_len,
                                      int32_t group) const;
  absl::Status write_state_slots(std::span<const SeqId> seqs, int32_t group,
                                 std::span<int32_t> out) const;
  void reset_prefix_cache();

  bool contains(SeqId seq) const { return find(seq) != nullptr; }
  absl::StatusOr<SequenceView> sequence(SeqId seq, int32_t group) const;
  int32_t num_sequences() const { return static_cast<int32_t>(sequences_.size()); }
  std::vector<SequenceInfo> running_sequences() const;
  KvCacheManager::Stats stats() const;
  const Options& options() const { return shared_.options; }
  int32_t num_groups() const { return shared_.num_groups; }
  absl::StatusOr<LayerGroup> layer_group(int32_t group) const;
  absl::StatusOr<KvCacheManager::GroupStats> group_stats(int32_t group) const;
  absl::StatusOr<const BlockPool*> device_pool(int32_t group) const;
  absl::StatusOr<const BlockPool*> host_pool(int32_t group) const;
  absl::Status check_invariants() const;

 private:
  Sequence* find(SeqId seq) const {
    const auto it = sequences_.find(seq);
    return it == sequences_.end() ? nullptr : it->second.get();
  }
  absl::StatusOr<Sequence*> find_or_error(SeqId seq, const char* caller) const;
  absl::Status too_long_to_append(const Sequence& seq, size_t num_tokens) const;
  // FailedPrecondition for a call that `seq`'s drafts or import, waiting for their
  // verdict, forbid.
  static absl::Status verdict_wait(const Sequence& seq, const char* caller);
  absl::Status check_group(int32_t group, const char* caller) const;
  absl::Status add_groups(std::span<const LayerGroup> layer_groups);  // create.cc
  // Slots.
  // `num_draft`: of the new tokens, the last ones are drafts (allocate_draft_slots());
  // `import`: all of them are imported (import_slots()).
  absl::StatusOr<std::span<const int64_t>> allocate_slots_impl(Sequence& seq,
                                                               int32_t num_new_tokens,
                                                               int32_t num_lookahead,
                                                               int32_t num_draft = 0,
                                                               bool import = false);
  absl::Status check_shared_fit(const Sequence& seq, const StepRequest& step) const;
  absl::StatusOr<std::span<const int64_t>> allocate_or_preempt_impl(Sequence& seq,
                                                                    int32_t num_new_tokens,
                                                                    int32_t num_lookahead);
  absl::StatusOr<std::span<const int64_t>> allocate_draft_slots_impl(
      Sequence& seq, int32_t num_new_tokens, std::span<const TokenId> draft);
  // Batched calls (batched_calls.cc): a batch's counts, one per sequence or one for all,
  // each at most max_model_len; then sequence i gets entries(i) slots from allocate(i,
  // its Sequence), as the single call `caller` gives them.
  absl::Status check_batch_counts(const char* caller, std::span<const SeqId> seqs,
                                  std::span<const int32_t> counts) const;
  template <typename Entries, typename Allocate>
  absl::StatusOr<KvCacheManager::SlotBatch> slot_batch(std::span<const SeqId> seqs,
                                                       const char* batch_caller, const char* caller,
                                                       Entries entries, Allocate allocate);
  int64_t decode_in_place(Sequence& seq);
  void set_state(Sequence& seq, SequenceState state);
  // Prefix matching (prefix_match.cc).
  absl::StatusOr<Sequence*> matchable(SeqId seq, const char* caller) const;
  int32_t find_hit(const Sequence& seq, int32_t max_blocks, int32_t* chain_end);
  int32_t find_partial(const Sequence& seq, int32_t hit, std::span<const int32_t> taken);
  int32_t reuse_partial_block(Sequence& seq, int32_t hit);
  void offer_computed_blocks(Sequence& seq);
  void save_checkpoints(Sequence& seq, int32_t old_computed);
  void bury_dead_contents();
  // Releases and preemption (preemption.cc).
  void release(Sequence& seq);
  void uncache_unwritten(Sequence& seq);
  std::optional<Preemption> choose_victim(SeqId requester) const;
  bool release_one_claim(SeqId requester);
  void drop_claim(Sequence& seq);
  absl::Status swap_out(Sequence& seq);
  // Block tables (block_tables.cc).
  absl::StatusOr<const Sequence*> running_sequence(SeqId seq, const char* caller) const;
  absl::Status resolve_running(std::span<const SeqId> seqs, const char* caller) const;
  absl::Status check_attention_group(int32_t group, const char* caller) const;
  void fill_padded(int32_t group, int32_t max_blocks, std::span<int32_t> block_table,
                   std::span<int32_t> context_lens) const;
  void fill_csr(int32_t group, std::span<int32_t> indptr, std::span<int32_t> indices,
                std::span<int32_t> last_page_len) const;
  // Hand-offs (handoff.cc): the longest prefix of an import every group serves.
  int32_t servable_import_prefix(const Sequence& seq,
                                 std::span<const int32_t> verified_blocks) const;
  // Invariants (invariants.cc).
  absl::Status check_exclusive_block(const Sequence& s) const;

  SharedState shared_;
  // Every group in the manager's order, and the same groups by role.
  std::vector<std::unique_ptr<GroupCache>> groups_;
  std::vector<AttentionGroup*> attention_;    // the attention groups
  std::vector<AttentionGroup*> offer_order_;  // the full groups, then the windowed ones
  FullAttentionGroup* anchor_ = nullptr;      // the first full group, or null
  std::vector<GroupCache*> followers_;        // groups that verify along the anchor's chain
  std::vector<StateGroup*> state_;
  // A one-group full-attention model's device pool: the decode step's fast path serves it.
  const BlockPoolCore* sole_full_pool_ = nullptr;
  bool windowed_ = false;  // some group is windowed
  // Windowed blocks or checkpoints verify after the anchor's: bury_dead_contents() after
  // each change.
  bool buries_ = false;
  absl::flat_hash_map<SeqId, std::unique_ptr<Sequence>> sequences_;
  // The sequence of the last append_tokens(): a decode step's allocate_slots() of that
  // sequence follows it, and skips the second lookup. Cleared by free().
  SeqId last_appended_id_ = 0;
  Sequence* last_appended_ = nullptr;
  int64_t next_arrival_ = 0;
  // Slots of the last allocate_slots() call, group after group (see slot_mapping()).
  std::vector<int64_t> slot_mapping_;
  std::vector<GroupPlan> plans_;
  // The batch of the block-table call in progress, resolved once by resolve_running().
  mutable std::vector<const Sequence*> batch_;
  // Results of the batched call in progress.
  std::vector<int64_t> batch_slots_;  // group after group (see batch_slot_mapping())
  std::vector<absl::Status> batch_statuses_;
  std::vector<uint64_t> dead_;  // scratch of bury_dead_contents()
};

// The hot calls of a decode step, inline so that KvCacheManager's forwarding costs nothing.

inline absl::Status CacheCoordinator::append_tokens(SeqId seq, std::span<const TokenId> tokens) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  Sequence* s = find(seq);  // hot: one lookup, no StatusOr on the way
  if (s == nullptr) [[unlikely]]
    return find_or_error(seq, "append_tokens").status();
  if (awaits_verdict(*s)) [[unlikely]]
    return verdict_wait(*s, "append_tokens");
  last_appended_id_ = seq;
  last_appended_ = s;
  if (static_cast<int64_t>(s->tokens.size()) + static_cast<int64_t>(tokens.size()) >
      shared_.options.max_model_len) [[unlikely]] {
    return too_long_to_append(*s, tokens.size());
  }
  // push_back, not a range insert: a decode step appends one token, and a range insert
  // of one element costs a memmove call.
  for (const TokenId t : tokens) s->tokens.push_back(t);
  return absl::OkStatus();
}

inline absl::StatusOr<std::span<const int64_t>> CacheCoordinator::allocate_slots(
    SeqId seq, int32_t num_new_tokens, int32_t num_lookahead) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  // The sequence append_tokens() just found, without a second probe of the map.
  Sequence* s = last_appended_ != nullptr && last_appended_id_ == seq ? last_appended_ : find(seq);
  if (s == nullptr) [[unlikely]]
    return find_or_error(seq, "allocate_slots").status();
  return allocate_slots_impl(*s, num_new_tokens, num_lookahead);
}

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_CACHE_COORDINATOR_H_
