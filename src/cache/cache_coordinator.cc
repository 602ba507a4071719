// CacheCoordinator: sequences, a step's slots across the groups (the decode step's fast
// path for one-group models), forks, frees, the step's end, lookups. Every call validates
// first and mutates after, so a failed call leaves the manager exactly as it was.
#include "cache/cache_coordinator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/arithmetic.h"
#include "common/status_macros.h"

namespace pagedkv::internal {

CacheCoordinator::~CacheCoordinator() = default;

absl::StatusOr<Sequence*> CacheCoordinator::find_or_error(SeqId seq, const char* caller) const {
  Sequence* s = find(seq);
  if (s == nullptr) return absl::NotFoundError(absl::StrCat(caller, ": unknown sequence ", seq));
  return s;
}

// append_tokens()'s error, out of line: the decode step's call stays small enough to inline.
absl::Status CacheCoordinator::too_long_to_append(const Sequence& seq, size_t num_tokens) const {
  return absl::InvalidArgumentError(
      absl::StrCat("append_tokens(seq ", seq.id, "): ", seq.tokens.size(), " + ", num_tokens,
                   " tokens exceeds max_model_len ", shared_.options.max_model_len));
}

absl::Status CacheCoordinator::verdict_wait(const Sequence& seq, const char* caller) {
  return absl::FailedPreconditionError(
      seq.num_draft > 0 ? absl::StrCat(caller, "(seq ", seq.id, "): ", seq.num_draft,
                                       " draft tokens wait for accept_draft()")
                        : absl::StrCat(caller, "(seq ", seq.id, "): ", seq.num_importing,
                                       " imported tokens wait for complete_import()"));
}

absl::Status CacheCoordinator::check_group(int32_t group, const char* caller) const {
  if (group < 0 || group >= num_groups()) {
    return absl::InvalidArgumentError(
        absl::StrCat(caller, ": layer group ", group, " outside [0, ", num_groups(), ")"));
  }
  return absl::OkStatus();
}

// --- sequences -----------------------------------------------------------------------------

absl::Status CacheCoordinator::add_sequence(SeqId seq, std::span<const TokenId> prompt,
                                            SequenceOptions options) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  if (find(seq) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("add_sequence: sequence ", seq, " exists"));
  }
  if (prompt.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("add_sequence(seq ", seq, "): empty prompt"));
  }
  const int32_t max_model_len = shared_.options.max_model_len;
  if (static_cast<int64_t>(prompt.size()) > max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("add_sequence(seq ", seq, "): prompt of ",
                                                   prompt.size(), " tokens exceeds max_model_len ",
                                                   max_model_len));
  }
  for (const RetentionRange& r : options.retention) {
    if (r.begin < 0 || r.end < r.begin || r.priority < kMinRetentionPriority ||
        r.priority > kMaxRetentionPriority || r.duration_ms < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "add_sequence(seq ", seq, "): retention range [", r.begin, ", ", r.end, ") priority ",
          r.priority, " duration_ms ", r.duration_ms, ": need 0 <= begin <= end, priority in [",
          kMinRetentionPriority, ", ", kMaxRetentionPriority, "], duration_ms >= 0"));
    }
  }
  // The watermark does not count: a sequence alone in the pool may use every block.
  int64_t shared_needed = 0;  // Options::shared_block_pool: all groups' together
  for (const auto& g : groups_) {
    const int64_t needed = g->blocks_to_run(std::ssize(prompt));
    shared_needed += needed;
    if (needed > g->spec().num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "add_sequence(seq ", seq, "): prompt of ", prompt.size(), " tokens needs ", needed,
          " blocks of ", shared_.block_size, " tokens",
          num_groups() > 1 ? absl::StrCat(" in group ", g->index()) : "", "; the pool has ",
          g->spec().num_blocks, ". Raise num_blocks or shorten the prompt"));
    }
  }
  if (shared_.options.shared_block_pool && shared_needed > groups_[0]->spec().num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "add_sequence(seq ", seq, "): prompt of ", prompt.size(), " tokens needs ", shared_needed,
        " blocks of ", shared_.block_size, " tokens in all groups together; the shared pool has ",
        groups_[0]->spec().num_blocks, ". Raise num_blocks or shorten the prompt"));
  }
  auto s = std::make_unique<Sequence>();
  s->id = seq;
  s->priority = options.priority;
  s->arrival = next_arrival_++;
  s->tokens.assign(prompt.begin(), prompt.end());
  s->prompt_len = static_cast<int32_t>(prompt.size());
  s->tables.resize(groups_.size());
  s->extra_keys.assign(options.extra_keys.begin(), options.extra_keys.end());
  s->retention = std::move(options.retention);
  sequences_.emplace(seq, std::move(s));
  return absl::OkStatus();
}

