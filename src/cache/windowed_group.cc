// WindowedGroup: hits that every needed entry of a window can serve, releases behind the
// window, and the eviction class a released block keeps.
#include "cache/windowed_group.h"

#include <algorithm>

#include "common/arithmetic.h"

namespace pagedkv::internal {

int64_t WindowedGroup::blocks_to_run(int64_t prompt_tokens) const {
  const int32_t bs = shared_.block_size;
  return std::min<int64_t>(num_blocks_for_tokens(prompt_tokens, bs),
                           div_ceil(spec().window - 1, bs) + 1);
}

// --- hits ----------------------------------------------------------------------------------

int32_t WindowedGroup::begin_match(const Sequence&, int32_t max_blocks) {
  hits_.reserve(max_blocks);
  if (std::ssize(looked_up_) < max_blocks) looked_up_.resize(max_blocks);
  std::fill_n(looked_up_.begin(), max_blocks, Lookup::kUnknown);
  return max_blocks;
}

bool WindowedGroup::claimable(const Sequence& seq, int32_t i) {
  if (looked_up_[i] != Lookup::kUnknown) return looked_up_[i] == Lookup::kFound;
  const uint64_t parent = i == 0 ? 0 : anchor_->matched_key(i - 1);
  const auto tokens = block_tokens(seq, i, shared_.block_size);
  BlockId& on_device = hits_.device[i];
  on_device = device().indexed_block(seq.block_hashes[i], key_space());
  if (on_device != kNoBlock &&
      !device().holds_contents(on_device, parent, tokens, seq.extra_keys)) {
    on_device = kNoBlock;
  }
  hits_.host[i] =
      on_device == kNoBlock && host_tier() != nullptr
          ? HostTier::find_hit(host(), seq.block_hashes[i], parent, tokens, seq.extra_keys)
          : kNoBlock;
  const bool found = on_device != kNoBlock || hits_.host[i] != kNoBlock;
  looked_up_[i] = found ? Lookup::kFound : Lookup::kMissing;
  return found;
}

// Every entry the token at q x block_size attends to is there, with no more in the host
// tier than free device blocks to promote them into.
int32_t WindowedGroup::longest_hit(const Sequence& seq, int32_t p) {
  int32_t q = p;
  while (q > 0) {
    const int32_t first = first_needed_block(int64_t{q} * shared_.block_size);
    int32_t in_host = 0;
    int32_t free_hits = 0;
    int32_t missing = -1;
    for (int32_t i = q - 1; i >= first; --i) {  // the last entries are the likeliest misses
      if (!claimable(seq, i)) {
        missing = i;
        break;
      }
      const BlockId d = hits_.device[i];
      in_host += d == kNoBlock;
      free_hits += d != kNoBlock && device().ref_count_unchecked(d) == 0;
    }
    if (missing < 0 && in_host <= room(free_hits)) return q;
    // A hit past a missing entry would need it; with too many promotions, try one less.
    q = missing >= 0 ? missing : q - 1;
  }
  return 0;
}

uint64_t WindowedGroup::parent_key(const Sequence& seq, int32_t entry, bool matched) const {
  return matched ? anchor_->matched_key(entry - 1) : anchor_->held_key(seq, entry - 1);
}

// After the anchor's blocks: this group's own parents may be released.
void WindowedGroup::index_run(Sequence& seq, int32_t first, int32_t n, bool matched) {
  const int32_t bs = shared_.block_size;
  parent_keys_.resize(n);
  for (int32_t j = 0; j < n; ++j) {
    const int32_t i = first + j;
    parent_keys_[j] = i == 0 ? 0 : parent_key(seq, i, matched);
  }
  device().cache_full_blocks_unchecked(
      std::span<const BlockId>(table(seq).blocks).subspan(first, n),
      std::span<const BlockHash>(seq.block_hashes).subspan(first, n), kNoBlock,
      first == 0 ? nullptr : &seq.block_hashes[first - 1],
      std::span<const TokenId>(seq.tokens)
          .subspan(static_cast<size_t>(first) * bs, static_cast<size_t>(n) * bs),
      seq.extra_keys, parent_keys_, key_space());
}

// --- a step --------------------------------------------------------------------------------

absl::Status WindowedGroup::plan_step(const Sequence& seq, const StepRequest& step,
                                      GroupPlan& plan) const {
  int32_t freed = 0;
  // An import computes nothing here: only the window at its end must be held, so the
  // entries behind it are released, or never allocated when the table ends before them.
  const int64_t needed_from = step.import ? step.new_total : seq.num_computed;
  const int32_t end = release_end(seq, needed_from, freed);
  const int32_t skipped = step.import && end == std::ssize(table(seq).blocks)
                              ? std::max(0, first_needed_block(step.new_total) - end)
                              : 0;
  return plan_blocks(seq, step, end, freed, skipped, plan);
}

void WindowedGroup::release_before_step(Sequence& seq, const GroupPlan& plan) {
  GroupTable& t = table(seq);
  if (plan.release_end > t.first_held) release_behind_window(seq, plan.release_end);
  if (plan.skipped > 0) {
    t.blocks.resize(t.blocks.size() + plan.skipped, kNoBlock);
    t.first_held = static_cast<int32_t>(t.blocks.size());
  }
}

void WindowedGroup::release_unimported(Sequence& seq) {
  const int32_t end = first_needed_block(seq.num_computed);
  if (end > table(seq).first_held) release_behind_window(seq, end);
}

int32_t WindowedGroup::release_end(const Sequence& seq, int64_t needed_from, int32_t& freed) const {
  const GroupTable& t = table(seq);
  const StepLedger& ledger = shared_.ledger;
  const int32_t first_needed = first_needed_block(needed_from);
  int32_t end = t.first_held;
  freed = 0;
  for (; end < first_needed && end < std::ssize(t.blocks); ++end) {
    const BlockId b = t.blocks[end];
    if (ledger.written(index(), b)) break;
    freed += device().ref_count_unchecked(b) == 1 && !ledger.holds_device(index(), b);
  }
  return end;
}

// No future token of the sequence attends to them. Hashed blocks stay cached, so a later
// prompt can still hit them, in the retention class of the hit points they complete; they
// go in table order, so within a class the free queue evicts a window from its start
// (without classes, Options::window_eviction_classes, in vLLM's order).
void WindowedGroup::release_behind_window(Sequence& seq, int32_t end) {
  GroupTable& t = table(seq);
  BlockId last_clean = kNoBlock;
  // Without window classes the last entry goes first, as vLLM frees them.
  const bool table_order = shared_.options.window_eviction_classes;
  for (int32_t k = 0; k < end - t.first_held; ++k) {
    const int32_t i = table_order ? t.first_held + k : end - 1 - k;
    set_release_retention(seq, i);
    shared_.ledger.release(device(), Hold::kDevice, index(), t.blocks[i], last_clean);
    t.blocks[i] = kNoBlock;
  }
  counters_.released_blocks += end - t.first_held;
  t.first_held = end;
}

// --- eviction classes ----------------------------------------------------------------------

bool WindowedGroup::retains_on_release(const Sequence& seq) const {
  return !seq.retention.empty() || has_classes();
}

bool WindowedGroup::has_classes() const {
  return shared_.options.enable_prefix_caching && shared_.options.window_eviction_classes;
}

// The engine's retention ranges win over the window classes: they name what it will reuse.
void WindowedGroup::set_release_retention(const Sequence& seq, int32_t entry) {
  if (set_range_retention(seq, entry) || !has_classes()) return;
  device().set_retention_unchecked(table(seq).blocks[entry], window_priority(seq, entry), 0);
}

// The class of the most useful hit point whose window holds the entry (a hit of p blocks
// needs entries first_needed_block(p x block_size) to p - 1). Top: the branch points of the
// sequence's match (its full-group chain's end, its hit's end: a later prompt is likely to
// stop there again); below, the checkpoints, coarser ones higher; lowest, none.
int32_t WindowedGroup::window_priority(const Sequence& seq, int32_t entry) const {
  const int32_t bs = shared_.block_size;
  const KvCacheManager::Options& options = shared_.options;
  const int32_t levels =
      options.window_checkpoint_tokens > 0 ? options.window_checkpoint_levels : 0;
  const int32_t top = 2 + levels;
  // A hit point lies within the sequence's full blocks: past them, no later prompt with
  // this content can stop there.
  const int64_t full_blocks = static_cast<int64_t>(seq.tokens.size()) / bs;
  auto completes = [&](int64_t point) {  // in blocks
    return point > entry && point <= full_blocks && first_needed_block(point * bs) <= entry;
  };
  int32_t cls = 1;
  if (completes(seq.match_chain_end) || completes(seq.match_hit)) {
    cls = top;
  } else {
    int64_t spacing = options.window_checkpoint_tokens;
    for (int32_t level = 0; level < levels && spacing >= bs; ++level, spacing /= 2) {
      // The first checkpoint past the entry; a later one's window starts later still.
      const int64_t k = div_ceil(int64_t{entry + 1} * bs, spacing);
      if (completes(k * spacing / bs)) {
        cls = top - 1 - level;
        break;
      }
    }
  }
  return kDefaultRetentionPriority - (top - cls);
}

}  // namespace pagedkv::internal
