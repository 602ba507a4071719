// AttentionGroup: K/V block tables: a step's blocks and slots with copy-on-write, a hit's
// claim, offers to the prefix index, forks, swaps and the table's checks.
#include "cache/attention_group.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace pagedkv::internal {

// --- a step --------------------------------------------------------------------------------

absl::Status AttentionGroup::plan_step(const Sequence& seq, const StepRequest& step,
                                       GroupPlan& plan) const {
  return plan_blocks(seq, step, /*release_end=*/0, /*freed=*/0, /*skipped=*/0, plan);
}

absl::Status AttentionGroup::plan_blocks(const Sequence& seq, const StepRequest& step,
                                         int32_t release_end, int32_t freed, int32_t skipped,
                                         GroupPlan& plan) const {
  const GroupTable& t = table(seq);
  // The watermark keeps headroom for running sequences to grow: an admission leaves it
  // free while another sequence runs, and may use every block when none does.
  const int32_t reserve = step.admission && shared_.num_running > 0 ? watermark_blocks() : 0;
  plan.release_end = release_end;
  plan.skipped = skipped;
  plan.freed = freed;
  const int64_t held = step.total_blocks - release_end - skipped;
  plan.held = held;
  if (held > spec().num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocate_slots(seq ", seq.id, "): ", step.slots_total, " slots need ", held,
                     " blocks", in_group(), "; the pool has ", spec().num_blocks));
  }
  plan.copy_on_write = step.num_new_tokens > 0 && step.partial != 0 &&
                       device().ref_count_unchecked(t.blocks[step.write_block]) > 1;
  if (plan.copy_on_write && shared_.ledger.scheduled(seq) &&
      seq.settled_tokens < seq.num_computed) {
    return absl::FailedPreconditionError(
        absl::StrCat("allocate_slots(seq ", seq.id, "): copy-on-write of block ",
                     t.blocks[step.write_block], in_group(),
                     " would copy tokens whose K/V this step has not written yet; append after "
                     "the step"));
  }
  plan.new_blocks = static_cast<int32_t>(
                        std::max<int64_t>(0, step.total_blocks - std::ssize(t.blocks) - skipped)) +
                    (plan.copy_on_write ? 1 : 0);
  const int32_t free_blocks = device().num_free_blocks() + freed;
  if (plan.new_blocks + reserve > free_blocks) {
    return absl::ResourceExhaustedError(
        absl::StrCat("allocate_slots(seq ", seq.id, "): need ", plan.new_blocks, " blocks",
                     reserve > 0 ? absl::StrCat(" + watermark ", reserve) : "", in_group(), ", ",
                     free_blocks, " free of ", spec().num_blocks));
  }
  return absl::OkStatus();
}

void AttentionGroup::apply_step(Sequence& seq, const StepRequest& step, const GroupPlan& plan,
                                std::span<int64_t> slots) {
  if (plan.new_blocks > 0) grow_table(seq, plan, step.write_block, step.partial);
  const BlockId* blocks = table(seq).blocks.data();
  int32_t write_block = step.write_block;
  int32_t offset = step.partial;
  const int32_t first_held = table(seq).first_held;
  if (write_block < first_held) [[unlikely]] {
    // A windowed import's tokens behind the window: no block, no slot.
    const int64_t unheld = int64_t{first_held - write_block} * shared_.block_size - offset;
    std::fill_n(slots.begin(), unheld, int64_t{-1});
    slots = slots.subspan(static_cast<size_t>(unheld));
    write_block = first_held;
    offset = 0;
  }
  // The blocks the new tokens' K/V goes into, once each; then their slots.
  if (step.num_new_tokens > 0) {
    const auto last_block = static_cast<int32_t>((step.new_total - 1) / shared_.block_size);
    for (int32_t i = write_block; i <= last_block; ++i) {
      shared_.ledger.mark_written(index(), blocks[i]);
    }
  }
  write_slots(blocks + write_block, offset, slots);
}

