// StateGroup: a state slot per started sequence, and checkpoints of it.
#include "cache/state_group.h"

#include "absl/strings/str_cat.h"

namespace pagedkv::internal {

int64_t StateGroup::blocks_to_run(int64_t) const { return 1; }

// --- hits ----------------------------------------------------------------------------------

int32_t StateGroup::begin_match(const Sequence&, int32_t max_blocks) { return max_blocks; }

uint64_t StateGroup::checkpoint_parent(const Sequence& seq, int32_t blocks, bool matched) const {
  if (blocks == 1) return 0;
  return matched ? anchor_->matched_key(blocks - 2) : anchor_->held_key(seq, blocks - 2);
}

int32_t StateGroup::longest_hit(const Sequence& seq, int32_t p) {
  for (int32_t q = p; q > 0; --q) {
    const BlockHash& hash = seq.block_hashes[q - 1];
    const uint64_t parent = checkpoint_parent(seq, q, /*matched=*/true);
    const auto tokens = block_tokens(seq, q - 1, shared_.block_size);
    const BlockId c = device().indexed_block(hash);
    if (c != kNoBlock && !shared_.ledger.written(index(), c) &&
        device().holds_contents(c, parent, tokens, seq.extra_keys)) {
      if (room(device().ref_count_unchecked(c) == 0 ? 1 : 0) < 1) return 0;
      hit_ = c;
      hit_on_host_ = false;
      return q;
    }
    if (host_tier() == nullptr) continue;
    const BlockId h = HostTier::find_hit(host(), hash, parent, tokens, seq.extra_keys);
    if (h == kNoBlock) continue;
    if (room(0) < 1) return 0;
    hit_ = h;
    hit_on_host_ = true;
    return q;
  }
  return 0;
}

void StateGroup::restore_checkpoint(Sequence& seq) {
  BlockPoolCore& pool = hit_on_host_ ? host() : device();
  // So that the allocation below cannot evict it (nor its demotions, on the host).
  pool.touch_unchecked(hit_);
  BlockId slot = kNoBlock;
  allocate_device_blocks({&slot, 1});
  StepLedger& ledger = shared_.ledger;
  ledger.record(hit_on_host_ ? kPromote : kCopyState, {hit_, slot, shared_.block_size, index()});
  ledger.mark_filled_by_copy(index(), slot);
  // Parked until the step.
  ledger.release(pool, hit_on_host_ ? Hold::kHost : Hold::kDevice, index(), hit_);
  if (host_tier() != nullptr) {
    if (hit_on_host_) {
      host_tier()->note_restored();
    } else {
      host_tier()->note_hit(hit_);
    }
  }
  table(seq).blocks.assign(1, slot);
  ++counters_.checkpoints_restored;
}

void StateGroup::describe_hit(PrefixHit::Group& out) const {
  out.blocks.assign(1, hit_on_host_ ? kNoBlock : hit_);
  out.num_free_hits = !hit_on_host_ && device().ref_count_unchecked(hit_) == 0 ? 1 : 0;
  out.num_new_blocks = 1;  // the sequence's slot
}

// --- checkpoints ---------------------------------------------------------------------------

bool StateGroup::checkpoint_due(const Sequence& seq, int32_t blocks,
                                const KvCacheManager::Options& options) {
  const int32_t every = options.state_checkpoint_interval_blocks;
  return blocks == seq.prompt_len / options.block_size || blocks == seq.state_branch ||
         (every != 0 && blocks % every == 0);
}

void StateGroup::save_checkpoint(Sequence& seq, int32_t blocks) {
  const int32_t bs = shared_.block_size;
  hash_full_blocks(seq, blocks, bs, shared_.options.hash_fn);
  const BlockHash& hash = seq.block_hashes[blocks - 1];
  const uint64_t parent = checkpoint_parent(seq, blocks, /*matched=*/false);
  const auto tokens = block_tokens(seq, blocks - 1, bs);
  const BlockId kept = device().indexed_block(hash);
  if (kept != kNoBlock && device().holds_contents(kept, parent, tokens, seq.extra_keys)) return;
  if (device().num_free_blocks() <= watermark_blocks()) return;
  BlockId checkpoint = kNoBlock;
  allocate_device_blocks({&checkpoint, 1});
  const int32_t cached = device().cache_full_blocks_unchecked(
      {&checkpoint, 1}, {&hash, 1}, kNoBlock, blocks == 1 ? nullptr : &seq.block_hashes[blocks - 2],
      tokens, seq.extra_keys, {&parent, 1});
  // A copy kept after other parent contents is replaced; a collision or K/V from before a
  // reset_prefix_cache() is not indexed, so not saved.
  if (cached == 0) {
    device().free_unchecked({&checkpoint, 1});
    return;
  }
  // HostAdmission::kReused: a new checkpoint has no evidence of reuse, unless a ghost.
  if (host_tier() != nullptr) host_tier()->note_computed({&checkpoint, 1}, {&hash, 1});
  StepLedger& ledger = shared_.ledger;
  ledger.record(StateSave{.seq = seq.id,
                          .position = blocks * bs,
                          .src = table(seq).blocks[0],
                          .dst = checkpoint,
                          .group = index()});
  ledger.mark_written(index(), checkpoint);                      // restorable from the next step on
  ledger.release(device(), Hold::kDevice, index(), checkpoint);  // parked until the step ends
  ++counters_.checkpoints_saved;
}

// --- a step, forks, swaps ------------------------------------------------------------------

// A slot from the admission on, and one per draft; no slots for the other tokens: their
// state is updated in place.
absl::Status StateGroup::plan_step(const Sequence& seq, const StepRequest& step,
                                   GroupPlan& plan) const {
  const int32_t reserve = step.admission && shared_.num_running > 0 ? watermark_blocks() : 0;
  plan = {.new_blocks = (table(seq).blocks.empty() ? 1 : 0) + step.num_draft};
  if (plan.new_blocks + reserve > device().num_free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "allocate_slots(seq ", seq.id, "): need ",
        step.num_draft == 0 ? "a state slot" : absl::StrCat(plan.new_blocks, " state slots"),
        reserve > 0 ? absl::StrCat(" + watermark ", reserve) : "", " in group ", index(), ", ",
        device().num_free_blocks(), " free of ", spec().num_blocks));
  }
  return absl::OkStatus();
}

