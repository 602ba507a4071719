// KvStorage: pools, sizing, and batched copy / swap ops on CPU and CUDA.
#include "pagedkv/kv_storage.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <new>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/check.h"
#include "common/status_macros.h"

#if PAGEDKV_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/launch.h"
#endif

namespace pagedkv {
namespace {

// CPU pools are aligned to 2 MiB and advised as transparent huge pages: the kernels walk
// the pool block by block in random order, and with 4 KiB pages every block costs a TLB
// miss (measured in bench/attention_cpu_bench.cc: paged fp32 decode at 4K context went
// from 1.26x to 1.05x the time over a contiguous cache).
constexpr std::align_val_t kHostAlignment{size_t{2} << 20};

char* allocate_host(int64_t bytes) {
  char* p = static_cast<char*>(
      ::operator new[](static_cast<size_t>(bytes), kHostAlignment, std::nothrow));
  if (p == nullptr) return nullptr;
#ifdef MADV_HUGEPAGE
  madvise(p, static_cast<size_t>(bytes), MADV_HUGEPAGE);  // advice only; failure is fine
#endif
  std::memset(p, 0, static_cast<size_t>(bytes));
  return p;
}

#if PAGEDKV_HAVE_CUDA
absl::Status cuda_status(const char* fn, cudaError_t err) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(fn, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}
#endif

// A CUDA storage needs a usable device, and its batched copies move 16-byte units: a
// copy unit (`unit`, `unit_bytes` of it) must be a multiple of 16 bytes. OK on CPU.
absl::Status check_cuda_storage(Device device, int64_t unit_bytes, absl::string_view unit) {
  if (device != Device::kCuda) return absl::OkStatus();
  if (!cuda_device_available()) {
    return absl::FailedPreconditionError(
        absl::StrCat("KvStorage: no usable CUDA device (", cuda_unavailable_reason(), ")"));
  }
  if (unit_bytes % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("KvStorage: CUDA copies move 16-byte units; ",
                                                   unit, " is not a multiple of 16"));
  }
  return absl::OkStatus();
}

}  // namespace

// --- construct -------------------------------------------------------------------------

absl::StatusOr<KvStorage> KvStorage::create(const KvCacheSpec& spec, int32_t num_blocks,
                                            const KvStorageOptions& options) {
  PAGEDKV_RETURN_IF_ERROR(spec.validate());
  if (num_blocks < 0 || options.num_host_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat("KvStorage: num_blocks ", num_blocks,
                                                   " and num_host_blocks ", options.num_host_blocks,
                                                   " must not be negative"));
  }
  if (options.layer_group < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvStorage: layer_group ", options.layer_group, " must be >= 0"));
  }
  const int64_t elem = bytes_per_element(spec.dtype);
  PAGEDKV_RETURN_IF_ERROR(
      check_cuda_storage(options.device, spec.head_dim * elem,
                         absl::StrCat("head_dim ", spec.head_dim, " x ", elem, " bytes")));
  KvStorage s;
  s.spec_ = spec;
  s.device_ = options.device;
  s.layout_ = options.layout;
  s.num_blocks_ = num_blocks;
  s.num_host_blocks_ = options.num_host_blocks;
  s.layer_group_ = options.layer_group;
  return allocate(std::move(s));
}

