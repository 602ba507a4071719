#include "events/cache_mirror.h"

#include "absl/container/flat_hash_set.h"

namespace pagedkv::internal {

void CacheMirror::apply(const StagedBatch& batch) {
  batch.for_each([this](const StagedEventView& v) {
    switch (v.event.kind) {
      case EventKind::kStored:
        store(v);
        break;
      case EventKind::kRemoved:
        for (const BlockHash& h : v.hashes) blocks_.erase(h);
        break;
      case EventKind::kCleared:
        blocks_.clear();
        break;
    }
  });
}

void CacheMirror::store(const StagedEventView& v) {
  const auto bs = static_cast<size_t>(v.event.block_size);
  for (size_t i = 0; i < v.hashes.size(); ++i) {
    Block& block = blocks_[v.hashes[i]];
    if (i > 0) {
      block.parent = v.hashes[i - 1];
    } else if (v.event.has_parent) {
      block.parent = v.event.parent;
    } else {
      block.parent.reset();
    }
    block.block_size = v.event.block_size;
    const auto tokens = v.tokens.subspan(std::min(i * bs, v.tokens.size()));
    block.tokens.assign(tokens.begin(), tokens.begin() + std::min(bs, tokens.size()));
    block.extra_keys.assign(v.extra_keys.begin(), v.extra_keys.end());
  }
}

std::vector<StagedBatch> CacheMirror::snapshot(int32_t blocks_per_batch) const {
  std::vector<StagedBatch> batches(1);
  batches.back().add_cleared();
  int32_t in_batch = 0;
  auto emit = [&](const BlockHash& hash, const Block& block) {
    if (in_batch == blocks_per_batch) {
      batches.emplace_back();
      in_batch = 0;
    }
    batches.back().add_stored(block.parent ? &*block.parent : nullptr, {&hash, 1}, block.tokens,
                              block.block_size, block.extra_keys);
    ++in_batch;
  };
  // Parents before children: before a block, emit its not yet emitted ancestors, oldest
  // first. A parent that is not cached any more (evicted before its child) ends the walk.
  absl::flat_hash_set<BlockHash> emitted;
  emitted.reserve(blocks_.size());
  std::vector<const std::pair<const BlockHash, Block>*> chain;
  for (const auto& entry : blocks_) {
    chain.clear();
    for (const auto* e = &entry; e != nullptr && !emitted.contains(e->first);) {
      chain.push_back(e);
      emitted.insert(e->first);
      const auto parent = e->second.parent ? blocks_.find(*e->second.parent) : blocks_.end();
      e = parent == blocks_.end() ? nullptr : &*parent;
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) emit((*it)->first, (*it)->second);
  }
  return batches;
}

}  // namespace pagedkv::internal
