// CacheMirror: the set of cached blocks as a router following the event stream sees it,
// kept by the publisher thread from the batches it publishes, so that a snapshot request
// can be answered without asking the scheduler thread.
//
//   apply(batch)  BlockStored adds its blocks (block i's parent is block i - 1, the first
//                 one's is the event's parent), BlockRemoved drops them, AllBlocksCleared
//                 empties the mirror.
//   snapshot()    AllBlocksCleared, then one BlockStored per block, parents first: applied
//                 to any index, it leaves exactly the mirror's blocks.
#ifndef PAGEDKV_EVENTS_CACHE_MIRROR_H_
#define PAGEDKV_EVENTS_CACHE_MIRROR_H_

#include <cstdint>
#include <optional>
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

  int64_t size() const { return static_cast<int64_t>(blocks_.size()); }

 private:
  struct Block {
    std::optional<BlockHash> parent;
    int32_t block_size = 0;
    std::vector<TokenId> tokens;
    std::vector<uint64_t> extra_keys;
  };
  void store(const StagedEventView& event);

  absl::flat_hash_map<BlockHash, Block> blocks_;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_EVENTS_CACHE_MIRROR_H_