absl::StatusOr<KvStorage> KvStorage::create_state(const StateShape& shape, int32_t num_slots,
                                                  const KvStorageOptions& options) {
  // Elements bounded first, so that the byte products below cannot overflow.
  constexpr int64_t kMaxStateElements = int64_t{1} << 36;
  if (shape.num_layers <= 0 || shape.conv_elements < 0 || shape.recurrent_elements < 0 ||
      shape.conv_elements > kMaxStateElements || shape.recurrent_elements > kMaxStateElements ||
      shape.bytes_per_layer() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvStorage: a state shape of ", shape.num_layers, " layers x (", shape.conv_elements, " + ",
        shape.recurrent_elements, ") elements: need layers, state, and at most ", kMaxStateElements,
        " elements of each kind"));
  }
  if (num_slots < 0 || options.num_host_blocks < 0 || options.layer_group < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvStorage: num_slots ", num_slots, ", num_host_blocks ", options.num_host_blocks,
        " and layer_group ", options.layer_group, " must not be negative"));
  }
  constexpr int64_t kMaxPoolBytes = int64_t{1} << 52;
  const int64_t slots = std::max(num_slots, options.num_host_blocks);
  if (slots > kMaxPoolBytes / shape.bytes_per_layer()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvStorage: ", slots, " slots of ", shape.bytes_per_layer(),
                     " bytes per layer exceed ", kMaxPoolBytes, " bytes per pool"));
  }
  PAGEDKV_RETURN_IF_ERROR(
      check_cuda_storage(options.device, shape.bytes_per_layer(),
                         absl::StrCat("a layer's state of ", shape.bytes_per_layer(), " bytes")));
  KvStorage s;
  s.spec_.num_layers = shape.num_layers;
  s.state_ = shape;
  s.device_ = options.device;
  s.num_blocks_ = num_slots;
  s.num_host_blocks_ = options.num_host_blocks;
  s.layer_group_ = options.layer_group;
  return allocate(std::move(s));
}

int64_t KvStorage::block_bytes() const {
  if (holds_state()) return state_.bytes_per_layer();
  return int64_t{spec_.num_kv_heads} * spec_.block_size * spec_.head_dim *
         bytes_per_element(spec_.dtype);
}

// Allocates and zero-fills the pools of `s`, whose shape and counts are set.
absl::StatusOr<KvStorage> KvStorage::allocate(KvStorage s) {
  s.pool_bytes_ = s.block_bytes() * s.num_blocks_;
  s.host_pool_bytes_ = s.block_bytes() * s.num_host_blocks_;
  const int64_t main_bytes = s.bytes();
  const int64_t host_bytes = s.host_bytes();
  auto exhausted = [](const char* what, int64_t bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("KvStorage: cannot allocate ", bytes,
                                                     " bytes of ", what,
                                                     "; lower num_blocks or the budget"));
  };
  if (s.device_ == Device::kCpu) {
    if (main_bytes > 0) {
      s.data_ = allocate_host(main_bytes);
      if (s.data_ == nullptr) return exhausted("host memory", main_bytes);
    }
    if (host_bytes > 0) {
      s.host_data_ = allocate_host(host_bytes);
      if (s.host_data_ == nullptr) return exhausted("host pool memory", host_bytes);
      s.host_data_device_ = s.host_data_;
    }
    return s;
  }
#if PAGEDKV_HAVE_CUDA
  if (main_bytes > 0) {
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<size_t>(main_bytes)) != cudaSuccess) {
      cudaGetLastError();
      return exhausted("device memory", main_bytes);
    }
    s.data_ = static_cast<char*>(p);
    PAGEDKV_RETURN_IF_ERROR(
        cuda_status("KvStorage", cudaMemset(p, 0, static_cast<size_t>(main_bytes))));
  }
  if (host_bytes > 0) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, static_cast<size_t>(host_bytes),
                      cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      return exhausted("pinned host memory", host_bytes);
    }
    s.host_data_ = static_cast<char*>(p);
    std::memset(p, 0, static_cast<size_t>(host_bytes));
    void* mapped = nullptr;
    PAGEDKV_RETURN_IF_ERROR(cuda_status("KvStorage: cudaHostGetDevicePointer",
                                        cudaHostGetDevicePointer(&mapped, p, 0)));
    s.host_data_device_ = static_cast<char*>(mapped);
  }
  return s;
#else
  return absl::FailedPreconditionError("KvStorage: compiled without CUDA");
#endif
}

absl::StatusOr<KvStorage> KvStorage::create_for_budget(const KvCacheSpec& spec,
                                                       int64_t budget_bytes,
                                                       const KvStorageOptions& options) {
  absl::StatusOr<int32_t> blocks = spec.num_blocks_for_budget(budget_bytes);
  if (!blocks.ok()) return blocks.status();
  return create(spec, *blocks, options);
}

