// File: pagedkv/step_ops.h
//
// StepOps: every block copy the allocator planned for one step, in the order the engine
// runs them (KvCacheManager::take_step_ops()). A value type of its own, so storage and
// kernels can take a step's copies without including the allocator.
//
// Run order: the lists that read device blocks the step may refill come first (swap_out,
// demote, exchange), then the ones that write device blocks (copy_on_write, swap_in,
// promote), all before the step's K/V writes. Copies within one list may run concurrently.
// A promotion may read a host block that a demotion or exchange of the same step wrote,
// never one it will write.
#ifndef PAGEDKV_STEP_OPS_H_
#define PAGEDKV_STEP_OPS_H_

#include <vector>

#include "pagedkv/block_copy.h"

namespace pagedkv {

struct StepOps {
  std::vector<BlockCopy> swap_out;  // device src -> host dst: a preempted sequence's K/V
  std::vector<BlockCopy> demote;    // device src -> host dst: an evicted cached block
  // device src <-> host dst: a host hit promoted into a device block whose evicted cached
  // contents are demoted into the host block it vacates (both copies at once).
  std::vector<BlockCopy> exchange;
  // device src -> device dst: a shared partially filled block about to be appended to.
  std::vector<BlockCopy> copy_on_write;
  std::vector<BlockCopy> swap_in;  // host src -> device dst: a swapped sequence resumes
  std::vector<BlockCopy> promote;  // host src -> device dst: a prefix hit in the host tier

  bool empty() const {
    return swap_out.empty() && demote.empty() && exchange.empty() && copy_on_write.empty() &&
           swap_in.empty() && promote.empty();
  }
};

}  // namespace pagedkv

#endif  // PAGEDKV_STEP_OPS_H_
