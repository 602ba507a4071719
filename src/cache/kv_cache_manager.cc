// KvCacheManager: sequences, slot allocation with copy-on-write, forks, releases and the
// step (construction: create.cc; prefix matching: prefix_match.cc; preemption and
// swapping: preemption.cc; windowed groups' releases and eviction classes:
// windowed_groups.cc). Every public call validates first and mutates after, so a failed call
// leaves the manager exactly as it was. Every layer group gets the same calls in turn
// (group_pools.h); a model without layer groups is one full-attention group.
#include "pagedkv/kv_cache_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/group_pools.h"
#include "cache/host_tier.h"
#include "cache/sequence.h"
#include "cache/step_ledger.h"
#include "common/arithmetic.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace pagedkv {

using internal::div_ceil;
using internal::GroupPools;
using internal::GroupTable;
using internal::Hold;
using internal::Sequence;
using internal::state_name;

namespace {

// " in group g" for models of several groups: messages of one-group models stay as they were.
std::string in_group(const GroupPools& g, size_t num_groups) {
  return num_groups > 1 ? absl::StrCat(" in group ", g.index) : std::string();
}

}  // namespace

// --- sequences ---------------------------------------------------------------------------

Sequence* KvCacheManager::find(SeqId seq) const {
  const auto it = sequences_.find(seq);
  return it == sequences_.end() ? nullptr : it->second.get();
}

// allocate_slots()'s lookup: the sequence append_tokens() just found, without a second
// probe of the map.
Sequence* KvCacheManager::find_appended(SeqId seq) {
  if (last_appended_ != nullptr && last_appended_id_ == seq) return last_appended_;
  return find(seq);
}

absl::StatusOr<Sequence*> KvCacheManager::find_or_error(SeqId seq, const char* caller) const {
  Sequence* s = find(seq);
  if (s == nullptr) return absl::NotFoundError(absl::StrCat(caller, ": unknown sequence ", seq));
  return s;
}

absl::Status KvCacheManager::add_sequence(SeqId seq, std::span<const TokenId> prompt,
                                          SequenceOptions options) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  if (find(seq) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("add_sequence: sequence ", seq, " exists"));
  }
  if (prompt.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("add_sequence(seq ", seq, "): empty prompt"));
  }
  if (static_cast<int64_t>(prompt.size()) > options_.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("add_sequence(seq ", seq, "): prompt of ",
                                                   prompt.size(), " tokens exceeds max_model_len ",
                                                   options_.max_model_len));
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
  // The watermark does not count: a sequence alone in the pool may use every block. A
  // windowed group needs at least the blocks one token's window spans, a state group a slot.
  const int32_t bs = options_.block_size;
  const int64_t prompt_blocks = div_ceil(static_cast<int64_t>(prompt.size()), bs);
  for (const GroupPools& g : groups_) {
    const int64_t needed = g.windowed()
                               ? std::min(prompt_blocks, div_ceil(g.spec.window - 1, bs) + 1)
                               : (g.holds_state() ? 1 : prompt_blocks);
    if (needed > g.spec.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "add_sequence(seq ", seq, "): prompt of ", prompt.size(), " tokens needs ", needed,
          " blocks of ", bs, " tokens", in_group(g, groups_.size()), "; the pool has ",
          g.spec.num_blocks, ". Raise num_blocks or shorten the prompt"));
    }
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

absl::Status KvCacheManager::append_tokens(SeqId seq, std::span<const TokenId> tokens) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  Sequence* s = find(seq);  // hot: one lookup, no StatusOr on the way
  if (s == nullptr) [[unlikely]]
    return find_or_error(seq, "append_tokens").status();
  last_appended_id_ = seq;
  last_appended_ = s;
  if (static_cast<int64_t>(s->tokens.size()) + static_cast<int64_t>(tokens.size()) >
      options_.max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("append_tokens(seq ", seq, "): ", s->tokens.size(), " + ", tokens.size(),
                     " tokens exceeds max_model_len ", options_.max_model_len));
  }
  // push_back, not a range insert: a decode step appends one token, and a range insert
  // of one element costs a memmove call.
  for (const TokenId t : tokens) s->tokens.push_back(t);
  return absl::OkStatus();
}

// --- slots -----------------------------------------------------------------------------

absl::StatusOr<std::span<const int64_t>> KvCacheManager::allocate_slots(SeqId seq,
                                                                        int32_t num_new_tokens,
                                                                        int32_t num_lookahead) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  Sequence* s = find_appended(seq);  // hot: no StatusOr on the way
  if (s == nullptr) [[unlikely]]
    return find_or_error(seq, "allocate_slots").status();
  return allocate_slots_impl(*s, num_new_tokens, num_lookahead);
}

// The leading entries of a windowed group's table that allocate_slots() may release: those
// before the window of the next token, up to the first one this step writes (a block whose
// K/V is not written yet stays until a later call). Counts in `freed` those that the
// release returns to the free queue.
int32_t KvCacheManager::release_end(const Sequence& seq, const GroupPools& g,
                                    int32_t& freed) const {
  const GroupTable& t = seq.tables[g.index];
  const int32_t first_needed = g.first_needed_block(seq.num_computed, options_.block_size);
  int32_t end = t.first_held;
  freed = 0;
  for (; end < first_needed && end < std::ssize(t.blocks); ++end) {
    const BlockId b = t.blocks[end];
    if (ledger_->written(g.index, b)) break;
    freed += g.device.ref_count_unchecked(b) == 1 && !ledger_->holds_device(g.index, b);
  }
  return end;
}

absl::StatusOr<std::span<const int64_t>> KvCacheManager::allocate_slots_impl(
    Sequence& seq, int32_t num_new_tokens, int32_t num_lookahead) {
  const int32_t bs = options_.block_size;
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
  if (!windowed_ && groups_.size() == 1 && num_new_tokens == 1 && num_lookahead == 0) {
    if (const int64_t slot = decode_in_place(seq); slot >= 0) [[likely]] {
      slot_mapping_.assign(1, slot);
      return std::span<const int64_t>(slot_mapping_);
    }
  }
  const int64_t total_blocks = div_ceil(new_total + num_lookahead, bs);
  // Copy-on-write: the partially filled last block is written by this call and shared.
  const int32_t write_block = seq.num_computed / bs;
  const int32_t partial = seq.num_computed - write_block * bs;
  // The watermark keeps headroom for running sequences to grow: an admission leaves it
  // free while another sequence runs, and may use every block when none does.
  const bool admission = seq.state == SequenceState::kWaiting;
  GroupTable* const tables = seq.tables.data();  // one lookup of the inlined storage
  for (GroupPools& g : groups_) {
    const GroupTable& t = tables[g.index];
    GroupPlan& plan = plans_[g.index];
    const int32_t reserve = admission && num_running_ > 0 ? g.watermark_blocks : 0;
    if (g.holds_state()) [[unlikely]] {
      plan = {.new_blocks = t.blocks.empty() ? 1 : 0};  // a slot from the admission on
      if (plan.new_blocks + reserve > g.device.num_free_blocks()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "allocate_slots(seq ", seq.id, "): need a state slot",
            reserve > 0 ? absl::StrCat(" + watermark ", reserve) : "", " in group ", g.index, ", ",
            g.device.num_free_blocks(), " free of ", g.spec.num_blocks));
      }
      continue;
    }
    int32_t freed = 0;
    plan.release_end = g.windowed() ? release_end(seq, g, freed) : 0;
    const int64_t held = total_blocks - (g.windowed() ? plan.release_end : 0);
    if (held > g.spec.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "allocate_slots(seq ", seq.id, "): ", new_total + num_lookahead, " slots need ", held,
          " blocks", in_group(g, groups_.size()), "; the pool has ", g.spec.num_blocks));
    }
    plan.copy_on_write = num_new_tokens > 0 && partial != 0 &&
                         g.device.ref_count_unchecked(t.blocks[write_block]) > 1;
    if (plan.copy_on_write && ledger_->scheduled(seq) && seq.settled_tokens < seq.num_computed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "allocate_slots(seq ", seq.id, "): copy-on-write of block ", t.blocks[write_block],
          in_group(g, groups_.size()),
          " would copy tokens whose K/V this step has not written yet; append after the step"));
    }
    plan.new_blocks =
        static_cast<int32_t>(std::max<int64_t>(0, total_blocks - std::ssize(t.blocks))) +
        (plan.copy_on_write ? 1 : 0);
    const int32_t free_blocks = g.device.num_free_blocks() + freed;
    if (plan.new_blocks + reserve > free_blocks) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "allocate_slots(seq ", seq.id, "): need ", plan.new_blocks, " blocks",
          reserve > 0 ? absl::StrCat(" + watermark ", reserve) : "", in_group(g, groups_.size()),
          ", ", free_blocks, " free of ", g.spec.num_blocks));
    }
  }

  // Validated; from here on nothing fails. A decode step inside its last block allocates
  // nothing.
  const int32_t last_block = static_cast<int32_t>((new_total - 1) / bs);
  slot_mapping_.resize(static_cast<size_t>(num_new_tokens) * groups_.size());
  int64_t* slots = slot_mapping_.data();  // each group's after the previous group's
  for (GroupPools& g : groups_) {
    const GroupPlan& plan = plans_[g.index];
    if (plan.release_end > tables[g.index].first_held) {
      release_behind_window(seq, g, plan.release_end);
    }
    if (plan.new_blocks > 0) grow_table(seq, g, plan, write_block, partial);
    if (g.holds_state()) [[unlikely]] {  // no slots: the state is updated in place
      std::fill_n(slots, num_new_tokens, int64_t{-1});
      slots += num_new_tokens;
      continue;
    }
    const BlockId* blocks = tables[g.index].blocks.data();
    // The blocks the new tokens' K/V goes into, once each; then their slots.
    if (num_new_tokens > 0) {
      for (int32_t i = write_block; i <= last_block; ++i) ledger_->mark_written(g.index, blocks[i]);
    }
    write_slots(blocks + write_block, partial, {slots, static_cast<size_t>(num_new_tokens)});
    slots += num_new_tokens;
  }
  if (num_new_tokens > 0) ledger_->mark_scheduled(seq, seq.num_computed);
  const int32_t old_computed = seq.num_computed;
  seq.num_computed = static_cast<int32_t>(new_total);
  set_state(seq, SequenceState::kRunning);
  if (seq.num_offered_blocks < seq.num_computed / bs) offer_computed_blocks(seq);
  if (has_state_ && old_computed / bs < seq.num_computed / bs) [[unlikely]] {
    save_checkpoints(seq, old_computed);
  }
  if (buries_) [[unlikely]] {
    bury_dead_windows();
  }
  return std::span<const int64_t>(slot_mapping_).first(num_new_tokens);
}