absl::StatusOr<int64_t> KvStorage::free_memory_budget(Device device, double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("free_memory_budget: fraction ", fraction, " outside (0, 1]"));
  }
  if (device == Device::kCpu) {
    const long pages = sysconf(_SC_AVPHYS_PAGES);
    const long page_size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page_size <= 0) {
      return absl::UnavailableError("free_memory_budget: sysconf cannot report free memory");
    }
    return static_cast<int64_t>(static_cast<double>(pages) * page_size * fraction);
  }
  if (!cuda_device_available()) {
    return absl::FailedPreconditionError(absl::StrCat("free_memory_budget: no usable CUDA device (",
                                                      cuda_unavailable_reason(), ")"));
  }
#if PAGEDKV_HAVE_CUDA
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  PAGEDKV_RETURN_IF_ERROR(
      cuda_status("free_memory_budget", cudaMemGetInfo(&free_bytes, &total_bytes)));
  return static_cast<int64_t>(static_cast<double>(free_bytes) * fraction);
#else
  return absl::FailedPreconditionError("free_memory_budget: compiled without CUDA");
#endif
}

KvStorage::KvStorage(KvStorage&& other) noexcept { *this = std::move(other); }

KvStorage& KvStorage::operator=(KvStorage&& other) noexcept {
  if (this != &other) {
    release();
    spec_ = other.spec_;
    state_ = other.state_;
    device_ = other.device_;
    layout_ = other.layout_;
    num_blocks_ = other.num_blocks_;
    num_host_blocks_ = other.num_host_blocks_;
    layer_group_ = other.layer_group_;
    pool_bytes_ = other.pool_bytes_;
    host_pool_bytes_ = other.host_pool_bytes_;
    data_ = std::exchange(other.data_, nullptr);
    host_data_ = std::exchange(other.host_data_, nullptr);
    host_data_device_ = std::exchange(other.host_data_device_, nullptr);
    ops_scratch_ = std::exchange(other.ops_scratch_, nullptr);
    ops_capacity_ = std::exchange(other.ops_capacity_, 0);
    group_ops_ = std::move(other.group_ops_);
  }
  return *this;
}

KvStorage::~KvStorage() { release(); }

void KvStorage::release() {
  if (device_ == Device::kCpu) {
    if (data_ != nullptr) ::operator delete[](data_, kHostAlignment);
    if (host_data_ != nullptr) ::operator delete[](host_data_, kHostAlignment);
  } else {
#if PAGEDKV_HAVE_CUDA
    // Frees synchronize with queued work that may still read these buffers.
    if (data_ != nullptr) cudaFree(data_);
    if (host_data_ != nullptr) cudaFreeHost(host_data_);
    if (ops_scratch_ != nullptr) cudaFree(ops_scratch_);
#endif
  }
  data_ = nullptr;
  host_data_ = nullptr;
  host_data_device_ = nullptr;
  ops_scratch_ = nullptr;
  ops_capacity_ = 0;
}

// --- views -----------------------------------------------------------------------------

// A layer's pools start at [layer][K, V] (or [layer][latent]) in the buffer.
KvCacheView KvStorage::view(int32_t layer) const {
  PAGEDKV_DCHECK(layer >= 0 && layer < spec_.num_layers && !holds_state());
  char* k = data_ == nullptr ? nullptr : data_ + pools_per_layer() * layer * pool_bytes_;
  char* v = k == nullptr || spec_.latent ? nullptr : k + pool_bytes_;
  return make_kv_cache_view(k, v, spec_.dtype, num_blocks_, spec_.num_kv_heads, spec_.block_size,
                            spec_.head_dim, layout_);
}

char* KvStorage::state(int32_t layer, int32_t slot) const {
  PAGEDKV_DCHECK(holds_state() && layer >= 0 && layer < spec_.num_layers && slot >= 0 &&
                 slot < num_blocks_);
  return data_ + layer * pool_bytes_ + slot * block_bytes();
}

