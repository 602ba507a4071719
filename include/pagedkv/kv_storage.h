// File: pagedkv/kv_storage.h
//
// KvStorage owns the KV bytes of a KvCacheSpec: for every layer a K pool and a V pool of
// `num_blocks` blocks (CUDA device memory when a device is used, host memory otherwise),
// plus an optional host pool of `num_host_blocks` blocks (pinned, device-mapped memory on
// CUDA) for swapped-out sequences and the prefix cache's host tier. It hands kernels one
// KvCacheView per layer and runs the allocator's copy-on-write, swap, demote and promote
// copies, each batch in one call (one asynchronous kernel launch on CUDA, across all
// layers; memcpy on CPU).
//
// One host pool, one host budget. Swapped sequences and the host tier share the
// `num_host_blocks` blocks; storage does not partition them. Host block ids come from the
// allocator, which treats the host pool as the device pool treats its own: blocks of a
// swapped sequence are in use (the only copy of that KV: never evicted), host-tier blocks
// are cached and evictable, least recently used first. So the policy is "swap first,
// cache takes the rest": a swap-out may evict host-tier blocks to find room, a demotion
// never displaces a swapped block (with no free or evictable host block the evicted
// device block is dropped, as without a host tier), and the cache uses all the host
// memory that swapping leaves. The same id can serve a swap and, later, the tier.
//
// Layout: each pool is [num_blocks][num_kv_heads][block_size][head_dim] (HND, default)
// or [num_blocks][block_size][num_kv_heads][head_dim] (NHD), see kv_cache_view.h. The
// host pool has the same layout. Buffers are zero-filled at creation. A latent (MLA) spec
// (KvCacheSpec::latent) has one pool per layer, the latents, in the K slot of its view: V
// is null, as paged_mla_decode() and write_kv() with a null v expect.
//
// Layer groups (layer_group.h): a hybrid model keeps one KvStorage per layer group, each
// with the group's spec (its layers' count and shape) and the group's pools
// (LayerGroup::num_blocks and num_host_blocks); KvStorageOptions::layer_group says which.
// Block ids of different groups name blocks of different pools, so a storage runs only
// the copies of its own group: run_step_ops() takes the whole step and runs those, and
// the single-list calls refuse a copy of another group.
//
// State groups (AttentionKind::kState): create_state() makes the storage of a group of
// state-space layers, whose "blocks" are state slots (kv_cache_config.h, StateShape): per
// layer one pool of slots, each slot the layer's convolution state then its recurrent
// state, packed (state()). The same batched copies move them: run_step_ops() runs the
// group's copy_state, swap_out and swap_in ops, and with the host tier its demote
// (checkpoints) and promote (checkpoints restored from the tier) ops; every op with
// num_tokens > 0 copies a whole slot (a slot holds a position's state, not tokens). The
// state saves (StepOps::save_state) are the engine's: it runs them mid-computation, as
// copies between state() pointers, when its scan reaches their position.
//
// Threading and streams: like a container, one owner; CUDA calls are queued on the stream
// given (default: the legacy default stream) and storage calls must use one stream, as
// the batched ops share a device scratch buffer.
//
// Example:
//   KvCacheSpec spec{.num_layers = 32, .num_kv_heads = 8, .head_dim = 128,
//                    .dtype = DType::kBFloat16, .block_size = 16};
//   absl::StatusOr<int64_t> budget = KvStorage::free_memory_budget(default_device(), 0.9);
//   absl::StatusOr<KvStorage> storage = KvStorage::create_for_budget(
//       spec, *budget, {.device = default_device(), .num_host_blocks = 1024});
//   KvCacheView layer0 = storage->view(0);            // for write_kv / attention
//   PAGEDKV_RETURN_IF_ERROR(storage->run_step_ops(manager.take_step_ops()));  // every step
//
// Order within a step (run_step_ops() keeps it; StepOps lists it): the copies that read
// device blocks about to be reused (swap_out, then demote, then exchange) before those that
// write device blocks (copy_blocks, then swap_in and promote), all before the step's K/V
// writes. An exchange or promotion may
// read a host block a demotion of the same step wrote (it runs after it); no host block
// is written after a copy of the same step read it: the allocator keeps a host block it
// promotes, exchanges or swaps in out of reuse until the next step.
#ifndef PAGEDKV_KV_STORAGE_H_
#define PAGEDKV_KV_STORAGE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/block_copy.h"
#include "pagedkv/device.h"
#include "pagedkv/kv_cache_config.h"
#include "pagedkv/kv_cache_spec.h"
#include "pagedkv/kv_cache_view.h"
#include "pagedkv/step_ops.h"