// Most calls of a decode step: a running sequence of a one-group full-attention model
// writes one token into the partly filled last block that it alone holds (its ref count, a
// cache miss, is read again only once the pool's share epoch moved). Nothing is allocated,
// copied or released, nothing can fail: the token's slot; -1 where the general path is needed.
int64_t KvCacheManager::decode_in_place(Sequence& seq) {
  const int32_t bs = options_.block_size;
  const int32_t pos = seq.num_computed;
  const int32_t write_block = pos / bs;
  const GroupTable& t = seq.tables[0];
  if (seq.state != SequenceState::kRunning || pos % bs == 0 ||
      write_block >= std::ssize(t.blocks)) {
    return -1;
  }
  const BlockId block = t.blocks[write_block];
  const BlockPool& pool = groups_[0].device;
  if (block != seq.exclusive_block || seq.exclusive_epoch != pool.share_epoch()) {
    if (pool.ref_count_unchecked(block) != 1) return -1;  // copy-on-write
    seq.exclusive_block = block;
    seq.exclusive_epoch = pool.share_epoch();
  }
  ledger_->mark_written(0, block);
  ledger_->mark_scheduled(seq, pos);
  seq.num_computed = pos + 1;
  if (seq.num_offered_blocks < seq.num_computed / bs) offer_computed_blocks(seq);
  return int64_t{block} * bs + pos % bs;
}

// The slots of consecutive tokens from `offset` of blocks[0] on: a decode step's one token
// directly, longer runs a block at a time, so that the inner loop is a plain run the
// compiler vectorizes (a prefill writes one slot per token).
void KvCacheManager::write_slots(const BlockId* blocks, int32_t offset,
                                 std::span<int64_t> slots) const {
  const int32_t bs = options_.block_size;
  if (slots.size() == 1) [[likely]] {
    slots[0] = int64_t{blocks[0]} * bs + offset;
    return;
  }
  int64_t* out = slots.data();
  int64_t* const end = out + slots.size();
  for (; out != end; ++blocks, offset = 0) {
    const int64_t first_slot = int64_t{*blocks} * bs + offset;
    const auto n = std::min<int64_t>(bs - offset, end - out);
    for (int64_t i = 0; i < n; ++i) out[i] = first_slot + i;
    out += n;
  }
}

std::span<const int64_t> KvCacheManager::slot_mapping(int32_t group) const {
  const size_t n = slot_mapping_.size() / groups_.size();
  return std::span<const int64_t>(slot_mapping_).subspan(n * group, n);
}