KvCacheView KvStorage::host_view(int32_t layer) const {
  PAGEDKV_DCHECK(layer >= 0 && layer < spec_.num_layers && !holds_state());
  char* k =
      host_data_ == nullptr ? nullptr : host_data_ + pools_per_layer() * layer * host_pool_bytes_;
  char* v = k == nullptr || spec_.latent ? nullptr : k + host_pool_bytes_;
  return make_kv_cache_view(k, v, spec_.dtype, num_host_blocks_, spec_.num_kv_heads,
                            spec_.block_size, spec_.head_dim, layout_);
}

// --- copies ----------------------------------------------------------------------------

absl::Status KvStorage::copy_blocks(std::span<const BlockCopy> ops, void* stream) {
  return run_copies("copy_blocks", Target::kCopy, ops, stream);
}

std::span<const BlockCopy> KvStorage::own_group(std::span<const BlockCopy> ops) {
  const auto own = [this](const BlockCopy& op) { return op.group == layer_group_; };
  if (std::all_of(ops.begin(), ops.end(), own)) return ops;  // one group: no copy
  group_ops_.clear();
  std::copy_if(ops.begin(), ops.end(), std::back_inserter(group_ops_), own);
  return group_ops_;
}

absl::Status KvStorage::run_step_ops(const StepOps& ops, void* stream) {
  PAGEDKV_RETURN_IF_ERROR(swap_out(own_group(ops.swap_out), stream));
  PAGEDKV_RETURN_IF_ERROR(demote(own_group(ops.demote), stream));
  PAGEDKV_RETURN_IF_ERROR(exchange(own_group(ops.exchange), stream));
  PAGEDKV_RETURN_IF_ERROR(copy_blocks(own_group(ops.copy_on_write), stream));
  PAGEDKV_RETURN_IF_ERROR(copy_blocks(own_group(ops.copy_state), stream));
  PAGEDKV_RETURN_IF_ERROR(swap_in(own_group(ops.swap_in), stream));
  return promote(own_group(ops.promote), stream);
}

absl::Status KvStorage::swap_out(std::span<const BlockCopy> ops, void* stream) {
  return run_copies("swap_out", Target::kSwapOut, ops, stream);
}

absl::Status KvStorage::swap_in(std::span<const BlockCopy> ops, void* stream) {
  return run_copies("swap_in", Target::kSwapIn, ops, stream);
}

absl::Status KvStorage::demote(std::span<const BlockCopy> ops, void* stream) {
  return run_copies("demote", Target::kDemote, ops, stream);
}

absl::Status KvStorage::promote(std::span<const BlockCopy> ops, void* stream) {
  return run_copies("promote", Target::kPromote, ops, stream);
}

absl::Status KvStorage::exchange(std::span<const BlockCopy> ops, void* stream) {
  return run_copies("exchange", Target::kExchange, ops, stream);
}

