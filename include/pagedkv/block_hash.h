// File: pagedkv/block_hash.h
//
// Chained hashing of full blocks for prefix caching. The hash of block i covers the hash
// of block i-1, the block's token ids and its extra keys (cache salt, adapter id,
// multimodal hashes), so equal hashes mean equal prefixes up to hash collisions. A hash hit
// is only a candidate: BlockPool verifies tokens, parent and extra keys before sharing.
#ifndef PAGEDKV_BLOCK_HASH_H_
#define PAGEDKV_BLOCK_HASH_H_

#include <cstdint>
#include <span>

#include "pagedkv/types.h"

namespace pagedkv {

// Hash function of one block. `parent` is null for the first block of a sequence.
// Injectable so that tests can force collisions; must be deterministic.
using BlockHashFn = BlockHash (*)(const BlockHash* parent, std::span<const TokenId> tokens,
                                  std::span<const uint64_t> extra_keys);

// XXH3-128 over (parent hash, extra keys, token ids). The default BlockHashFn.
BlockHash hash_block(const BlockHash* parent, std::span<const TokenId> tokens,
                     std::span<const uint64_t> extra_keys);

}  // namespace pagedkv

#endif  // PAGEDKV_BLOCK_HASH_H_