void AttentionGroup::grow_table(Sequence& seq, const GroupPlan& plan, int32_t write_block,
                                int32_t valid_tokens) {
  std::vector<BlockId>& blocks = table(seq).blocks;
  const size_t old_size = blocks.size();
  blocks.resize(old_size + plan.new_blocks);
  allocate_device_blocks(std::span(blocks).subspan(old_size));
  if (plan.copy_on_write) {
    // The first new block takes the place of the shared partial block.
    const BlockId src = blocks[write_block];
    const BlockId dst = blocks[old_size];
    shared_.ledger.record(kCopyOnWrite, {src, dst, valid_tokens, index()});
    const BlockId released[] = {src};
    device().free_unchecked(released);  // still held by the other sharers
    blocks[write_block] = dst;
    blocks.erase(blocks.begin() + static_cast<int64_t>(old_size));
    ++shared_.counters.cow_copies;
  }
}

// The slots of consecutive tokens from `offset` of blocks[0] on: a decode step's one token
// directly, longer runs a block at a time, so that the inner loop is a plain run the
// compiler vectorizes (a prefill writes one slot per token).
void AttentionGroup::write_slots(const BlockId* blocks, int32_t offset,
                                 std::span<int64_t> slots) const {
  const int32_t bs = shared_.block_size;
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

// --- claiming a hit ------------------------------------------------------------------------

void AttentionGroup::share_hit(Sequence& seq, int32_t hit) {
  GroupTable& t = table(seq);
  const int32_t first = first_needed_block(int64_t{hit} * shared_.block_size);
  t.blocks.assign(hit, kNoBlock);
  t.first_held = first;
  for (int32_t i = first; i < hit; ++i) {
    if (!device_hit(i)) continue;
    t.blocks[i] = hits_.device[i];
    device().touch_unchecked(t.blocks[i]);
    if (host_tier() != nullptr) host_tier()->note_hit(t.blocks[i]);
  }
  counters_.hit_blocks += hit - first;
}

int32_t AttentionGroup::promote_host_hits(Sequence& seq, int32_t hit) {
  if (host_tier() == nullptr) return 0;
  GroupTable& t = table(seq);
  hits_.promote_at.clear();
  hits_.promote_hits.clear();
  for (int32_t i = t.first_held; i < hit; ++i) {
    if (device_hit(i)) continue;
    hits_.promote_at.push_back(i);
    hits_.promote_hits.push_back(hits_.host[i]);
  }
  if (hits_.promote_at.empty()) return 0;
  std::vector<BlockId>& promoted = shared_.scratch_blocks;
  promoted.resize(hits_.promote_at.size());
  host_tier()->promote(hits_.promote_hits, promoted, tier_pools());
  for (size_t j = 0; j < hits_.promote_at.size(); ++j) t.blocks[hits_.promote_at[j]] = promoted[j];
  // Index runs of consecutive entries, one call each.
  const std::vector<int32_t>& at = hits_.promote_at;
  for (size_t begin = 0; begin < at.size();) {
    size_t end = begin + 1;
    while (end < at.size() && at[end] == at[end - 1] + 1) ++end;
    index_run(seq, at[begin], static_cast<int32_t>(end - begin), /*matched=*/true);
    begin = end;
  }
  return static_cast<int32_t>(at.size());
}

void AttentionGroup::describe_hit(int32_t hit, PrefixHit::Group& out) const {
  const int32_t first = first_needed_block(int64_t{hit} * shared_.block_size);
  out.blocks.assign(hit, kNoBlock);
  for (int32_t i = first; i < hit; ++i) {
    if (!device_hit(i)) {
      ++out.num_new_blocks;  // a promotion
      continue;
    }
    out.blocks[i] = hits_.device[i];
    out.num_free_hits += device().ref_count_unchecked(hits_.device[i]) == 0;
  }
}

int32_t AttentionGroup::first_unwritten(const Sequence& seq, int32_t hit, int32_t bound) const {
  const GroupTable& t = table(seq);
  for (int32_t i = t.first_held; i < std::min(hit, bound); ++i) {
    if (shared_.ledger.written(index(), t.blocks[i])) return i;
  }
  return bound;
}

BlockId AttentionGroup::partial_source(const Sequence& seq, int32_t hit,
                                       std::span<const TokenId> next, int32_t* matched,
                                       bool unclaimed, int32_t taken) {
  const uint64_t parent = hit == 0 ? 0 : parent_key(seq, hit, /*matched=*/unclaimed);
  const BlockId src = device().longest_partial_match(parent, next, seq.extra_keys, matched);
  // Its K/V must be there before this step's copies run, and a block must be free.
  const int32_t free_src = src != kNoBlock && device().ref_count_unchecked(src) == 0;
  if (src == kNoBlock || shared_.ledger.written(index(), src) || room(free_src + taken) < 1) {
    return kNoBlock;
  }
  hits_.partial_src = src;
  return src;
}

void AttentionGroup::describe_partial(PrefixHit::Group& out) const {
  out.num_free_hits += device().ref_count_unchecked(hits_.partial_src) == 0;
  ++out.num_new_blocks;  // the copy
}

void AttentionGroup::reuse_partial(Sequence& seq, int32_t tokens) {
  const BlockId src = hits_.partial_src;
  device().touch_unchecked(src);  // so that the allocation below cannot evict it
  BlockId dst = kNoBlock;
  allocate_device_blocks({&dst, 1});
  StepLedger& ledger = shared_.ledger;
  ledger.record(kCopyOnWrite, {src, dst, tokens, index()});
  ledger.release(device(), Hold::kDevice, index(), src);  // parked until the step
  ledger.mark_filled_by_copy(index(), dst);
  table(seq).blocks.push_back(dst);
}

// --- offers, forks, releases ---------------------------------------------------------------

void AttentionGroup::offer(Sequence& seq, int32_t first, int32_t end) {
  // Entries released since (a swapped sequence offers again when it comes back) are not
  // offered.
  const int32_t from = std::max(first, table(seq).first_held);
  if (from >= end) return;
  const int32_t n = end - from;
  index_run(seq, from, n, /*matched=*/false);
  if (host_tier() != nullptr) {
    host_tier()->note_computed(std::span<const BlockId>(table(seq).blocks).subspan(from, n),
                               std::span<const BlockHash>(seq.block_hashes).subspan(from, n));
  }
}

void AttentionGroup::uncache_unwritten(const Sequence& seq) {
  const GroupTable& t = table(seq);
  const int32_t first = std::max(seq.settled_tokens / shared_.block_size, t.first_held);
  for (int32_t i = first; i < seq.num_offered_blocks; ++i) {
    const BlockId b = t.blocks[i];
    // A block a swap-in or promotion fills stays cached: its copy runs with the step's ops.
    if (device().ref_count_unchecked(b) == 1 && !shared_.ledger.filled_by_copy(index(), b)) {
      device().uncache_unchecked(b);
    }
  }
}

// The entries past the computed tokens held only rejected drafts: released, last first, as
// clean blocks (drafts are never cached).
void AttentionGroup::roll_back(Sequence& seq, int32_t) {
  std::vector<BlockId>& blocks = table(seq).blocks;
  const auto needed =
      static_cast<size_t>(num_blocks_for_tokens(seq.num_computed, shared_.block_size));
  BlockId last_clean = kNoBlock;
  for (size_t i = blocks.size(); i > needed; --i) {
    shared_.ledger.release(device(), Hold::kDevice, index(), blocks[i - 1], last_clean);
  }
  blocks.resize(std::min(blocks.size(), needed));
}

// --- hand-offs -----------------------------------------------------------------------------

namespace {

KvHandoffGroup entries(const GroupTable& t, int32_t first, int32_t end) {
  return {.first_entry = first, .blocks = {t.blocks.begin() + first, t.blocks.begin() + end}};
}

}  // namespace

KvHandoffGroup AttentionGroup::export_entries(const Sequence& seq) const {
  const GroupTable& t = table(seq);
  return entries(t, t.first_held, num_blocks_for_tokens(seq.num_computed, shared_.block_size));
}

// Past the local hit (a partially reused last block of it is filled again, whole).
KvHandoffGroup AttentionGroup::import_entries(const Sequence& seq) const {
  const GroupTable& t = table(seq);
  const int32_t local = (seq.num_computed - seq.num_importing) / shared_.block_size;
  return entries(t, std::max(local, t.first_held),
                 num_blocks_for_tokens(seq.num_computed, shared_.block_size));
}

// Entries before the import's are local hits; the held ones among them are intact.
bool AttentionGroup::serves_import(const Sequence& seq, int32_t p, int32_t verified) const {
  if (p == 0) return true;
  const KvHandoffGroup imported = import_entries(seq);
  return first_needed_block(p) >= table(seq).first_held &&
         num_blocks_for_tokens(p, shared_.block_size) <= imported.first_entry + verified;
}

absl::Status AttentionGroup::check_fork(const Sequence&, const char*) const {
  return absl::OkStatus();
}

// Only blocks holding computed tokens are shared; the parent keeps its lookahead blocks.
void AttentionGroup::fork(Sequence& child, int32_t context_blocks) {
  GroupTable& t = table(child);
  t.blocks.resize(std::max(t.first_held, context_blocks));
  for (size_t i = t.first_held; i < t.blocks.size(); ++i) device().touch_unchecked(t.blocks[i]);
}

int32_t AttentionGroup::held_entries(const Sequence& seq) const {
  return num_blocks_for_tokens(seq.num_computed, shared_.block_size) - table(seq).first_held;
}

int32_t AttentionGroup::entry_tokens(const Sequence& seq, int32_t entry) const {
  return std::min(shared_.block_size, seq.num_computed - entry * shared_.block_size);
}

bool AttentionGroup::retains_on_release(const Sequence& seq) const {
  return !seq.retention.empty();
}

void AttentionGroup::set_release_retention(const Sequence& seq, int32_t entry) {
  set_range_retention(seq, entry);
}

// The engine's retention ranges name what it will reuse.
bool AttentionGroup::set_range_retention(const Sequence& seq, int32_t entry) {
  const BlockId block = table(seq).blocks[entry];
  const int64_t first_token = int64_t{entry} * shared_.block_size;
  for (auto r = seq.retention.rbegin(); r != seq.retention.rend(); ++r) {
    if (first_token >= r->begin && first_token < r->end) {
      device().set_retention_unchecked(block, r->priority, r->duration_ms);
      return true;
    }
  }
  return false;
}

// --- checks --------------------------------------------------------------------------------

namespace {

template <typename... Parts>
absl::Status broken(const Parts&... parts) {
  return absl::InternalError(absl::StrCat("KvCacheManager invariant: ", parts...));
}

}  // namespace

// `seq`'s table: its length for the state, released entries only before the window of the
// next token, and held blocks indexed under the sequence's hashes.
absl::Status AttentionGroup::check_table(const Sequence& s) const {
  const GroupTable& t = table(s);
  const int32_t context_blocks = num_blocks_for_tokens(s.num_computed, shared_.block_size);
  const auto size = static_cast<int32_t>(t.blocks.size());
  const auto host = static_cast<int32_t>(t.host_blocks.size());
  const std::string where = absl::StrCat("seq ", s.id, " group ", index());
  switch (s.state) {
    case SequenceState::kRunning:
      if (size < context_blocks || host != 0) {
        return broken(where, " running: table of ", size, " blocks for ", s.num_computed,
                      " computed tokens, ", host, " host blocks");
      }
      break;
    case SequenceState::kWaiting:
      // Only a claimed prefix of computed blocks: full ones, and a partial block reused
      // from a cached one (partial-block reuse).
      if (size != context_blocks || host != 0) {
        return broken(where, " waiting: table of ", size, " blocks but ", s.num_computed,
                      " computed tokens, ", host, " host blocks");
      }
      break;
    case SequenceState::kSwapped:
      if (size != 0 || host != context_blocks - t.first_held) {
        return broken(where, " swapped: ", size, " device blocks, ", host, " host blocks for ",
                      s.num_computed, " computed tokens from entry ", t.first_held);
      }
      return absl::OkStatus();
  }
  const int32_t first_needed = first_needed_block(s.num_computed);
  if (t.first_held < 0 || t.first_held > std::max(first_needed, 0) ||
      (size == 0 && t.first_held != 0)) {
    return broken(where, ": entries before ", t.first_held,
                  " released, but the next token attends from entry ", first_needed);
  }
  for (int32_t i = 0; i < size; ++i) {
    if ((t.blocks[i] == kNoBlock) != (i < t.first_held)) {
      return broken(where, ": entry ", i, " is ", t.blocks[i], " with the first held entry at ",
                    t.first_held);
    }
  }
  // A hashed block holds its sequence's hash of those tokens.
  const int32_t hashed = std::min<int32_t>(s.num_offered_blocks, size);
  for (int32_t i = t.first_held; i < hashed && i < std::ssize(s.block_hashes); ++i) {
    const absl::StatusOr<BlockHash> hash = device().cached_hash(t.blocks[i]);  // NotFound: not
    if (hash.ok() && !(*hash == s.block_hashes[i])) {
      return broken(where, ": block ", t.blocks[i], " at table index ", i,
                    " is indexed under another hash than the sequence's");
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