absl::Status KvStorage::run_copies(const char* fn, Target target, std::span<const BlockCopy> ops,
                                   void* stream) {
  const bool src_host = target == Target::kSwapIn || target == Target::kPromote;
  const bool exchange = target == Target::kExchange;
  const bool dst_host = target == Target::kSwapOut || target == Target::kDemote || exchange;
  const bool whole_blocks = target == Target::kDemote || target == Target::kPromote || exchange;
  const int32_t src_blocks = src_host ? num_host_blocks_ : num_blocks_;
  const int32_t dst_blocks = dst_host ? num_host_blocks_ : num_blocks_;
  const char* src_name = src_host ? "host" : "device";
  const char* dst_name = dst_host ? "host" : "device";
  // Validate the whole batch before copying anything.
  absl::flat_hash_set<BlockId> dsts;
  absl::flat_hash_set<BlockId> srcs;  // exchange: its srcs are written too
  std::vector<int32_t> packed;        // [op][src, dst, num_tokens], ops with tokens to copy
  packed.reserve(ops.size() * 3);
  for (size_t i = 0; i < ops.size(); ++i) {
    const BlockCopy& op = ops[i];
    if (op.group != layer_group_) {
      return absl::InvalidArgumentError(
          absl::StrCat(fn, ": op ", i, ": layer group ", op.group, " is not this storage's (",
                       layer_group_, "): each group's copies run on its own storage"));
    }
    if (op.src < 0 || op.src >= src_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(fn, ": op ", i, ": src block ", op.src,
                                                     " outside [0, ", src_blocks, ") of the ",
                                                     src_name, " pool"));
    }
    if (op.dst < 0 || op.dst >= dst_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(fn, ": op ", i, ": dst block ", op.dst,
                                                     " outside [0, ", dst_blocks, ") of the ",
                                                     dst_name, " pool"));
    }
    if (op.num_tokens < 0 || (op.num_tokens > spec_.block_size && !holds_state())) {
      return absl::InvalidArgumentError(absl::StrCat(fn, ": op ", i, ": num_tokens ", op.num_tokens,
                                                     " outside [0, block_size ", spec_.block_size,
                                                     "]"));
    }
    if (whole_blocks && op.num_tokens != spec_.block_size && !holds_state()) {
      return absl::InvalidArgumentError(
          absl::StrCat(fn, ": op ", i, ": num_tokens ", op.num_tokens, " is not a whole block (",
                       spec_.block_size, "); only full cached blocks move between tiers"));
    }
    if (!dsts.insert(op.dst).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(fn, ": op ", i, ": dst block ", op.dst, " is written twice in one batch"));
    }
    if (exchange && !srcs.insert(op.src).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(fn, ": op ", i, ": src block ", op.src, " is written twice in one batch"));
    }
    if (op.num_tokens > 0) packed.insert(packed.end(), {op.src, op.dst, op.num_tokens});
  }
  if (target == Target::kCopy) {
    for (size_t i = 0; i < ops.size(); ++i) {
      if (dsts.contains(ops[i].src)) {
        return absl::InvalidArgumentError(absl::StrCat(fn, ": op ", i, ": src block ", ops[i].src,
                                                       " is also a dst in the same batch"));
      }
    }
  }
  const int32_t num_ops = static_cast<int32_t>(packed.size() / 3);
  if (num_ops == 0 || spec_.num_layers == 0) return absl::OkStatus();

  // A state slot is one unit: any num_tokens > 0 copies it whole.
  const int64_t elem = bytes_per_element(spec_.dtype);
  const int64_t block_bytes = this->block_bytes();
  const int32_t block_size = holds_state() ? 1 : spec_.block_size;
  const bool hnd = layout_ == KvLayout::kHND && !holds_state();
  const int32_t segments = hnd ? spec_.num_kv_heads : 1;
  const int64_t segment_bytes = hnd ? int64_t{spec_.block_size} * spec_.head_dim * elem : 0;
  const int64_t token_bytes = holds_state() ? block_bytes
                              : hnd         ? spec_.head_dim * elem
                                            : spec_.num_kv_heads * spec_.head_dim * elem;
  char* src = src_host ? host_data_device_ : data_;
  char* dst = dst_host ? host_data_device_ : data_;
  const int64_t src_pool = src_host ? host_pool_bytes_ : pool_bytes_;
  const int64_t dst_pool = dst_host ? host_pool_bytes_ : pool_bytes_;
  const auto pools = static_cast<int32_t>(num_pools());

  if (device_ == Device::kCpu) {
    for (int32_t i = 0; i < num_ops; ++i) {
      const int32_t s = packed[3 * i], d = packed[3 * i + 1], n = packed[3 * i + 2];
      for (int32_t pool = 0; pool < pools; ++pool) {
        const char* from = src + pool * src_pool + s * block_bytes;
        char* to = dst + pool * dst_pool + d * block_bytes;
        if (exchange) {
          std::swap_ranges(to, to + block_bytes, src + pool * src_pool + s * block_bytes);
          continue;
        }
        if (n >= block_size) {
          std::memcpy(to, from, static_cast<size_t>(block_bytes));
          continue;
        }
        for (int32_t seg = 0; seg < segments; ++seg) {
          std::memcpy(to + seg * segment_bytes, from + seg * segment_bytes,
                      static_cast<size_t>(n * token_bytes));
        }
      }
    }
    return absl::OkStatus();
  }
