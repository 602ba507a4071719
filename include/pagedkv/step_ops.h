// File: pagedkv/step_ops.h
//
// StepOps: every block copy the allocator planned for one step, in the order the engine
// runs them (KvCacheManager::take_step_ops()). A value type of its own, so storage and
// kernels can take a step's copies without including the allocator.
//
// Run order: the lists that read device blocks the step may refill come first (swap_out,
// demote, exchange), then the ones that write device blocks (copy_on_write, copy_state,
// swap_in, promote), all before the step's K/V writes. Copies within one list may run
// concurrently. A promotion may read a host block that a demotion or exchange of the same
// step wrote, never one it will write. The state saves (save_state) run during the step's
// computation, each when its sequence's computation reaches its position.
#ifndef PAGEDKV_STEP_OPS_H_
#define PAGEDKV_STEP_OPS_H_

#include <cstdint>
#include <vector>

#include "pagedkv/block_copy.h"
#include "pagedkv/types.h"

namespace pagedkv {

// A checkpoint of a state group (layer_group.h, kState): when the engine's computation of
// sequence `seq` has processed exactly `position` tokens (a multiple of the block size),
// it copies the sequence's state slot `src` into the checkpoint slot `dst`, both of
// layer group `group`'s pool. E.g. at a chunked-prefill boundary, or inside a chunk by
// saving the scan's state there. A later prefix hit at `position` restores it
// (StepOps::copy_state).
struct StateSave {
  SeqId seq = 0;
  int32_t position = 0;
  BlockId src = kNoBlock;
  BlockId dst = kNoBlock;
  int32_t group = 0;
  bool operator==(const StateSave&) const = default;
};

struct StepOps {
  std::vector<BlockCopy> swap_out;  // device src -> host dst: a preempted sequence's K/V
  std::vector<BlockCopy> demote;    // device src -> host dst: an evicted cached block
  // device src <-> host dst: a host hit promoted into a device block whose evicted cached
  // contents are demoted into the host block it vacates (both copies at once).
  std::vector<BlockCopy> exchange;
  // device src -> device dst: a shared partially filled block about to be appended to.
  std::vector<BlockCopy> copy_on_write;
  // device src -> device dst of a state group, whole slots: a checkpoint restored into a
  // sequence's slot (a prefix hit), or a parent's slot into its fork's.
  std::vector<BlockCopy> copy_state;
  std::vector<BlockCopy> swap_in;     // host src -> device dst: a swapped sequence resumes
  std::vector<BlockCopy> promote;     // host src -> device dst: a prefix hit in the host tier
  std::vector<StateSave> save_state;  // during the computation, see StateSave

  bool empty() const {
    return swap_out.empty() && demote.empty() && exchange.empty() && copy_on_write.empty() &&
           copy_state.empty() && swap_in.empty() && promote.empty() && save_state.empty();
  }
};

}  // namespace pagedkv

#endif  // PAGEDKV_STEP_OPS_H_
