// File: pagedkv/block_copy.h
//
// BlockCopy: one block copy the allocator plans and the engine runs (through KvStorage or
// its own kernels) before the step's K/V writes. A small value type in a header of its
// own, so storage and kernels can take copy ops without including the allocator.
#ifndef PAGEDKV_BLOCK_COPY_H_
#define PAGEDKV_BLOCK_COPY_H_

#include <cstdint>

#include "pagedkv/types.h"

namespace pagedkv {

// A copy of the first `num_tokens` token slots of block `src` into block `dst`, across
// all layers of layer group `group` (0 for a model of one group; see layer_group.h: each
// group has pools of its own, so src and dst are ids of that group's pools).
// Copy-on-write copies are device -> device; swap-out and demote copies are device ->
// host, swap-in and promote copies host -> device (whole blocks: num_tokens ==
// block_size).
struct BlockCopy {
  BlockId src = kNoBlock;
  BlockId dst = kNoBlock;
  int32_t num_tokens = 0;
  int32_t group = 0;
  bool operator==(const BlockCopy&) const = default;
};

}  // namespace pagedkv

#endif  // PAGEDKV_BLOCK_COPY_H_