void KvCacheManager::grow_table(Sequence& seq, GroupPools& g, const GroupPlan& plan,
                                int32_t write_block, int32_t valid_tokens) {
  std::vector<BlockId>& blocks = seq.tables[g.index].blocks;
  const size_t old_size = blocks.size();
  blocks.resize(old_size + plan.new_blocks);
  allocate_device_blocks(g, std::span(blocks).subspan(old_size));
  if (plan.copy_on_write) {
    // The first new block takes the place of the shared partial block.
    const BlockId src = blocks[write_block];
    const BlockId dst = blocks[old_size];
    ledger_->record(internal::kCopyOnWrite, {src, dst, valid_tokens, g.index});
    const BlockId released[] = {src};
    g.device.free_unchecked(released);  // still held by the other sharers
    blocks[write_block] = dst;
    blocks.erase(blocks.begin() + static_cast<int64_t>(old_size));
    ++counters_.cow_copies;
  }
}

// Device allocation with the host tier's side: cached blocks it evicts are demoted.
void KvCacheManager::allocate_device_blocks(GroupPools& g, std::span<BlockId> out) {
  g.device.allocate_unchecked(out);
  if (g.host_tier != nullptr) g.host_tier->demote_evicted(internal::pools_of(g, *ledger_));
}

// --- fork and free -----------------------------------------------------------------------

absl::Status KvCacheManager::fork(SeqId parent, SeqId child) {
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
  if (has_state_) PAGEDKV_RETURN_IF_ERROR(check_state_slots(*p, "fork"));
  auto c = std::make_unique<Sequence>(*p);
  c->id = child;
  c->arrival = next_arrival_++;
  // Only blocks holding computed tokens are shared; the parent keeps its lookahead blocks.
  const auto context_blocks = div_ceil(p->num_computed, options_.block_size);
  for (GroupPools& g : groups_) {
    if (g.holds_state()) continue;
    GroupTable& t = c->tables[g.index];
    t.blocks.resize(std::max<int64_t>(t.first_held, context_blocks));
    for (size_t i = t.first_held; i < t.blocks.size(); ++i) g.device.touch_unchecked(t.blocks[i]);
  }
  if (has_state_) fork_state(*c);
  c->num_offered_blocks = std::min(c->num_offered_blocks, static_cast<int32_t>(context_blocks));
  num_running_ += c->state == SequenceState::kRunning;
  sequences_.emplace(child, std::move(c));
  return absl::OkStatus();
}

absl::Status KvCacheManager::free(SeqId seq) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "free"));
  unshare_unwritten_blocks(*s);
  release_device_blocks(*s);
  if (s->state == SequenceState::kSwapped) release_host_blocks(*s);  // held only while swapped
  set_state(*s, SequenceState::kWaiting);                            // leaves the running count
  if (last_appended_ == s) last_appended_ = nullptr;
  sequences_.erase(seq);
  if (buries_) bury_dead_windows();
  return absl::OkStatus();
}

void KvCacheManager::unshare_unwritten_blocks(Sequence& seq) {
  if (!ledger_->scheduled(seq)) return;
  // Blocks that this step's K/V writes fill and it holds alone may never be written. A
  // block a swap-in or promotion fills stays cached: its copy runs with the step's ops.
  for (GroupPools& g : groups_) {
    if (g.holds_state()) continue;
    const GroupTable& t = seq.tables[g.index];
    const int32_t first = std::max(seq.settled_tokens / options_.block_size, t.first_held);
    for (int32_t i = first; i < seq.num_offered_blocks; ++i) {
      const BlockId b = t.blocks[i];
      if (g.device.ref_count_unchecked(b) == 1 && !ledger_->filled_by_copy(g.index, b)) {
        g.device.uncache_unchecked(b);
      }
    }
  }
}

// --- releases and the step ---------------------------------------------------------------

void KvCacheManager::set_state(Sequence& seq, SequenceState state) {
  num_running_ += (state == SequenceState::kRunning) - (seq.state == SequenceState::kRunning);
  seq.state = state;
}

void KvCacheManager::release_device_blocks(Sequence& seq) {
  const bool caching = options_.enable_prefix_caching;
  for (GroupPools& g : groups_) {
    GroupTable& t = seq.tables[g.index];
    // A swapped sequence's device tables are empty; first_held is kept for swap_in().
    const auto first = std::min(static_cast<size_t>(t.first_held), t.blocks.size());
    if (!g.holds_state() && (!seq.retention.empty() || (g.windowed() && caching))) [[unlikely]] {
      for (size_t i = first; i < t.blocks.size(); ++i) {
        set_release_retention(seq, g, static_cast<int32_t>(i));
      }
    }
    const auto held = std::span<const BlockId>(t.blocks).subspan(first);
    // Tail first, as one free: a prompt's later blocks are evicted before its shared
    // beginning, and its clean blocks are reused in the same order.
    if (!ledger_->holds_any_device()) [[likely]] {
      g.device.free_tail_first_unchecked(held);
    } else {
      BlockId last_clean = kNoBlock;
      for (auto it = held.rbegin(); it != held.rend(); ++it) {
        ledger_->release(g.device, Hold::kDevice, g.index, *it, last_clean);
      }
    }
    t.blocks.clear();
    t.first_held = 0;
  }
}

