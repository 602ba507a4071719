// Internal: the step bookkeeping of KvCacheManager.
//
// A step is what happens between two take_step_ops() calls: the scheduler admits, grows,
// preempts and frees sequences, and the manager records the block copies the engine must
// run before the step's K/V writes. StepLedger owns everything that lives for one step:
//   - the pending copies, per list of StepOps, and the state saves;
//   - holds: per block of every layer group's pools, how many pending copies name it. A block
//   released while held is
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
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cache/sequence.h"
#include "pagedkv/block_copy.h"
#include "pagedkv/layer_group.h"
#include "pagedkv/step_ops.h"
#include "pool/block_pool_core.h"

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
inline constexpr OpList kCopyState{&StepOps::copy_state, Hold::kDevice, Hold::kDevice};
inline constexpr OpList kSwapIn{&StepOps::swap_in, Hold::kHost, Hold::kDevice};
inline constexpr OpList kPromote{&StepOps::promote, Hold::kHost, Hold::kDevice};
inline constexpr OpList kOpLists[] = {kSwapOut,   kDemote, kExchange, kCopyOnWrite,
                                      kCopyState, kSwapIn, kPromote};

class StepLedger {
 public:
  // One device and one host pool per layer group, of these sizes (none: no group yet).
  StepLedger() = default;
  explicit StepLedger(std::span<const LayerGroup> groups);

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

  // Device blocks of `group` that this step's K/V writes (mark_written()) or copies alone
  // (swap-in, promotion, exchange: mark_filled_by_copy()) fill; the last mark of a step
  // wins. A block filled by a copy alone holds the right K/V once the step's ops run,
  // whatever happens to the sequence that asked for it.
  void mark_written(int32_t group, BlockId block) {
    write_mark_[device(group, block)] = step_ << 1;
  }
  void mark_filled_by_copy(int32_t group, BlockId block) {
    write_mark_[device(group, block)] = step_ << 1 | 1;
  }
  bool written(int32_t group, BlockId block) const {
    return write_mark_[device(group, block)] >> 1 == step_;
  }
  bool filled_by_copy(int32_t group, BlockId block) const {
    return write_mark_[device(group, block)] == (step_ << 1 | 1);
  }

  // Records `op` (of op.group's pools) in `list`, holding the blocks the list holds.
  void record(const OpList& list, BlockCopy op) {
    (pending_.*list.ops).push_back(op);
    hold(list.src, op.group, op.src, +1);
    hold(list.dst, op.group, op.dst, +1);
  }
  // Records a state save; both slots stay held until take(): the computation reads the
  // sequence's slot and writes the checkpoint after the step's copies.
  void record(const StateSave& save) {
    pending_.save_state.push_back(save);
    hold(Hold::kDevice, save.group, save.src, +1);
    hold(Hold::kDevice, save.group, save.dst, +1);
  }
  bool holds_device(int32_t group, BlockId block) const {
    return device_holds_[device(group, block)] > 0;
  }
  bool holds_host(int32_t group, BlockId block) const {
    return host_holds_[host(group, block)] > 0;
  }
  // Whether any pending copy holds a device block: when none does, a release never parks.
  bool holds_any_device() const { return num_device_holds_ > 0; }

  // Drops one reference to `block` of `pool` (group `group`'s device pool when `side` is
  // kDevice, its host pool for kHost) as BlockPoolCore::release_unchecked() does, except while
  // a pending copy holds the block: then a device block that this would free, and a host
  // block at any release (the tier holds one twice when a promotion reads what a demotion
  // of the same step writes), is parked with its reference until take().
  void release(BlockPoolCore& pool, Hold side, int32_t group, BlockId block, BlockId& last_clean) {
    const bool park = side == Hold::kDevice
                          ? holds_device(group, block) && pool.ref_count_unchecked(block) == 1
                          : holds_host(group, block);
    if (park) [[unlikely]] {
      (side == Hold::kDevice ? deferred_device_ : deferred_host_).push_back({group, block});
    } else {
      pool.release_unchecked(block, last_clean);
    }
  }
  void release(BlockPoolCore& pool, Hold side, int32_t group, BlockId block) {
    BlockId last_clean = kNoBlock;
    release(pool, side, group, block, last_clean);
  }

