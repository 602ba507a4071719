#include "events/staged_batch.h"

#include <type_traits>
#include <variant>

namespace pagedkv::internal {

void StagedBatch::add(const KvEvent& event) {
  std::visit(
      [this](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, BlockStored>) {
          add_stored(e.parent_hash ? &*e.parent_hash : nullptr, e.block_hashes, e.token_ids,
                     e.block_size, e.extra_keys, e.medium, e.group ? &*e.group : nullptr);
        } else if constexpr (std::is_same_v<T, BlockRemoved>) {
          add_removed(e.block_hashes, e.medium, e.group ? &*e.group : nullptr);
        } else {
          add_cleared();
        }
      },
      event);
}

void StagedBatch::add_stored(const BlockHash* parent, std::span<const BlockHash> block_hashes,
                             std::span<const TokenId> token_ids, int32_t block_size,
                             std::span<const uint64_t> keys, Medium medium,
                             const EventGroup* group) {
  StagedEvent stored;
  stored.kind = EventKind::kStored;
  stored.medium = medium;
  stored.has_parent = parent != nullptr;
  stored.block_size = block_size;
  stored.num_hashes = static_cast<uint32_t>(block_hashes.size());
  stored.num_tokens = static_cast<uint32_t>(token_ids.size());
  stored.num_extra_keys = static_cast<uint32_t>(keys.size());
  if (parent != nullptr) stored.parent = *parent;
  stored.has_group = group != nullptr;
  if (group != nullptr) stored.group = *group;
  events.push_back(stored);
  hashes.insert(hashes.end(), block_hashes.begin(), block_hashes.end());
  tokens.insert(tokens.end(), token_ids.begin(), token_ids.end());
  extra_keys.insert(extra_keys.end(), keys.begin(), keys.end());
}

void StagedBatch::add_removed(std::span<const BlockHash> block_hashes, Medium medium,
                              const EventGroup* group) {
  StagedEvent removed;
  removed.kind = EventKind::kRemoved;
  removed.medium = medium;
  removed.num_hashes = static_cast<uint32_t>(block_hashes.size());
  removed.has_group = group != nullptr;
  if (group != nullptr) removed.group = *group;
  events.push_back(removed);
  hashes.insert(hashes.end(), block_hashes.begin(), block_hashes.end());
}

void StagedBatch::add_cleared() { events.push_back(StagedEvent{}); }  // kind kCleared

void StagedBatch::clear() {
  events.clear();
  hashes.clear();
  tokens.clear();
  extra_keys.clear();
}

void StagedBatch::reserve_like(const StagedBatch& other) {
  events.reserve(other.events.size());
  hashes.reserve(other.hashes.size());
  tokens.reserve(other.tokens.size());
  extra_keys.reserve(other.extra_keys.size());
}

}  // namespace pagedkv::internal