// --- slots ---------------------------------------------------------------------------------

absl::StatusOr<std::span<const int64_t>> CacheCoordinator::allocate_slots_impl(
    Sequence& seq, int32_t num_new_tokens, int32_t num_lookahead, int32_t num_draft, bool import) {
  const int32_t bs = shared_.block_size;
  if (awaits_verdict(seq)) [[unlikely]]
    return verdict_wait(seq, "allocate_slots");
  if (num_new_tokens < 0 || num_lookahead < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocate_slots(seq ", seq.id, "): num_new_tokens ", num_new_tokens,
                     " and num_lookahead ", num_lookahead, " must be >= 0"));
  }
  if (seq.state == SequenceState::kSwapped) {
    return absl::FailedPreconditionError(
        absl::StrCat("allocate_slots(seq ", seq.id, "): sequence is swapped; swap_in() first"));
  }
  const int64_t new_total = int64_t{seq.num_computed} + num_new_tokens;
  if (new_total > static_cast<int64_t>(seq.tokens.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocate_slots(seq ", seq.id, "): ", seq.num_computed, " computed + ",
                     num_new_tokens, " new tokens exceeds the sequence's ", seq.tokens.size(),
                     " tokens; append_tokens() first"));
  }
  if (sole_full_pool_ != nullptr && num_new_tokens == 1 && num_lookahead == 0) {
    if (const int64_t slot = decode_in_place(seq); slot >= 0) [[likely]] {
      slot_mapping_.assign(1, slot);
      return std::span<const int64_t>(slot_mapping_);
    }
  }
  const int32_t write_block = seq.num_computed / bs;
  const StepRequest step{
      .num_new_tokens = num_new_tokens,
      .new_total = new_total,
      .slots_total = new_total + num_lookahead,
      .total_blocks = div_ceil(new_total + num_lookahead, bs),
      .write_block = write_block,
      .partial = seq.num_computed - write_block * bs,
      .admission = seq.state == SequenceState::kWaiting,
      .num_draft = num_draft,
      .import = import,
  };
  for (const auto& g : groups_) {
    PAGEDKV_RETURN_IF_ERROR(g->plan_step(seq, step, plans_[g->index()]));
  }
  if (shared_.options.shared_block_pool) PAGEDKV_RETURN_IF_ERROR(check_shared_fit(seq, step));
  // Validated; from here on nothing fails. A decode step inside its last block allocates
  // nothing.
  slot_mapping_.resize(static_cast<size_t>(num_new_tokens) * groups_.size());
  int64_t* slots = slot_mapping_.data();  // each group's after the previous group's
  for (const auto& g : groups_) g->release_before_step(seq, plans_[g->index()]);
  for (const auto& g : groups_) {
    g->apply_step(seq, step, plans_[g->index()], {slots, static_cast<size_t>(num_new_tokens)});
    slots += num_new_tokens;
  }
  if (num_new_tokens > 0) shared_.ledger.mark_scheduled(seq, seq.num_computed);
  const int32_t old_computed = seq.num_computed;
  seq.num_computed = static_cast<int32_t>(new_total);
  seq.num_draft = num_draft;
  seq.num_importing = import ? num_new_tokens : 0;
  set_state(seq, SequenceState::kRunning);
  const int32_t verified = verified_tokens(seq);
  if (seq.num_offered_blocks < verified / bs) offer_computed_blocks(seq);
  if (!state_.empty() && old_computed / bs < verified / bs) [[unlikely]] {
    save_checkpoints(seq, old_computed);
  }
  if (buries_) [[unlikely]] {
    bury_dead_contents();
  }
  return std::span<const int64_t>(slot_mapping_).first(num_new_tokens);
}

// Options::shared_block_pool: each group's plan fits the pool alone; together they must
// too (vLLM's fit check: the blocks of every group added up).
absl::Status CacheCoordinator::check_shared_fit(const Sequence& seq,
                                                const StepRequest& step) const {
  int64_t needed = 0;
  int64_t held = 0;
  for (const GroupPlan& plan : plans_) {
    needed += plan.new_blocks - plan.freed;
    held += plan.held;
  }
  const BlockPoolCore& pool = groups_[0]->device();
  if (held > pool.num_blocks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocate_slots(seq ", seq.id, "): ", step.slots_total, " slots need ", held,
                     " blocks in all groups together; the shared pool has ", pool.num_blocks()));
  }
  const int32_t reserve =
      step.admission && shared_.num_running > 0 ? groups_[0]->watermark_blocks() : 0;
  if (needed + reserve <= pool.num_free_blocks()) return absl::OkStatus();
  std::string by_group;
  for (const auto& g : groups_) {
    const GroupPlan& plan = plans_[g->index()];
    absl::StrAppend(&by_group, g->index() == 0 ? "" : ", ", g->index(), ": ", plan.new_blocks,
                    plan.freed > 0 ? absl::StrCat(" - ", plan.freed, " released") : "");
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "allocate_slots(seq ", seq.id, "): need ", needed, " blocks (by group ", by_group, ")",
      reserve > 0 ? absl::StrCat(" + watermark ", reserve) : "", ", ", pool.num_free_blocks(),
      " free of ", pool.num_blocks(), " in the pool all groups share"));
}

// Most calls of a decode step: a running sequence of a one-group full-attention model
// writes one token into the partly filled last block that it alone holds (its ref count, a
// cache miss, is read again only once the pool's share epoch moved). Nothing is allocated,
// copied or released, nothing can fail: the token's slot; -1 where the general path is needed.
int64_t CacheCoordinator::decode_in_place(Sequence& seq) {
  const int32_t bs = shared_.block_size;
  const int32_t pos = seq.num_computed;
  const int32_t write_block = pos / bs;
  const GroupTable& t = seq.tables[0];
  if (seq.state != SequenceState::kRunning || pos % bs == 0 ||
      write_block >= std::ssize(t.blocks)) {
    return -1;
  }
  const BlockId block = t.blocks[write_block];
  const BlockPoolCore& pool = *sole_full_pool_;
  if (block != seq.exclusive_block || seq.exclusive_epoch != pool.share_epoch()) {
    if (pool.ref_count_unchecked(block) != 1) return -1;  // copy-on-write
    seq.exclusive_block = block;
    seq.exclusive_epoch = pool.share_epoch();
  }
  shared_.ledger.mark_written(0, block);
  shared_.ledger.mark_scheduled(seq, pos);
  seq.num_computed = pos + 1;
  if (seq.num_offered_blocks < seq.num_computed / bs) offer_computed_blocks(seq);
  return int64_t{block} * bs + pos % bs;
}

absl::StatusOr<std::span<const int64_t>> CacheCoordinator::slot_mapping(int32_t group) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(group, "slot_mapping"));
  const size_t n = slot_mapping_.size() / groups_.size();
  return std::span<const int64_t>(slot_mapping_).subspan(n * group, n);
}

void CacheCoordinator::set_state(Sequence& seq, SequenceState state) {
  shared_.num_running +=
      (state == SequenceState::kRunning) - (seq.state == SequenceState::kRunning);
  seq.state = state;
}

// --- fork and free -------------------------------------------------------------------------

absl::Status CacheCoordinator::fork(SeqId parent, SeqId child) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * p, find_or_error(parent, "fork"));
  if (find(child) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("fork(parent ", parent, "): child sequence ", child, " exists"));
  }
  if (p->state == SequenceState::kSwapped) {
    return absl::FailedPreconditionError(
        absl::StrCat("fork(parent ", parent, "): parent is swapped; swap_in() first"));
  }
  if (awaits_verdict(*p)) return verdict_wait(*p, "fork");
  for (const auto& g : groups_) PAGEDKV_RETURN_IF_ERROR(g->check_fork(*p, "fork"));
  auto c = std::make_unique<Sequence>(*p);
  c->id = child;
  c->arrival = next_arrival_++;
  const int32_t context_blocks = num_blocks_for_tokens(p->num_computed, shared_.block_size);
  for (const auto& g : groups_) g->fork(*c, context_blocks);
  c->num_offered_blocks = std::min(c->num_offered_blocks, context_blocks);
  shared_.num_running += c->state == SequenceState::kRunning;
  sequences_.emplace(child, std::move(c));
  return absl::OkStatus();
}

absl::Status CacheCoordinator::free(SeqId seq) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "free"));
  uncache_unwritten(*s);
  release(*s);
  if (s->state == SequenceState::kSwapped) {  // host blocks are held only while swapped
    for (const auto& g : groups_) g->release_host(*s);
  }
  set_state(*s, SequenceState::kWaiting);  // leaves the running count
  if (last_appended_ == s) last_appended_ = nullptr;
  sequences_.erase(seq);
  if (buries_) bury_dead_contents();
  return absl::OkStatus();
}

// Blocks that this step's K/V writes fill and `seq` holds alone may never be written. A
// block a swap-in or promotion fills stays cached: its copy runs with the step's ops.
void CacheCoordinator::uncache_unwritten(Sequence& seq) {
  if (!shared_.ledger.scheduled(seq)) return;
  for (AttentionGroup* g : attention_) g->uncache_unwritten(seq);
}

void CacheCoordinator::release(Sequence& seq) {
  for (const auto& g : groups_) g->release(seq);
}

StepOps CacheCoordinator::take_step_ops() {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  return shared_.ledger.take([this](Hold side, int32_t group) -> BlockPoolCore& {
    return side == Hold::kDevice ? groups_[group]->device() : groups_[group]->host();
  });
}

// --- lookups -------------------------------------------------------------------------------

absl::StatusOr<SequenceView> CacheCoordinator::sequence(SeqId seq, int32_t group) const {
  PAGEDKV_ASSIGN_OR_RETURN(const Sequence* s, find_or_error(seq, "sequence"));
  PAGEDKV_RETURN_IF_ERROR(check_group(group, "sequence"));
  const GroupTable& t = s->tables[group];
  return SequenceView{s->id,     s->state, s->priority,   s->arrival,   s->num_computed,
                      s->tokens, t.blocks, t.host_blocks, t.first_held, s->num_draft};
}

std::vector<SequenceInfo> CacheCoordinator::running_sequences() const {
  std::vector<SequenceInfo> running;
  for (const auto& [id, s] : sequences_) {
    if (s->state != SequenceState::kRunning) continue;
    const GroupTable& t = s->tables[0];
    running.push_back({id, s->priority, s->arrival,
                       static_cast<int32_t>(t.blocks.size()) - t.first_held,
                       static_cast<int32_t>(s->tokens.size()), s->num_computed});
  }
  std::sort(running.begin(), running.end(),
            [](const SequenceInfo& a, const SequenceInfo& b) { return a.arrival < b.arrival; });
  return running;
}

absl::StatusOr<LayerGroup> CacheCoordinator::layer_group(int32_t group) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(group, "layer_group"));
  return groups_[group]->spec();
}

absl::StatusOr<KvCacheManager::GroupStats> CacheCoordinator::group_stats(int32_t group) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(group, "group_stats"));
  return groups_[group]->stats();
}

absl::StatusOr<const BlockPool*> CacheCoordinator::device_pool(int32_t group) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(group, "device_pool"));
  return &groups_[group]->device_pool();
}

absl::StatusOr<const BlockPool*> CacheCoordinator::host_pool(int32_t group) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(group, "host_pool"));
  return &groups_[group]->host_pool();
}

// Pool figures are group 0's; the rest count sequences and hits, for all groups.
KvCacheManager::Stats CacheCoordinator::stats() const {
  const KvCacheManager::GroupStats g = groups_[0]->stats();
  KvCacheManager::Stats s = shared_.counters;
  s.num_blocks = g.num_blocks;
  s.used_blocks = g.used_blocks;
  s.free_blocks = g.free_blocks;
  s.cached_free_blocks = g.cached_free_blocks;
  s.num_host_blocks = g.num_host_blocks;
  s.used_host_blocks = g.used_host_blocks;
  s.evictions = g.evictions;
  s.cached_host_blocks = g.cached_host_blocks;
  s.host_evictions = g.host_evictions;
  for (const auto& group : groups_) {
    const BlockPool::Stats device = group->device().stats();
    s.recent_ghost_hits += device.recent_ghost_hits;
    s.frequent_ghost_hits += device.frequent_ghost_hits;
    const HostTier* tier = group->host_tier();
    if (tier == nullptr) continue;
    s.blocks_demoted += tier->counters().blocks_demoted;
    s.blocks_promoted += tier->counters().blocks_promoted;
    s.blocks_not_admitted += tier->counters().blocks_not_admitted;
    s.ghost_hits += tier->counters().ghost_hits;
  }
  for (const auto& [seq, groups] : shared_.pins) {
    for (const KvHandoffGroup& g : groups) s.pinned_blocks += static_cast<int32_t>(g.blocks.size());
  }
  return s;
}

}  // namespace pagedkv::internal
