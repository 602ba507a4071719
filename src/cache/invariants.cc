// KvCacheManager::check_invariants(): every clause of DESIGN.md's invariants that spans
// sequences and pools, one clause at a time, then the checks of its parts (pools, step
// ledger, host tier).
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/host_tier.h"
#include "cache/sequence.h"
#include "cache/step_ledger.h"
#include "common/status_macros.h"
#include "pagedkv/kv_cache_manager.h"

namespace pagedkv {

using internal::Sequence;

namespace {

template <typename... Parts>
absl::Status broken(const Parts&... parts) {
  return absl::InternalError(absl::StrCat("KvCacheManager invariant: ", parts...));
}

absl::Status check_sequence(const Sequence& s, int32_t block_size, int32_t max_model_len,
                            const BlockPool& device) {
  const auto num_tokens = static_cast<int64_t>(s.tokens.size());
  if (num_tokens < 1 || num_tokens > max_model_len) {
    return broken("seq ", s.id, ": ", num_tokens, " tokens outside [1, ", max_model_len, "]");
  }
  if (s.num_computed < 0 || s.num_computed > num_tokens) {
    return broken("seq ", s.id, ": ", s.num_computed, " computed of ", num_tokens, " tokens");
  }
  const int32_t context_blocks = num_blocks_for_tokens(s.num_computed, block_size);
  const auto table = static_cast<int32_t>(s.blocks.size());
  switch (s.state) {
    case SequenceState::kRunning:
      if (table < context_blocks || !s.host_blocks.empty()) {
        return broken("seq ", s.id, " running: table of ", table, " blocks for ", s.num_computed,
                      " computed tokens, ", s.host_blocks.size(), " host blocks");
      }
      break;
    case SequenceState::kWaiting:
      // Only a claimed prefix of full, computed blocks.
      if (int64_t{table} * block_size != s.num_computed || !s.host_blocks.empty()) {
        return broken("seq ", s.id, " waiting: table of ", table, " blocks but ", s.num_computed,
                      " computed tokens, ", s.host_blocks.size(), " host blocks");
      }
      break;
    case SequenceState::kSwapped:
      if (table != 0 || static_cast<int32_t>(s.host_blocks.size()) != context_blocks) {
        return broken("seq ", s.id, " swapped: ", table, " device blocks, ", s.host_blocks.size(),
                      " host blocks for ", s.num_computed, " computed tokens");
      }
      break;
  }
  if (s.num_offered_blocks > s.num_computed / block_size) {
    return broken("seq ", s.id, ": ", s.num_offered_blocks, " blocks offered to the index but ",
                  s.num_computed / block_size, " full computed blocks");
  }
  // A hashed block holds its sequence's hash of those tokens.
  const int32_t hashed = std::min<int32_t>(s.num_offered_blocks, table);
  for (int32_t i = 0; i < hashed && i < static_cast<int32_t>(s.block_hashes.size()); ++i) {
    const BlockId b = s.blocks[i];
    const absl::StatusOr<BlockHash> hash = device.cached_hash(b);  // NotFound: not hashed
    if (hash.ok() && !(*hash == s.block_hashes[i])) {
      return broken("seq ", s.id, ": block ", b, " at table index ", i,
                    " is indexed under another hash than the sequence's");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status KvCacheManager::check_pool_balance(const BlockPool& pool, bool host) const {
  std::vector<int32_t> holders(pool.num_blocks(), 0);
  const char* pool_name = host ? "host" : "device";
  std::vector<int64_t> seen(pool.num_blocks(), -1);  // last sequence (by visit) holding it
  int64_t visit = 0;
  for (const auto& [id, s] : sequences_) {
    ++visit;
    for (const BlockId b : host ? s->host_blocks : s->blocks) {
      if (b < 0 || b >= pool.num_blocks()) {
        return broken("seq ", id, " holds invalid ", pool_name, " block ", b);
      }
      if (seen[b] == visit) return broken("seq ", id, " holds ", pool_name, " block ", b, " twice");
      seen[b] = visit;
      ++holders[b];
    }
  }
  for (const BlockId b : host ? ledger_->deferred_host() : ledger_->deferred_device()) ++holders[b];
  for (BlockId b = 0; b < pool.num_blocks(); ++b) {
    if (pool.ref_count_unchecked(b) != holders[b]) {
      return broken(pool_name, " block ", b, ": ref_count ", pool.ref_count_unchecked(b),
                    " but held by ", holders[b], " tables or pending copies");
    }
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::check_invariants() const {
  PAGEDKV_RETURN_IF_ERROR(device_pool_.check_invariants());
  PAGEDKV_RETURN_IF_ERROR(host_pool_.check_invariants());
  for (const auto& [id, s] : sequences_) {
    if (s->id != id) return broken("sequence stored under id ", id, " has id ", s->id);
    PAGEDKV_RETURN_IF_ERROR(
        check_sequence(*s, options_.block_size, options_.max_model_len, device_pool_));
  }
  const auto running = std::count_if(sequences_.begin(), sequences_.end(), [](const auto& entry) {
    return entry.second->state == SequenceState::kRunning;
  });
  if (running != num_running_) {
    return broken("num_running ", num_running_, " but ", running, " sequences running");
  }
  PAGEDKV_RETURN_IF_ERROR(check_pool_balance(device_pool_, /*host=*/false));
  PAGEDKV_RETURN_IF_ERROR(check_pool_balance(host_pool_, /*host=*/true));
  PAGEDKV_RETURN_IF_ERROR(ledger_->check_invariants(device_pool_));
  if (host_tier_ != nullptr)
    PAGEDKV_RETURN_IF_ERROR(host_tier_->check_invariants(host_pool_, *ledger_));
  return check_host_blocks();
}

// Host-tier blocks belong to no sequence: a swapped sequence's host blocks are its only
// copy of that K/V and never cached.
absl::Status KvCacheManager::check_host_blocks() const {
  if (!options_.enable_host_cache && host_pool_.stats().cached_blocks != 0) {
    return broken("host tier off but ", host_pool_.stats().cached_blocks, " host blocks cached");
  }
  for (const auto& [id, s] : sequences_) {
    for (const BlockId h : s->host_blocks) {
      if (host_pool_.is_cached(h).value()) {
        return broken("seq ", id, " holds host block ", h, ", which is in the host tier");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedkv
