// CacheMirror: the set of cached blocks as a router following the event stream sees it,
// kept by the publisher thread from the batches it publishes, so that a snapshot request
// can be answered without asking the scheduler thread.
//
//   apply(batch)  BlockStored adds its blocks to its medium and layer group (block i's
//                 parent is block i - 1, the first one's is the event's parent),
//                 BlockRemoved drops them from its medium and group, AllBlocksCleared
//                 empties the mirror.
//   snapshot()    AllBlocksCleared, then one BlockStored per block, medium and group that
//                 holds it, parents first: applied to any index, it leaves exactly the
//                 mirror's blocks in each medium and group.
// A block is tracked per medium: the host tier's demotion is BlockRemoved on the device
// and BlockStored on the host (in either order), so the same hash can be held by both for
// a moment, or by the host alone. A block is tracked per layer group too: a hybrid model
// caches the same hash (the same tokens) in each group's pools, and each group evicts it on
// its own. Events without a group (a manager with one) are group 0's.
#ifndef PAGEDKV_EVENTS_CACHE_MIRROR_H_
#define PAGEDKV_EVENTS_CACHE_MIRROR_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "events/staged_batch.h"
#include "pagedkv/types.h"

namespace pagedkv::internal {

class CacheMirror {
 public:
  void apply(const StagedBatch& batch);

  // The snapshot in batches of at most `blocks_per_batch` (> 0) BlockStored events; the
  // first batch starts with AllBlocksCleared. Batches have seq and timestamp unset.
  std::vector<StagedBatch> snapshot(int32_t blocks_per_batch) const;

  // Blocks held, counted once per layer group and medium that holds them.
  int64_t size() const { return num_entries_; }

 private:
  // A block of one layer group.
  struct Key {
    BlockHash hash;
    int32_t group = 0;
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.hash, k.group);
    }
  };
  struct Block {
    bool in_medium[2] = {false, false};  // indexed by Medium
    std::optional<EventGroup> group;     // the label its events carry
    std::optional<BlockHash> parent;     // in the same group
    int32_t block_size = 0;
    std::vector<TokenId> tokens;
    std::vector<uint64_t> extra_keys;
  };
  void store(const StagedEventView& event);
  void remove(const StagedEventView& event);

  static Key key_of(const StagedEventView& event, const BlockHash& hash) {
    return {hash, event.event.has_group ? event.event.group.index : 0};
  }

  absl::flat_hash_map<Key, Block> blocks_;  // held by at least one medium
  int64_t num_entries_ = 0;                 // (block, group, medium) triples held
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_EVENTS_CACHE_MIRROR_H_