void KvCacheManager::release_host_blocks(Sequence& seq) {
  for (GroupPools& g : groups_) {
    std::vector<BlockId>& host_blocks = seq.tables[g.index].host_blocks;
    BlockId last_clean = kNoBlock;
    for (auto it = host_blocks.rbegin(); it != host_blocks.rend(); ++it) {
      ledger_->release(g.host, Hold::kHost, g.index, *it, last_clean);
    }
    host_blocks.clear();
  }
}

StepOps KvCacheManager::take_step_ops() {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  return ledger_->take([this](Hold side, int32_t group) -> BlockPool& {
    return side == Hold::kDevice ? groups_[group].device : groups_[group].host;
  });
}

// --- lookups -----------------------------------------------------------------------------

bool KvCacheManager::contains(SeqId seq) const { return find(seq) != nullptr; }

absl::StatusOr<SequenceView> KvCacheManager::sequence(SeqId seq, int32_t group) const {
  PAGEDKV_ASSIGN_OR_RETURN(const Sequence* s, find_or_error(seq, "sequence"));
  PAGEDKV_RETURN_IF_ERROR(check_group(group, "sequence"));
  const GroupTable& t = s->tables[group];
  return SequenceView{s->id,     s->state, s->priority,   s->arrival,  s->num_computed,
                      s->tokens, t.blocks, t.host_blocks, t.first_held};
}

absl::Status KvCacheManager::check_group(int32_t group, const char* caller) const {
  if (group < 0 || group >= num_groups()) {
    return absl::InvalidArgumentError(
        absl::StrCat(caller, ": layer group ", group, " outside [0, ", num_groups(), ")"));
  }
  return absl::OkStatus();
}

int32_t KvCacheManager::num_sequences() const { return static_cast<int32_t>(sequences_.size()); }

std::vector<SequenceInfo> KvCacheManager::running_sequences() const {
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

const BlockPool& KvCacheManager::device_pool(int32_t group) const { return groups_[group].device; }
const BlockPool& KvCacheManager::host_pool(int32_t group) const { return groups_[group].host; }

KvCacheManager::Stats KvCacheManager::stats() const {
  const GroupStats g = group_stats(0);
  Stats s = counters_;
  s.num_blocks = g.num_blocks;
  s.used_blocks = g.used_blocks;
  s.free_blocks = g.free_blocks;
  s.cached_free_blocks = g.cached_free_blocks;
  s.num_host_blocks = g.num_host_blocks;
  s.used_host_blocks = g.used_host_blocks;
  s.evictions = g.evictions;
  s.cached_host_blocks = g.cached_host_blocks;
  s.host_evictions = g.host_evictions;
  for (const GroupPools& group : groups_) {
    s.recent_ghost_hits += group.device.stats().recent_ghost_hits;
    s.frequent_ghost_hits += group.device.stats().frequent_ghost_hits;
    if (group.host_tier == nullptr) continue;
    s.blocks_demoted += group.host_tier->counters().blocks_demoted;
    s.blocks_promoted += group.host_tier->counters().blocks_promoted;
    s.blocks_not_admitted += group.host_tier->counters().blocks_not_admitted;
    s.ghost_hits += group.host_tier->counters().ghost_hits;
  }
  return s;
}

KvCacheManager::GroupStats KvCacheManager::group_stats(int32_t group) const {
  const GroupPools& g = groups_[group];
  const BlockPool::Stats device = g.device.stats();
  const BlockPool::Stats host = g.host.stats();
  GroupStats s = group_counters_[group];
  s.num_blocks = device.num_blocks;
  s.used_blocks = device.used_blocks;
  s.free_blocks = device.free_blocks;
  s.cached_free_blocks = device.cached_free_blocks;
  s.num_host_blocks = host.num_blocks;
  s.used_host_blocks = host.num_blocks - host.free_blocks;
  s.cached_host_blocks = host.cached_blocks;
  s.evictions = device.evictions;
  s.host_evictions = host.evictions;
  if (g.host_tier != nullptr) {
    s.blocks_demoted = g.host_tier->counters().blocks_demoted;
    s.blocks_promoted = g.host_tier->counters().blocks_promoted;
    s.blocks_not_admitted = g.host_tier->counters().blocks_not_admitted;
    s.ghost_hits = g.host_tier->counters().ghost_hits;
  }
  return s;
}

}  // namespace pagedkv
