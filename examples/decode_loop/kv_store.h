// File: examples/decode_loop/kv_store.h
//
// The KV bytes and the kernels that read and write them, as the engine sees them: the
// paged K/V pools of every layer, the host pool (swapped blocks and the prefix cache's host
// tier), and per step
//   execute()    the step's copies in the order of pagedkv::StepOps: swap-out, demote and
//                exchange, then copy-on-write, then swap-in and promote
//   set_batch()  the batch's slot mapping and block tables (uploaded once per forward)
//   attend()     per layer: write_kv of the new tokens, then paged decode attention (one
//                query per sequence) or paged extend attention (prefill of the uncached
//                part: cached prefix + new tokens, causal among the new ones), with q and
//                out in the format's attention dtype and its fp8 scales
// The model's activations stay on the host; on CUDA they are staged to the device around
// each kernel call, and the KV cache itself never leaves the device except to swap.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_KV_STORE_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_KV_STORE_H_

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kv_format.h"
#include "model.h"
#include "pagedkv/block_table.h"
#include "pagedkv/device.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_cache_spec.h"

namespace decode_loop {

class KvStore {
 public:
  virtual ~KvStore() = default;

  // Pools of `num_blocks` device blocks and `num_host_blocks` host blocks of `spec`, whose
  // dtype is format.cache_dtype; for fp8, format has one K and one V scale per layer.
  static absl::StatusOr<std::unique_ptr<KvStore>> create(pagedkv::Device device,
                                                         const pagedkv::KvCacheSpec& spec,
                                                         const KvFormat& format, int32_t num_blocks,
                                                         int32_t num_host_blocks);

  // Runs the step's block copies in StepOps' order: swap_out, demote and exchange (they
  // read device blocks this step may refill), then copy_on_write, swap_in and promote
  // (they write device blocks). An exchange or promotion may read a host block this
  // step's demotion wrote.
  virtual absl::Status execute(const pagedkv::StepOps& ops) = 0;

  // The batch the next attend() calls see. `qo_indptr` empty: a decode batch (one new token
  // per sequence); else [num_seqs + 1] rows of each sequence's new tokens (prefill).
  virtual absl::Status set_batch(std::span<const int64_t> slots, const pagedkv::BlockTables& tables,
                                 std::span<const int32_t> qo_indptr, int32_t max_query_len) = 0;

  // Writes io.k / io.v into the batch's slots of `io.layer` and computes io.out.
  virtual absl::Status attend(const AttentionIo& io, int32_t num_q_heads) = 0;

  // Fault injection (Fault::kCorruptSwapIn): in device block `block`, flips the top
  // exponent bit of layer 0's largest K element of magnitude below 1 as stored, making it
  // 2^128 (fp32, bf16), 2^16 (fp16) or 2^8 (fp8) times larger, as a memory error would.
  // NotFound when the block holds no nonzero element below 1.
  virtual absl::Status flip_exponent_bit(int32_t block) = 0;

  virtual pagedkv::Device device() const = 0;
};

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_KV_STORE_H_
