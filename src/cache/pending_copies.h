// Internal: which blocks the manager's pending copies hold until the engine takes them.
// take_pending_copies() / take_pending_swaps() release the holds, check_invariants()
// recounts them; both go through these so that they agree on what each copy holds.
#ifndef PAGEDKV_CACHE_PENDING_COPIES_H_
#define PAGEDKV_CACHE_PENDING_COPIES_H_

#include <span>

#include "pagedkv/block_copy.h"
#include "pagedkv/kv_cache_manager.h"

namespace pagedkv::internal {

// Calls hold(on_device, block) for each block a copy-on-write copy names: both ends.
template <typename Fn>
void for_each_held_block(std::span<const BlockCopy> copies, Fn hold) {
  for (const BlockCopy& op : copies) {
    hold(true, op.src);
    hold(true, op.dst);
  }
}

// Calls hold(on_device, block) for each block a swap or host-tier copy names that must not
// be reused before the copies run: every host block, and the device blocks that swap-in,
// promote and exchange write. Swap-out and demote sources are read first in a step, so
// they may be reused at once.
template <typename Fn>
void for_each_held_block(const SwapOps& ops, Fn hold) {
  for (const BlockCopy& op : ops.swap_out) hold(false, op.dst);
  for (const BlockCopy& op : ops.demote) hold(false, op.dst);
  for (const auto* list : {&ops.swap_in, &ops.promote}) {
    for (const BlockCopy& op : *list) {
      hold(false, op.src);
      hold(true, op.dst);
    }
  }
  for (const BlockCopy& op : ops.exchange) {
    hold(true, op.src);
    hold(false, op.dst);
  }
}

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_PENDING_COPIES_H_
