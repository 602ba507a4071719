// Internal: the step bookkeeping of KvCacheManager.
//
// A step is what happens between two take_step_ops() calls: the scheduler admits, grows,
// preempts and frees sequences, and the manager records the block copies the engine must
// run before the step's K/V writes. StepLedger owns everything that lives for one step:
//   - the pending copies, per list of StepOps;
//   - holds: per block, how many pending copies name it. A block released while held is
//     parked (deferred) until the engine has taken the ops, so that one batch of copies
//     never reuses a block it also copies;
//   - write marks: per device block, the step whose writes or copies fill it, and per
//     sequence, the step it was last scheduled in (Sequence::scheduled_step): while those
//     equal the current step, the K/V they name may not be written yet.
// take() ends the step exactly once: it hands over the ops, drops the holds, releases the
// deferred blocks and starts the next step.
#ifndef PAGEDKV_CACHE_STEP_LEDGER_H_
#define PAGEDKV_CACHE_STEP_LEDGER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "cache/sequence.h"
#include "pagedkv/block_copy.h"
#include "pagedkv/block_pool.h"
#include "pagedkv/step_ops.h"

namespace pagedkv::internal {

// The pool whose block one end of a pending copy holds, or none.
enum class Hold : uint8_t { kNone, kDevice, kHost };

// One list of StepOps and which of its copies' ends are held until the engine takes them:
// every host block, and the device blocks that a copy writes or reads after the step's
// first lists. Swap-out and demote sources are read first in a step, so they may be
// reused at once.
struct OpList {
  std::vector<BlockCopy> StepOps::*ops;
  Hold src;
  Hold dst;
};
inline constexpr OpList kSwapOut{&StepOps::swap_out, Hold::kNone, Hold::kHost};
inline constexpr OpList kDemote{&StepOps::demote, Hold::kNone, Hold::kHost};
inline constexpr OpList kExchange{&StepOps::exchange, Hold::kDevice, Hold::kHost};
inline constexpr OpList kCopyOnWrite{&StepOps::copy_on_write, Hold::kDevice, Hold::kDevice};
inline constexpr OpList kSwapIn{&StepOps::swap_in, Hold::kHost, Hold::kDevice};
inline constexpr OpList kPromote{&StepOps::promote, Hold::kHost, Hold::kDevice};
inline constexpr OpList kOpLists[] = {kSwapOut,     kDemote, kExchange,
                                      kCopyOnWrite, kSwapIn, kPromote};

class StepLedger {
 public:
  StepLedger(int32_t num_device_blocks, int32_t num_host_blocks);

  // Sequences scheduled in this step: they got slots or were swapped in, and the K/V of
  // their tokens past settled_tokens is not written yet.
  bool scheduled(const Sequence& seq) const { return seq.scheduled_step == step_; }
  // Marks `seq` scheduled; a second call in the same step keeps the first settled count.
  void mark_scheduled(Sequence& seq, int32_t settled_tokens) {
    if (seq.scheduled_step == step_) return;
    seq.scheduled_step = step_;
    seq.settled_tokens = settled_tokens;
  }
  // Forgets that `seq` was scheduled: it holds nothing this step still writes.
  static void unschedule(Sequence& seq) { seq.scheduled_step = 0; }

  // Device blocks that this step's K/V writes (mark_written()) or copies alone (swap-in,
  // promotion, exchange: mark_filled_by_copy()) fill; the last mark of a step wins. A
  // block filled by a copy alone holds the right K/V once the step's ops run, whatever
  // happens to the sequence that asked for it.
  void mark_written(BlockId device_block) { write_mark_[device_block] = step_ << 1; }
  void mark_filled_by_copy(BlockId device_block) { write_mark_[device_block] = step_ << 1 | 1; }
  bool written(BlockId device_block) const { return write_mark_[device_block] >> 1 == step_; }
  bool filled_by_copy(BlockId device_block) const {
    return write_mark_[device_block] == (step_ << 1 | 1);
  }

  // Records `op` in `list`, holding the blocks the list holds.
  void record(const OpList& list, BlockCopy op) {
    (pending_.*list.ops).push_back(op);
    hold(list.src, op.src, +1);
    hold(list.dst, op.dst, +1);
  }
  bool holds_device(BlockId block) const { return device_holds_[block] > 0; }
  bool holds_host(BlockId block) const { return host_holds_[block] > 0; }
  // Whether any pending copy holds a device block: when none does, a release never parks.
  bool holds_any_device() const { return num_device_holds_ > 0; }

  // Drops one reference to `block` of `pool` (the device pool when `side` is kDevice, the
  // host pool for kHost) as BlockPool::release_unchecked() does, except while a pending
  // copy holds the block: then a device block that this would free, and a host block at
  // any release (the tier holds one twice when a promotion reads what a demotion of the
  // same step writes), is parked with its reference until take().
  void release(BlockPool& pool, Hold side, BlockId block, BlockId& last_clean) {
    const bool park = side == Hold::kDevice
                          ? holds_device(block) && pool.ref_count_unchecked(block) == 1
                          : holds_host(block);
    if (park) [[unlikely]] {
      (side == Hold::kDevice ? deferred_device_ : deferred_host_).push_back(block);
    } else {
      pool.release_unchecked(block, last_clean);
    }
  }
  void release(BlockPool& pool, Hold side, BlockId block) {
    BlockId last_clean = kNoBlock;
    release(pool, side, block, last_clean);
  }

  // Blocks parked by release(): each entry still holds one reference.
  std::span<const BlockId> deferred_device() const { return deferred_device_; }
  std::span<const BlockId> deferred_host() const { return deferred_host_; }

  const StepOps& pending() const { return pending_; }

  // Ends the step: returns its ops in run order, drops their holds, frees the parked
  // blocks into `device` and `host`, and starts the next step.
  StepOps take(BlockPool& device, BlockPool& host);

  // The holds equal what the pending copies name, every parked block is still held, and
  // every block a pending copy writes on the device is in use.
  absl::Status check_invariants(const BlockPool& device) const;

 private:
  void hold(Hold side, BlockId block, int32_t delta) {
    if (side == Hold::kNone) return;
    if (side == Hold::kDevice) {
      device_holds_[block] += delta;
      num_device_holds_ += delta;
    } else {
      host_holds_[block] += delta;
    }
  }
  // Calls fn(side, block) for each held end of every pending copy.
  template <typename Fn>
  void for_each_hold(Fn fn) const {
    for (const OpList& list : kOpLists) {
      for (const BlockCopy& op : pending_.*list.ops) {
        if (list.src != Hold::kNone) fn(list.src, op.src);
        if (list.dst != Hold::kNone) fn(list.dst, op.dst);
      }
    }
  }

  StepOps pending_;
  // Counts steps: each take() ends one. Starts at 1 so that new sequences are settled.
  uint64_t step_ = 1;
  std::vector<uint64_t> write_mark_;  // per device block: step << 1 | filled by a copy alone
  std::vector<int32_t> device_holds_;
  int64_t num_device_holds_ = 0;  // sum of device_holds_
  std::vector<int32_t> host_holds_;
  std::vector<BlockId> deferred_device_;
  std::vector<BlockId> deferred_host_;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_STEP_LEDGER_H_