void StateGroup::apply_step(Sequence& seq, const StepRequest& step, const GroupPlan& plan,
                            std::span<int64_t> slots) {
  GroupTable& t = table(seq);
  if (plan.new_blocks > step.num_draft) {
    t.blocks.resize(1);
    allocate_device_blocks(t.blocks);
  }
  if (step.num_draft > 0) {
    t.draft_slots.resize(step.num_draft);
    allocate_device_blocks(t.draft_slots);
  }
  const auto verified = static_cast<int64_t>(slots.size() - t.draft_slots.size());
  std::fill_n(slots.begin(), verified, int64_t{-1});
  std::copy(t.draft_slots.begin(), t.draft_slots.end(), slots.begin() + verified);
}

void StateGroup::roll_back(Sequence& seq, int32_t num_accepted) {
  GroupTable& t = table(seq);
  if (num_accepted > 0) std::swap(t.blocks[0], t.draft_slots[num_accepted - 1]);
  release_draft_slots(t);
}

KvHandoffGroup StateGroup::export_entries(const Sequence& seq) const {
  return {.first_entry = 0, .blocks = table(seq).blocks};
}

KvHandoffGroup StateGroup::import_entries(const Sequence& seq) const { return export_entries(seq); }

bool StateGroup::serves_import(const Sequence& seq, int32_t p, int32_t verified) const {
  return p == 0 || (p == seq.num_computed && verified == 1);
}

absl::Status StateGroup::check_fork(const Sequence& parent, const char* caller) const {
  if (table(parent).blocks.empty()) return absl::OkStatus();
  if (shared_.ledger.scheduled(parent)) {
    return absl::FailedPreconditionError(
        absl::StrCat(caller, "(parent ", parent.id, "): its state in group ", index(),
                     " is not computed before this step's ops run; fork after the step"));
  }
  if (device().num_free_blocks() < 1) {
    return absl::ResourceExhaustedError(absl::StrCat(caller, "(parent ", parent.id,
                                                     "): no free state slot in group ", index(),
                                                     " of ", spec().num_blocks));
  }
  return absl::OkStatus();
}

void StateGroup::fork(Sequence& child, int32_t) {
  std::vector<BlockId>& blocks = table(child).blocks;
  if (blocks.empty()) return;
  const BlockId parent_slot = blocks[0];
  allocate_device_blocks({blocks.data(), 1});
  StepLedger& ledger = shared_.ledger;
  ledger.record(kCopyState, {parent_slot, blocks[0], shared_.block_size, index()});
  ledger.mark_filled_by_copy(index(), blocks[0]);
  ledger.mark_scheduled(child, child.num_computed);
}

int32_t StateGroup::held_entries(const Sequence& seq) const {
  return static_cast<int32_t>(table(seq).blocks.size());
}

int32_t StateGroup::entry_tokens(const Sequence&, int32_t) const { return shared_.block_size; }

// --- checks --------------------------------------------------------------------------------

absl::Status StateGroup::check_table(const Sequence& s) const {
  const GroupTable& t = table(s);
  const auto slots = static_cast<int32_t>(t.blocks.size());
  const auto host_slots = static_cast<int32_t>(t.host_blocks.size());
  const int32_t want = s.state == SequenceState::kRunning   ? 1
                       : s.state == SequenceState::kWaiting ? (s.num_computed > 0 ? 1 : 0)
                                                            : 0;
  const int32_t want_host = s.state == SequenceState::kSwapped ? 1 : 0;
  if (slots != want || host_slots != want_host || t.first_held != 0 ||
      std::ssize(t.draft_slots) != s.num_draft) {
    return absl::InternalError(absl::StrCat(
        "KvCacheManager invariant: seq ", s.id, " state group ", index(), " ", state_name(s.state),
        " with ", s.num_computed, " computed tokens: ", slots, " slots (want ", want, "), ",
        host_slots, " host slots (want ", want_host, "), first held ", t.first_held, ", ",
        t.draft_slots.size(), " draft slots for ", s.num_draft, " drafts"));
  }
  if (slots == 1 && device().is_cached(t.blocks[0]).value()) {
    return absl::InternalError(absl::StrCat("KvCacheManager invariant: seq ", s.id, " state group ",
                                            index(), ": its slot ", t.blocks[0],
                                            " is a cached checkpoint"));
  }
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
