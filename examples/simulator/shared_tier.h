// File: examples/simulator/shared_tier.h
//
// The cluster model's shared prefix store: the remote tier of docs/remote.md as the
// simulator models it, one store behind every engine's device (and host) tier. It holds
// block hashes only (the engines' payloads are not simulated), up to a capacity in blocks,
// and evicts the least recently used block when full, as a Redis with allkeys-lru would.
//   - Written through: a block enters the store when an engine's device evicts it
//     (BlockRemoved on the device medium: demoted to the host tier, or dropped when there
//     is none). docs/remote.md's tier demotes from the host tier to the store; writing at
//     the device eviction puts the same blocks there, earlier, so another engine can read
//     them while the first still holds them on its host.
//   - Read on a miss: an admission reads the blocks that follow its device and host hits
//     while the store holds them, in order (engine.h charges the transfer).
// Equal chained hashes name equal prefixes (same model, block size, no extra keys), so a
// hash is the key, as remote_block_key() makes it.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_SHARED_TIER_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_SHARED_TIER_H_

#include <cstdint>
#include <list>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "pagedkv/types.h"

namespace pagedkv::sim {

class SharedTier {
 public:
  // Holds at most `capacity_blocks` (> 0) blocks.
  explicit SharedTier(int64_t capacity_blocks);

  // Writes blocks; one already held becomes the most recent. Evicts the least recently
  // used blocks beyond the capacity.
  void store(std::span<const BlockHash> hashes);

  // The number of leading `hashes` the store holds; those become the most recent.
  int32_t read_prefix(std::span<const BlockHash> hashes);

  int64_t size() const { return static_cast<int64_t>(lru_.size()); }
  int64_t blocks_written() const { return blocks_written_; }  // new blocks only
  int64_t blocks_evicted() const { return blocks_evicted_; }

 private:
  void touch(std::list<BlockHash>::iterator it) { lru_.splice(lru_.end(), lru_, it); }

  int64_t capacity_blocks_;
  std::list<BlockHash> lru_;  // front: least recently used
  absl::flat_hash_map<BlockHash, std::list<BlockHash>::iterator> index_;
  int64_t blocks_written_ = 0;
  int64_t blocks_evicted_ = 0;
};

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_SHARED_TIER_H_
