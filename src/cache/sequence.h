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
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_SEQUENCE_H_
