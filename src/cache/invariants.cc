// KvCacheManager::check_invariants(): every clause of DESIGN.md's invariants that spans
// sequences and pools, one clause at a time and group by group, then the checks of its
// parts (pools, step ledger, host tiers).
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/group_pools.h"
#include "cache/host_tier.h"
#include "cache/sequence.h"
#include "cache/step_ledger.h"
#include "common/status_macros.h"
#include "pagedkv/kv_cache_manager.h"

namespace pagedkv {

using internal::GroupPools;
using internal::GroupTable;
using internal::Sequence;

namespace {

template <typename... Parts>
absl::Status broken(const Parts&... parts) {
  return absl::InternalError(absl::StrCat("KvCacheManager invariant: ", parts...));
}

absl::Status check_tokens(const Sequence& s, int32_t block_size, int32_t max_model_len) {
  const auto num_tokens = static_cast<int64_t>(s.tokens.size());
  if (num_tokens < 1 || num_tokens > max_model_len) {
    return broken("seq ", s.id, ": ", num_tokens, " tokens outside [1, ", max_model_len, "]");
  }
  if (s.num_computed < 0 || s.num_computed > num_tokens) {
    return broken("seq ", s.id, ": ", s.num_computed, " computed of ", num_tokens, " tokens");
  }
  if (s.num_offered_blocks > s.num_computed / block_size) {
    return broken("seq ", s.id, ": ", s.num_offered_blocks, " blocks offered to the index but ",
                  s.num_computed / block_size, " full computed blocks");
  }
  return absl::OkStatus();
}

// A state group's table of `s`: one slot from its admission on (a waiting sequence's
// claim restores one), its host copy while swapped; never a cached checkpoint.
absl::Status check_state_table(const Sequence& s, const GroupPools& g) {
  const GroupTable& t = s.tables[g.index];
  const auto table = static_cast<int32_t>(t.blocks.size());
  const auto host = static_cast<int32_t>(t.host_blocks.size());
  const int32_t slots = s.state == SequenceState::kRunning   ? 1
                        : s.state == SequenceState::kWaiting ? (s.num_computed > 0 ? 1 : 0)
                                                             : 0;
  const int32_t host_slots = s.state == SequenceState::kSwapped ? 1 : 0;
  if (table != slots || host != host_slots || t.first_held != 0) {
    return broken("seq ", s.id, " state group ", g.index, " ", internal::state_name(s.state),
                  " with ", s.num_computed, " computed tokens: ", table, " slots (want ", slots,
                  "), ", host, " host slots (want ", host_slots, "), first held ", t.first_held);
  }
  if (table == 1 && g.device.is_cached(t.blocks[0]).value()) {
    return broken("seq ", s.id, " state group ", g.index, ": its slot ", t.blocks[0],
                  " is a cached checkpoint");
  }
  return absl::OkStatus();
}

// One group's table of `s`: its length for the state, released entries only before the
// window of the next token, and held blocks indexed under the sequence's hashes.
absl::Status check_table(const Sequence& s, const GroupPools& g, int32_t block_size) {
  if (g.holds_state()) return check_state_table(s, g);
  const GroupTable& t = s.tables[g.index];
  const int32_t context_blocks = num_blocks_for_tokens(s.num_computed, block_size);
  const auto table = static_cast<int32_t>(t.blocks.size());
  const auto host = static_cast<int32_t>(t.host_blocks.size());
  const std::string where = absl::StrCat("seq ", s.id, " group ", g.index);
  switch (s.state) {
    case SequenceState::kRunning:
      if (table < context_blocks || host != 0) {
        return broken(where, " running: table of ", table, " blocks for ", s.num_computed,
                      " computed tokens, ", host, " host blocks");
      }
      break;
    case SequenceState::kWaiting:
      // Only a claimed prefix of computed blocks: full ones, and a partial block reused
      // from a cached one (partial-block reuse).
      if (table != context_blocks || host != 0) {
        return broken(where, " waiting: table of ", table, " blocks but ", s.num_computed,
                      " computed tokens, ", host, " host blocks");
      }
      break;
    case SequenceState::kSwapped:
      if (table != 0 || host != context_blocks - t.first_held) {
        return broken(where, " swapped: ", table, " device blocks, ", host, " host blocks for ",
                      s.num_computed, " computed tokens from entry ", t.first_held);
      }
      return absl::OkStatus();
  }
  const int32_t first_needed = g.windowed() ? g.first_needed_block(s.num_computed, block_size) : 0;
  if (t.first_held < 0 || t.first_held > std::max(first_needed, 0) ||
      (table == 0 && t.first_held != 0)) {
    return broken(where, ": entries before ", t.first_held,
                  " released, but the next token attends from entry ", first_needed);
  }
  for (int32_t i = 0; i < table; ++i) {
    if ((t.blocks[i] == kNoBlock) != (i < t.first_held)) {
      return broken(where, ": entry ", i, " is ", t.blocks[i], " with the first held entry at ",
                    t.first_held);
    }
  }
  // A hashed block holds its sequence's hash of those tokens.
  const int32_t hashed = std::min<int32_t>(s.num_offered_blocks, table);
  for (int32_t i = t.first_held; i < hashed && i < std::ssize(s.block_hashes); ++i) {
    const absl::StatusOr<BlockHash> hash = g.device.cached_hash(t.blocks[i]);  // NotFound: not
    if (hash.ok() && !(*hash == s.block_hashes[i])) {
      return broken(where, ": block ", t.blocks[i], " at table index ", i,
                    " is indexed under another hash than the sequence's");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status KvCacheManager::check_pool_balance(const GroupPools& g, bool host) const {
  const BlockPool& pool = host ? g.host : g.device;
  std::vector<int32_t> holders(pool.num_blocks(), 0);
  const std::string pool_name = absl::StrCat(
      host ? "host" : "device", groups_.size() > 1 ? absl::StrCat(" group ", g.index) : "");
  std::vector<int64_t> seen(pool.num_blocks(), -1);  // last sequence (by visit) holding it
  int64_t visit = 0;
  for (const auto& [id, s] : sequences_) {
    ++visit;
    const GroupTable& t = s->tables[g.index];
    const std::span<const BlockId> held =
        host ? std::span<const BlockId>(t.host_blocks)
             : std::span<const BlockId>(t.blocks).subspan(std::min<size_t>(
                   static_cast<size_t>(std::max(t.first_held, 0)), t.blocks.size()));
    for (const BlockId b : held) {
      if (b < 0 || b >= pool.num_blocks()) {
        return broken("seq ", id, " holds invalid ", pool_name, " block ", b);
      }
      if (seen[b] == visit) return broken("seq ", id, " holds ", pool_name, " block ", b, " twice");
      seen[b] = visit;
      ++holders[b];
    }
  }
  for (const internal::StepLedger::Parked& p :
       host ? ledger_->deferred_host() : ledger_->deferred_device()) {
    if (p.group == g.index) ++holders[p.block];
  }
  for (BlockId b = 0; b < pool.num_blocks(); ++b) {
    if (pool.ref_count_unchecked(b) != holders[b]) {
      return broken(pool_name, " block ", b, ": ref_count ", pool.ref_count_unchecked(b),
                    " but held by ", holders[b], " tables or pending copies");
    }
  }
  return absl::OkStatus();
}

// What decode_in_place() trusts without reading the ref count: a block a sequence found
// unshared at the device pool's current share epoch, and still holds, is held once.
absl::Status KvCacheManager::check_exclusive_block(const Sequence& s) const {
  const BlockPool& pool = groups_[0].device;
  if (s.exclusive_epoch != pool.share_epoch()) return absl::OkStatus();
  const std::vector<BlockId>& blocks = s.tables[0].blocks;
  if (std::find(blocks.begin(), blocks.end(), s.exclusive_block) == blocks.end()) {
    return absl::OkStatus();
  }
  if (pool.ref_count_unchecked(s.exclusive_block) != 1) {
    return broken("seq ", s.id, ": block ", s.exclusive_block, " found unshared at share epoch ",
                  s.exclusive_epoch, " has ref_count ",
                  pool.ref_count_unchecked(s.exclusive_block));
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::check_invariants() const {
  for (const GroupPools& g : groups_) {
    PAGEDKV_RETURN_IF_ERROR(g.device.check_invariants());
    PAGEDKV_RETURN_IF_ERROR(g.host.check_invariants());
  }
  for (const auto& [id, s] : sequences_) {
    if (s->id != id) return broken("sequence stored under id ", id, " has id ", s->id);
    if (s->tables.size() != groups_.size()) {
      return broken("seq ", id, ": ", s->tables.size(), " tables for ", groups_.size(), " groups");
    }
    PAGEDKV_RETURN_IF_ERROR(check_tokens(*s, options_.block_size, options_.max_model_len));
    PAGEDKV_RETURN_IF_ERROR(check_exclusive_block(*s));
    for (const GroupPools& g : groups_) {
      PAGEDKV_RETURN_IF_ERROR(check_table(*s, g, options_.block_size));
    }
  }
  const auto running = std::count_if(sequences_.begin(), sequences_.end(), [](const auto& entry) {
    return entry.second->state == SequenceState::kRunning;
  });
  if (running != num_running_) {
    return broken("num_running ", num_running_, " but ", running, " sequences running");
  }
  for (const GroupPools& g : groups_) {
    PAGEDKV_RETURN_IF_ERROR(check_pool_balance(g, /*host=*/false));
    PAGEDKV_RETURN_IF_ERROR(check_pool_balance(g, /*host=*/true));
    if (g.host_tier != nullptr) {
      PAGEDKV_RETURN_IF_ERROR(g.host_tier->check_invariants(g.host, *ledger_, g.index,
                                                            /*exclusive=*/!g.holds_state()));
    }
    PAGEDKV_RETURN_IF_ERROR(check_host_blocks(g));
  }
  return ledger_->check_invariants(
      [this](int32_t group) -> const BlockPool& { return groups_[group].device; });
}

// Host-tier blocks belong to no sequence: a swapped sequence's host blocks are its only
// copy of that K/V and never cached.
absl::Status KvCacheManager::check_host_blocks(const GroupPools& g) const {
  if (!options_.enable_host_cache && g.host.stats().cached_blocks != 0) {
    return broken("host tier off but ", g.host.stats().cached_blocks, " host blocks cached");
  }
  for (const auto& [id, s] : sequences_) {
    for (const BlockId h : s->tables[g.index].host_blocks) {
      if (g.host.is_cached(h).value()) {
        return broken("seq ", id, " holds host block ", h, ", which is in the host tier");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedkv
