// CacheMirror: the set of cached blocks as a router following the event stream sees it,
// kept by the publisher thread from the batches it publishes, so that a snapshot request
// can be answered without asking the scheduler thread.
//
//   apply(batch)  BlockStored adds its blocks to its medium (block i's parent is block
//                 i - 1, the first one's is the event's parent), BlockRemoved drops them
//                 from its medium, AllBlocksCleared empties the mirror.
//   snapshot()    AllBlocksCleared, then one BlockStored per block and medium that holds
//                 it, parents first: applied to any index, it leaves exactly the mirror's
//                 blocks in each medium.
// A block is tracked per medium: the host tier's demotion is BlockRemoved on the device
// and BlockStored on the host (in either order), so the same hash can be held by both for
// a moment, or by the host alone.
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

  // Blocks held, counted once per medium that holds them.
  int64_t size() const { return num_entries_; }

 private:
  struct Block {
    bool in_medium[2] = {false, false};  // indexed by Medium
    std::optional<BlockHash> parent;
    int32_t block_size = 0;
    std::vector<TokenId> tokens;
    std::vector<uint64_t> extra_keys;
  };
  void store(const StagedEventView& event);
  void remove(const StagedEventView& event);

  absl::flat_hash_map<BlockHash, Block> blocks_;  // held by at least one medium
  int64_t num_entries_ = 0;                       // (block, medium) pairs held
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_EVENTS_CACHE_MIRROR_H_