  // A block parked by release(): it still holds one reference.
  struct Parked {
    int32_t group = 0;
    BlockId block = kNoBlock;
  };
  std::span<const Parked> deferred_device() const { return deferred_device_; }
  std::span<const Parked> deferred_host() const { return deferred_host_; }

  const StepOps& pending() const { return pending_; }

  // Ends the step: returns its ops in run order, drops their holds, frees the parked
  // blocks into their pools (pool_of(Hold::kDevice or kHost, group) -> BlockPoolCore&), and
  // starts the next step.
  template <typename PoolOf>
  StepOps take(PoolOf pool_of);

  // The holds equal what the pending copies name, every parked block is still held, and
  // every block a pending copy writes on the device is in use (device_pool(group) ->
  // const BlockPoolCore&).
  template <typename DevicePool>
  absl::Status check_invariants(DevicePool device_pool) const;

 private:
  // Index of a group's block in the per-block arrays, which hold every group's blocks.
  size_t device(int32_t group, BlockId block) const {
    return device_offset_[group] + static_cast<size_t>(block);
  }
  size_t host(int32_t group, BlockId block) const {
    return host_offset_[group] + static_cast<size_t>(block);
  }
  void hold(Hold side, int32_t group, BlockId block, int32_t delta) {
    if (side == Hold::kNone) return;
    if (side == Hold::kDevice) {
      device_holds_[device(group, block)] += delta;
      num_device_holds_ += delta;
    } else {
      host_holds_[host(group, block)] += delta;
    }
  }
  // Calls fn(side, group, block) for each held end of every pending copy and save.
  template <typename Fn>
  void for_each_hold(Fn fn) const {
    for (const OpList& list : kOpLists) {
      for (const BlockCopy& op : pending_.*list.ops) {
        if (list.src != Hold::kNone) fn(list.src, op.group, op.src);
        if (list.dst != Hold::kNone) fn(list.dst, op.group, op.dst);
      }
    }
    for (const StateSave& save : pending_.save_state) {
      fn(Hold::kDevice, save.group, save.src);
      fn(Hold::kDevice, save.group, save.dst);
    }
  }
  void drop_holds_and_advance();
  absl::Status check_holds() const;

  StepOps pending_;
  // Counts steps: each take() ends one. Starts at 1 so that new sequences are settled.
  uint64_t step_ = 1;
  std::vector<size_t> device_offset_;  // per group: its first entry in the device arrays
  std::vector<size_t> host_offset_;
  std::vector<uint64_t> write_mark_;  // per device block: step << 1 | filled by a copy alone
  std::vector<int32_t> device_holds_;
  int64_t num_device_holds_ = 0;  // sum of device_holds_
  std::vector<int32_t> host_holds_;
  std::vector<Parked> deferred_device_;
  std::vector<Parked> deferred_host_;
};

template <typename PoolOf>
StepOps StepLedger::take(PoolOf pool_of) {
  // Every hold is dropped, so every parked block goes; each as a free of its own: a clean
  // one goes to the head of the free queue.
  for (const Hold side : {Hold::kDevice, Hold::kHost}) {
    std::vector<Parked>& parked = side == Hold::kDevice ? deferred_device_ : deferred_host_;
    for (const Parked& p : parked) {
      BlockId last_clean = kNoBlock;
      pool_of(side, p.group).release_unchecked(p.block, last_clean);
    }
    parked.clear();
  }
  drop_holds_and_advance();
  return std::exchange(pending_, {});
}

template <typename DevicePool>
absl::Status StepLedger::check_invariants(DevicePool device_pool) const {
  if (absl::Status s = check_holds(); !s.ok()) return s;
  auto in_use = [&](int32_t group, BlockId dst) {
    if (device_pool(group).ref_count_unchecked(dst) > 0) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("StepLedger invariant: pending copy into group ", group,
                                            " device block ", dst, ", which is free"));
  };
  for (const OpList& list : kOpLists) {
    if (list.dst != Hold::kDevice) continue;
    for (const BlockCopy& op : pending_.*list.ops) {
      if (absl::Status s = in_use(op.group, op.dst); !s.ok()) return s;
    }
  }
  for (const StateSave& save : pending_.save_state) {
    if (absl::Status s = in_use(save.group, save.dst); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_STEP_LEDGER_H_