#if PAGEDKV_HAVE_CUDA
  const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  if (ops_capacity_ < static_cast<int64_t>(packed.size())) {
    if (ops_scratch_ != nullptr) cudaFree(ops_scratch_);
    ops_scratch_ = nullptr;
    ops_capacity_ = 0;
    const int64_t capacity = std::max<int64_t>(static_cast<int64_t>(packed.size()), 3 * 1024);
    void* p = nullptr;
    PAGEDKV_RETURN_IF_ERROR(cuda_status(fn, cudaMalloc(&p, sizeof(int32_t) * capacity)));
    ops_scratch_ = static_cast<int32_t*>(p);
    ops_capacity_ = capacity;
  }
  PAGEDKV_RETURN_IF_ERROR(
      cuda_status(fn, cudaMemcpyAsync(ops_scratch_, packed.data(), sizeof(int32_t) * packed.size(),
                                      cudaMemcpyHostToDevice, cuda_stream)));
  internal::CopyBlocksParams p;
  p.src = src;
  p.dst = dst;
  p.src_pool_bytes = src_pool;
  p.dst_pool_bytes = dst_pool;
  p.num_pools = pools;
  p.ops = ops_scratch_;
  p.num_ops = num_ops;
  p.block_size = block_size;
  p.block_bytes = block_bytes;
  p.segments = segments;
  p.segment_bytes = segment_bytes;
  p.token_bytes = token_bytes;
  p.exchange = exchange;
  return cuda_status(fn, internal::launch_copy_blocks(p, cuda_stream));
#else
  (void)stream;
  return absl::FailedPreconditionError(absl::StrCat(fn, ": compiled without CUDA"));
#endif
}

absl::Status KvStorage::read_block(BlockId block, std::span<std::byte> out) const {
  return copy_block_bytes("read_block", block, out.data(), std::ssize(out), /*to_pools=*/false);
}

absl::Status KvStorage::write_block(BlockId block, std::span<const std::byte> in) {
  // The pools are this storage's to write; the bytes are only read.
  return copy_block_bytes("write_block", block, const_cast<std::byte*>(in.data()), std::ssize(in),
                          /*to_pools=*/true);
}

absl::Status KvStorage::copy_block_bytes(const char* fn, BlockId block, std::byte* bytes,
                                         int64_t size, bool to_pools) const {
  if (block < 0 || block >= num_blocks_) {
    return absl::InvalidArgumentError(
        absl::StrCat(fn, ": block ", block, " outside [0, ", num_blocks_, ")"));
  }
  // A state slot is one pool per layer too: the loop below copies its layers in order.
  const int64_t pool_block = block_bytes();
  if (size != num_pools() * pool_block) {
    return absl::InvalidArgumentError(
        holds_state() ? absl::StrCat(fn, ": ", size, " bytes for a state slot of ",
                                     num_pools() * pool_block, " (state_shape().bytes())")
                      : absl::StrCat(fn, ": ", size, " bytes for a block of ",
                                     num_pools() * pool_block, " (bytes_per_block)"));
  }
  for (int64_t pool = 0; pool < num_pools(); ++pool) {
    char* in_pool = data_ + pool * pool_bytes_ + block * pool_block;
    char* in_bytes = reinterpret_cast<char*>(bytes) + pool * pool_block;
    char* dst = to_pools ? in_pool : in_bytes;
    const char* src = to_pools ? in_bytes : in_pool;
    if (device_ == Device::kCpu) {
      std::memcpy(dst, src, static_cast<size_t>(pool_block));
      continue;
    }
#if PAGEDKV_HAVE_CUDA
    // cudaMemcpy waits for the device's queued work, then copies.
    PAGEDKV_RETURN_IF_ERROR(
        cuda_status(fn, cudaMemcpy(dst, src, static_cast<size_t>(pool_block), cudaMemcpyDefault)));
#endif
  }
  return absl::OkStatus();
}

absl::Status KvStorage::synchronize() {
#if PAGEDKV_HAVE_CUDA
  if (device_ == Device::kCuda) return cuda_status("synchronize", cudaDeviceSynchronize());
#endif
  return absl::OkStatus();
}

}  // namespace pagedkv