namespace pagedkv {

struct KvStorageOptions {
  Device device = default_device();  // where the main pools live and copies run
  KvLayout layout = KvLayout::kHND;
  // Blocks of the host pool, shared by swapped sequences and the host tier (0: neither).
  int32_t num_host_blocks = 0;
  // The layer group whose K/V the storage holds (>= 0): the BlockCopy::group of the copies
  // it runs. 0 for a model of one group.
  int32_t layer_group = 0;
};

class KvStorage {
 public:
  // Allocates the pools. Errors: InvalidArgument for an invalid spec, a negative block
  // count or layer group, or (CUDA) head_dim x element size not a multiple of 16 bytes;
  // FailedPrecondition for kCuda without a usable device; ResourceExhausted when the
  // memory cannot be allocated (the message names the bytes).
  [[nodiscard]] static absl::StatusOr<KvStorage> create(const KvCacheSpec& spec, int32_t num_blocks,
                                                        const KvStorageOptions& options = {});

  // A state group's storage: `num_slots` slots of `shape` (and options.num_host_blocks
  // host slots, for swapped sequences). Errors as create(): InvalidArgument for a shape
  // without layers or state, or (CUDA) shape.bytes_per_layer() not a multiple of 16.
  [[nodiscard]] static absl::StatusOr<KvStorage> create_state(const StateShape& shape,
                                                              int32_t num_slots,
                                                              const KvStorageOptions& options = {});

  // As create(), with as many blocks as `budget_bytes` holds (spec.num_blocks_for_budget).
  [[nodiscard]] static absl::StatusOr<KvStorage> create_for_budget(
      const KvCacheSpec& spec, int64_t budget_bytes, const KvStorageOptions& options = {});

  // `fraction` of the free memory of `device`: cudaMemGetInfo's free bytes on CUDA, the
  // available physical memory on CPU. InvalidArgument unless 0 < fraction <= 1.
  [[nodiscard]] static absl::StatusOr<int64_t> free_memory_budget(Device device, double fraction);

  KvStorage(KvStorage&& other) noexcept;
  KvStorage& operator=(KvStorage&& other) noexcept;
  KvStorage(const KvStorage&) = delete;
  KvStorage& operator=(const KvStorage&) = delete;
  ~KvStorage();

  // A KV storage's spec; of a state storage only num_layers is set.
  const KvCacheSpec& spec() const { return spec_; }
  bool holds_state() const { return state_.num_layers > 0; }
  const StateShape& state_shape() const { return state_; }
  Device device() const { return device_; }
  KvLayout layout() const { return layout_; }
  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_host_blocks() const { return num_host_blocks_; }
  int32_t layer_group() const { return layer_group_; }
  // Bytes of all layers' pools (main and host): K and V, or the latents of a latent spec;
  // num_blocks x spec().bytes_per_block() (and num_host_blocks x it).
  int64_t bytes() const { return num_pools() * pool_bytes_; }
  int64_t host_bytes() const { return num_pools() * host_pool_bytes_; }

  // Layer `layer`'s pools (0 <= layer < num_layers), on the storage device; v is null for
  // a latent spec. Views stay valid for the storage's life. Not for a state storage.
  KvCacheView view(int32_t layer) const;
  // A state storage's layer `layer` in slot `slot` (0 <= slot < num_blocks()), on the
  // storage device: state_shape().conv_elements of conv_dtype, then recurrent_elements of
  // recurrent_dtype. Valid for the storage's life.
  char* state(int32_t layer, int32_t slot) const;
  // Layer `layer`'s pools in the host pool (host pointers; num_blocks = host blocks).
  KvCacheView host_view(int32_t layer) const;

  // KvStorage::copy_blocks()
  //
  // Copy-on-write: for every op, copies the first num_tokens tokens (all layers, K and V)
  // of block src into block dst of the main pool; num_tokens == block_size copies the
  // whole block and 0 nothing. The ops run in one batch, so no dst may repeat or be the
  // src of another op. Errors: InvalidArgument naming the op, the value and the limit
  // (also for an op of another layer group than layer_group()); nothing is copied then.
  // Internal for a failed CUDA launch.
  [[nodiscard]] absl::Status copy_blocks(std::span<const BlockCopy> ops, void* stream = nullptr);

  // KvStorage::swap_out() / swap_in()
  //
  // swap_out copies main-pool block src to host-pool block dst, swap_in host src to main
  // dst, num_tokens tokens of each (block_size: the whole block), all layers, one batch.
  // Errors as copy_blocks() (dsts distinct; ids checked against each pool's size).
  [[nodiscard]] absl::Status swap_out(std::span<const BlockCopy> ops, void* stream = nullptr);
  [[nodiscard]] absl::Status swap_in(std::span<const BlockCopy> ops, void* stream = nullptr);

