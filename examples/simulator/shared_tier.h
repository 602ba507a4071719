// File: examples/simulator/shared_tier.h
//
// The cluster model's shared prefix store: the remote tier of docs/remote.md as the
// simulator models it, one store behind every engine's device (and host) tier. It holds
// block hashes only (the engines' payloads are not simulated), up to a capacity in blocks,
// and evicts the least recently used block when full, as a Redis with allkeys-lru would.
//   - Written through: a block is written when an engine computes it (BlockStored on the
//     device medium), as RemoteTier's default write policy (kWriteThrough,
//     docs/remote.md) writes every computed full block once, after the step that computed
//     it. The manager announces a block when it allocates it, before the step computes
//     it, so writes are staged and the engine publishes them at the end of its step; a
//     block is readable from that time on. A block the store holds is not written again
//     (the tier does not write a hash it has written or loaded).
//   - Read on a miss: an admission reads the blocks that follow its device and host hits
//     while the store holds them, in order (engine.h charges the transfer).
// Equal chained hashes name equal prefixes (same model, block size, no extra keys), so a
// hash is the key, as remote_block_key() makes it.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_SHARED_TIER_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_SHARED_TIER_H_

#include <cstdint>
#include <list>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "pagedkv/types.h"

namespace pagedkv::sim {

class SharedTier {
 public:
  // Holds at most `capacity_blocks` (> 0) blocks.
  explicit SharedTier(int64_t capacity_blocks);

  // Stages blocks an engine is computing, until publish().
  void stage(std::span<const BlockHash> hashes);

  // Writes the staged blocks it does not hold (those it holds keep their place), readable
  // from `time_s` (the end of the step that computed them). Evicts the least recently used
  // blocks beyond the capacity.
  void publish(double time_s);

  // The number of leading `hashes` the store holds readable at `time_s`; those become the
  // most recent.
  int32_t read_prefix(std::span<const BlockHash> hashes, double time_s);

  int64_t size() const { return static_cast<int64_t>(lru_.size()); }
  int64_t blocks_written() const { return blocks_written_; }
  int64_t blocks_evicted() const { return blocks_evicted_; }

 private:
  struct Entry {
    BlockHash hash;
    double readable_s = 0;  // written at the end of a step ending then
  };
  using Lru = std::list<Entry>;  // front: least recently used

  int64_t capacity_blocks_;
  Lru lru_;
  absl::flat_hash_map<BlockHash, Lru::iterator> index_;
  std::vector<BlockHash> staged_;
  int64_t blocks_written_ = 0;
  int64_t blocks_evicted_ = 0;
};

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_SHARED_TIER_H_
