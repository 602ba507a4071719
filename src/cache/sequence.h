// Internal: the state KvCacheManager keeps per sequence.
#ifndef PAGEDKV_CACHE_SEQUENCE_H_
#define PAGEDKV_CACHE_SEQUENCE_H_

#include <cstdint>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/types.h"

namespace pagedkv::internal {

struct Sequence {
  SeqId id = 0;
  SequenceState state = SequenceState::kWaiting;
  int32_t priority = 0;
  int64_t arrival = 0;
  std::vector<TokenId> tokens;       // prompt, then generated tokens
  int32_t num_computed = 0;          // tokens whose KV is (being) written
  std::vector<BlockId> blocks;       // device block table; may hold lookahead blocks
  std::vector<BlockId> host_blocks;  // while swapped: ceil(num_computed / block_size)
  absl::InlinedVector<uint64_t, 2> extra_keys;
  std::vector<BlockHash> block_hashes;  // chained hashes of full token blocks, lazily
  int32_t num_offered_blocks = 0;       // leading blocks already offered to the index
  // The step (KvCacheManager::step_) in which the sequence last got slots or was swapped
  // in, and its computed tokens before that step: while scheduled_step is the manager's
  // step, the K/V of tokens past settled_tokens is not written yet.
  uint64_t scheduled_step = 0;
  int32_t settled_tokens = 0;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_SEQUENCE_H_