  // KvStorage::demote() / promote()
  //
  // The prefix cache's host tier: demote copies evicted cached device block src to host
  // block dst, promote copies host src back to device dst, all layers, one batch each.
  // Only full blocks are cached, so every op moves a whole block: num_tokens must equal
  // block_size. Errors as swap_out() / swap_in(), plus InvalidArgument for a num_tokens
  // other than block_size; nothing is copied then.
  [[nodiscard]] absl::Status demote(std::span<const BlockCopy> ops, void* stream = nullptr);
  [[nodiscard]] absl::Status promote(std::span<const BlockCopy> ops, void* stream = nullptr);

  // KvStorage::exchange()
  //
  // Swaps the contents of device block src and host block dst, all layers, one batch: a
  // host-tier hit promoted into a device block whose evicted contents are demoted into
  // the host block it vacates. Whole blocks only. Errors as demote(), plus InvalidArgument
  // for a src named twice in one batch; nothing is copied then.
  [[nodiscard]] absl::Status exchange(std::span<const BlockCopy> ops, void* stream = nullptr);

  // KvStorage::read_block() / write_block()
  //
  // Copies main-pool block `block` (every layer's K then V, or its latents, in layer
  // order: spec().bytes_per_block() bytes) to `out` / from `in`, synchronously after the
  // storage's queued work: a block's payload in the remote tier (remote_tier.h). Of a
  // state storage, slot `block`: its layers' states in layer order (state_shape().bytes()
  // bytes). Errors: InvalidArgument for a block outside [0, num_blocks()) or a span of
  // another size; nothing is copied then. Internal for a failed CUDA copy.
  [[nodiscard]] absl::Status read_block(BlockId block, std::span<std::byte> out) const;
  [[nodiscard]] absl::Status write_block(BlockId block, std::span<const std::byte> in);

  // KvStorage::run_step_ops()
  //
  // Runs every list of a step's ops in StepOps' order: swap_out, demote, exchange,
  // copy_on_write (copy_blocks()), copy_state, swap_in, promote; of each list, the copies of this
  // storage's layer group (the others are another group's storage's). Errors: the first
  // list's that fails; the lists before it have run (their copies are queued), the rest
  // have not.
  [[nodiscard]] absl::Status run_step_ops(const StepOps& ops, void* stream = nullptr);

  // Waits for the storage's queued CUDA work (a no-op on CPU).
  [[nodiscard]] absl::Status synchronize();

 private:
  // Which pools a batch reads and writes, and whether its ops must be whole blocks.
  enum class Target { kCopy, kSwapOut, kSwapIn, kDemote, kPromote, kExchange };
  KvStorage() = default;
  absl::Status run_copies(const char* fn, Target target, std::span<const BlockCopy> ops,
                          void* stream);
  // read_block() (to_pools false) and write_block(): one copy per pool.
  absl::Status copy_block_bytes(const char* fn, BlockId block, std::byte* bytes, int64_t size,
                                bool to_pools) const;
  // The ops of `ops` whose group is layer_group_: `ops` itself when all are (one group),
  // else a copy in group_ops_.
  std::span<const BlockCopy> own_group(std::span<const BlockCopy> ops);
  static absl::StatusOr<KvStorage> allocate(KvStorage s);
  // Pools per layer: 2 (K, V), or 1 for a latent spec or a state storage.
  int64_t pools_per_layer() const { return holds_state() ? 1 : spec_.vectors_per_token(); }
  // Bytes of one block (a state slot) in one pool.
  int64_t block_bytes() const;
  int64_t num_pools() const { return pools_per_layer() * spec_.num_layers; }
  void release();

  KvCacheSpec spec_;
  StateShape state_;  // a state storage's (num_layers > 0)
  Device device_ = Device::kCpu;
  KvLayout layout_ = KvLayout::kHND;
  int32_t num_blocks_ = 0;
  int32_t num_host_blocks_ = 0;
  int32_t layer_group_ = 0;
  int64_t pool_bytes_ = 0;            // one layer's K (or V) pool in the main buffer
  int64_t host_pool_bytes_ = 0;       // the same in the host buffer
  char* data_ = nullptr;              // [num_layers][K, V (not latent)][pool_bytes_]
  char* host_data_ = nullptr;         // [num_layers][K, V][host_pool_bytes_], host pointer
  char* host_data_device_ = nullptr;  // CUDA: host_data_ as the device sees it
  int32_t* ops_scratch_ = nullptr;    // CUDA: device copy of a batch's ops
  int64_t ops_capacity_ = 0;          // entries of ops_scratch_
  std::vector<BlockCopy> group_ops_;  // run_step_ops(): one list's ops of this group
};

}  // namespace pagedkv

#endif  // PAGEDKV_KV_STORAGE_H_
