#include "events/cache_mirror.h"

#include "absl/container/flat_hash_set.h"

namespace pagedkv::internal {
namespace {

constexpr Medium kMedia[] = {Medium::kDevice, Medium::kHost};

int index_of(Medium medium) { return static_cast<int>(medium); }

}  // namespace

void CacheMirror::apply(const StagedBatch& batch) {
  batch.for_each([this](const StagedEventView& v) {
    switch (v.event.kind) {
      case EventKind::kStored:
        store(v);
        break;
      case EventKind::kRemoved:
        remove(v);
        break;
      case EventKind::kCleared:
        blocks_.clear();
        num_entries_ = 0;
        break;
    }
  });
}

void CacheMirror::store(const StagedEventView& v) {
  const auto bs = static_cast<size_t>(v.event.block_size);
  for (size_t i = 0; i < v.hashes.size(); ++i) {
    Block& block = blocks_[key_of(v, v.hashes[i])];
    bool& held = block.in_medium[index_of(v.event.medium)];
    num_entries_ += held ? 0 : 1;
    held = true;
    block.group = v.event.has_group ? std::optional<EventGroup>(v.event.group) : std::nullopt;
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

void CacheMirror::remove(const StagedEventView& v) {
  for (const BlockHash& h : v.hashes) {
    const auto it = blocks_.find(key_of(v, h));
    if (it == blocks_.end()) continue;
    bool* in_medium = it->second.in_medium;
    bool& held = in_medium[index_of(v.event.medium)];
    num_entries_ -= held ? 1 : 0;
    held = false;
    if (!in_medium[0] && !in_medium[1]) blocks_.erase(it);
  }
}

std::vector<StagedBatch> CacheMirror::snapshot(int32_t blocks_per_batch) const {
  std::vector<StagedBatch> batches(1);
  batches.back().add_cleared();
  int32_t in_batch = 0;
  auto emit = [&](const Key& key, const Block& block) {
    for (const Medium medium : kMedia) {
      if (!block.in_medium[index_of(medium)]) continue;
      if (in_batch == blocks_per_batch) {
        batches.emplace_back();
        in_batch = 0;
      }
      batches.back().add_stored(block.parent ? &*block.parent : nullptr, {&key.hash, 1},
                                block.tokens, block.block_size, block.extra_keys, medium,
                                block.group ? &*block.group : nullptr);
      ++in_batch;
    }
  };
  // Parents before children: before a block, emit its not yet emitted ancestors (in its
  // group), oldest first. A parent that is not cached any more (evicted before its child,
  // or released behind a window) ends the walk.
  absl::flat_hash_set<Key> emitted;
  emitted.reserve(blocks_.size());
  std::vector<const std::pair<const Key, Block>*> chain;
  for (const auto& entry : blocks_) {
    chain.clear();
    for (const auto* e = &entry; e != nullptr && !emitted.contains(e->first);) {
      chain.push_back(e);
      emitted.insert(e->first);
      const auto parent =
          e->second.parent ? blocks_.find(Key{*e->second.parent, e->first.group}) : blocks_.end();
      e = parent == blocks_.end() ? nullptr : &*parent;
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) emit((*it)->first, (*it)->second);
  }
  return batches;
}

}  // namespace pagedkv::internal
