// File: examples/decode_loop/kv_store.h
//
// The KV bytes and the kernels that read and write them, as the engine sees them: one
// pagedkv::KvStorage per layer group of the cache plan (cache_plan.h; one for a model
// without groups), each with its group's layers, device pool and host pool (swapped
// blocks and the prefix cache's host tier), and per step
//   execute()    the step's copies in the order of pagedkv::StepOps: swap-out, demote and
//                exchange, then copy-on-write, then swap-in and promote; each group's
//                storage runs the copies of its group (BlockCopy::group)
//   set_batch()  the batch's slot mappings and block tables, one of each per group
//                (uploaded once per forward)
//   attend()     per layer, in its group's pools and tables: write_kv of the new tokens,
//                then paged decode attention (one query per sequence) or paged extend
//                attention (prefill of the uncached part: cached prefix + new tokens,
//                causal among the new ones), with the layer's kind and window, q and out
//                in the format's attention dtype and its fp8 scales. MLA: write_kv of the
//                latents (K only), queries absorbed (W_UK), paged_mla_decode over the
//                latents, W_UV applied to its output; a prefill runs as decode rows (there
//                is no MLA extend kernel): new token j of a sequence is a row of its own
//                whose context ends at j, all of them reading the sequence's one table.
//   scan()       per state layer (--model ssm), on the CPU: each sequence's new tokens in
//                order through Model::scan_token() in its state slot of the layer's
//                group (set_state_batch()), from a zeroed state at position 0, running the
//                step's state saves (pagedkv::StateSave) as the scan passes their
//                positions. The state slots are KvStorage::create_state() storages; their
//                restore, fork and swap copies run in execute() like the K/V's.
// The model's activations stay on the host; on CUDA they are staged to the device around
// each kernel call, and the KV cache itself never leaves the device except to swap.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_KV_STORE_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_KV_STORE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache_plan.h"
#include "kv_format.h"
#include "model.h"
#include "pagedkv/block_table.h"
#include "pagedkv/device.h"
#include "pagedkv/kv_storage.h"
#include "pagedkv/step_ops.h"

namespace decode_loop {

// What scan() needs of a batch beyond its tokens (see KvStore::set_state_batch()).
struct StateBatch {
  std::vector<pagedkv::SeqId> seqs;
  std::vector<int32_t> row_indptr;  // [num_seqs + 1]: sequence i's rows
  std::vector<int32_t> positions;   // per row
  // Per layer group: each sequence's state slot (KvCacheManager::write_state_slots());
  // empty for an attention group.
  std::vector<std::vector<int32_t>> slots;
  // Per layer group, per row: the slot that receives the state after the row's token, a
  // draft's (KvCacheManager::allocate_draft_slots()), or -1: the sequence's own slot,
  // updated in place.
  std::vector<std::vector<int64_t>> row_slots;
  std::vector<pagedkv::StateSave> saves;  // the step's saves of these sequences
};

class KvStore {
 public:
  virtual ~KvStore() = default;

  // One storage per group of `plan`, of its num_blocks device and num_host_blocks host
  // blocks, dtype format.cache_dtype; for fp8, format has one K and one V scale per model
  // layer; a state group's slots as its StateShape says. `model` must outlive the store
  // (MLA: its up-projections). FailedPrecondition for state layers on CUDA: the example's
  // scan runs on the host.
  static absl::StatusOr<std::unique_ptr<KvStore>> create(pagedkv::Device device, const Model& model,
                                                         const CachePlan& plan,
                                                         const KvFormat& format);

  // Runs the step's block copies in StepOps' order: swap_out, demote and exchange (they
  // read device blocks this step may refill), then copy_on_write, swap_in and promote
  // (they write device blocks). An exchange or promotion may read a host block this
  // step's demotion wrote.
  virtual absl::Status execute(const pagedkv::StepOps& ops) = 0;

  // The batch the next attend() calls see: per group, the new tokens' slots (in batch
  // order) and the sequences' block tables. `qo_indptr` empty: a decode batch (one new
  // token per sequence); else [num_seqs + 1] rows of each sequence's new tokens (prefill).
  virtual absl::Status set_batch(std::span<const std::vector<int64_t>> slots,
                                 std::span<const pagedkv::BlockTables> tables,
                                 std::span<const int32_t> qo_indptr, int32_t max_query_len) = 0;

  // Writes the new tokens' K/V (or latents) into the batch's slots of `io.layer` and
  // computes io.out.
  virtual absl::Status attend(const AttentionIo& io) = 0;

  // The batch the next scan() calls see. InvalidArgument for a save whose sequence is not
  // in the batch, whose position the batch does not reach, or whose source is not the
  // sequence's slot, or for a slot outside its group's pool.
  virtual absl::Status set_state_batch(StateBatch batch) = 0;

  // Runs state layer io.layer over the batch (see above) and writes io.out.
  virtual absl::Status scan(const ScanIo& io) = 0;

  // Fault injection (Fault::kCorruptSwapIn): in device block `block` of group `group`,
  // flips the top exponent bit of the group's first layer's largest K element of
  // magnitude below 1 as stored, making it 2^128 (fp32, bf16), 2^16 (fp16) or 2^8 (fp8)
  // times larger, as a memory error would. NotFound when the block holds no nonzero
  // element below 1.
  virtual absl::Status flip_exponent_bit(int32_t group, int32_t block) = 0;

  virtual pagedkv::Device device() const = 0;

  // Layer group `group`'s storage (the remote tier reads and writes its blocks).
  virtual pagedkv::KvStorage& storage(int32_t group) = 0;
};

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_KV_STORE_H_
