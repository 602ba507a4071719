// File: pagedkv/types.h
//
// Glossary and the basic types every other header uses.
//
//   block        `block_size` token slots of KV cache, across all layers. "Block" always
//                means a KV block; a CUDA thread block is called a CTA.
//   BlockId      int32 index of a block in a pool, in [0, num_blocks). Kernels consume
//                int32 tables, so the id type is fixed.
//   block table  a sequence's ordered list of BlockIds; token t lives in
//                table[t / block_size] at offset t % block_size.
//   slot         one token position in the pool: block * block_size + offset (int64).
//   slot mapping the slots of a step's new tokens, in token order, for writing their K/V.
//   free-clean   a block with ref count 0 and no hash: holds nothing reusable.
//   free-cached  a block with ref count 0 that still holds a hashed full block; it can be
//                reused by a prefix hit until it is evicted (reallocated).
//   in use       a block with ref count > 0: held by at least one block table.
//
// This header has no Abseil or CUDA dependency so kernels and tools can include it.
#ifndef PAGEDKV_TYPES_H_
#define PAGEDKV_TYPES_H_

#include <cstdint>
#include <utility>

namespace pagedkv {

// Index of a block in a BlockPool.
using BlockId = int32_t;

// Marks "no block" (an empty parent, a missing prefix hit).
inline constexpr BlockId kNoBlock = -1;

// Caller-chosen identifier of a sequence (a request, or one sample of it).
using SeqId = int64_t;

// A token id as the tokenizer produced it.
using TokenId = int32_t;

// XXH3-128 hash of a full block chained with its parent. A distinct type so that raw
// integers are never passed as hashes by mistake.
struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const BlockHash&) const = default;

  template <typename H>
  friend H AbslHashValue(H state, const BlockHash& hash) {
    return H::combine(std::move(state), hash.lo, hash.hi);
  }
};

}  // namespace pagedkv

#endif  // PAGEDKV_TYPES_H_
