// KvStore on the library's KvStorage and attention kernels (see kv_store.h).
#include "kv_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pagedkv/attention.h"
#include "pagedkv/kv_storage.h"
#include "pagedkv/numeric.h"

#if PAGEDKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace decode_loop {
namespace {

using pagedkv::Device;
using pagedkv::DType;
using pagedkv::KvCacheView;

// fp32 <-> 16-bit conversion of activations for attention in a 16-bit cache dtype.
void convert_from_float(const float* src, size_t n, DType dtype, void* dst) {
  auto* out = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) {
    out[i] = dtype == DType::kBFloat16 ? pagedkv::from_float<pagedkv::BFloat16>(src[i]).bits
                                       : pagedkv::from_float<pagedkv::Half>(src[i]).bits;
  }
}

void convert_to_float(const void* src, size_t n, DType dtype, float* dst) {
  const auto* in = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) {
    dst[i] = dtype == DType::kBFloat16 ? pagedkv::to_float(pagedkv::BFloat16{in[i]})
                                       : pagedkv::to_float(pagedkv::Half{in[i]});
  }
}

// Copies `bytes` between host memory and the device's memory (either direction).
absl::Status copy_memory(Device device, void* dst, const void* src, size_t bytes) {
  if (device == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
#if PAGEDKV_HAVE_CUDA
  const cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("decode loop: cudaMemcpy of ", bytes, " bytes: ",
                                            cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("decode loop: built without CUDA");
#endif
}

// The exponent's most significant bit of one element of `dtype`.
uint32_t exponent_top_bit(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 1u << 30;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 1u << 14;
    case DType::kFloat8E4M3:
      return 1u << 6;
  }
  return 0;
}

// Element i of a buffer of `dtype` elements, as a float (unscaled).
float element(const unsigned char* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, data + i * 4, 4);
      return f;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t bits;
      std::memcpy(&bits, data + i * 2, 2);
      return dtype == DType::kBFloat16 ? pagedkv::to_float(pagedkv::BFloat16{bits})
                                       : pagedkv::to_float(pagedkv::Half{bits});
    }
    case DType::kFloat8E4M3:
      return pagedkv::to_float(pagedkv::Fp8E4M3{data[i]});
  }
  return 0.0f;
}

// A grow-only buffer on the store's device: host memory on CPU, cudaMalloc on CUDA. The
// engine's activations live on the host; kernels get them through these.
class Staging {
 public:
  explicit Staging(Device device) : device_(device) {}
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
#if PAGEDKV_HAVE_CUDA
    if (device_ == Device::kCuda && device_ptr_ != nullptr) cudaFree(device_ptr_);
#endif
  }

  // A buffer of at least `bytes` on the device.
  absl::StatusOr<void*> reserve(size_t bytes) {
    if (device_ == Device::kCpu) {
      host_.resize(std::max(host_.size(), bytes));
      return static_cast<void*>(host_.data());
    }
#if PAGEDKV_HAVE_CUDA
    if (bytes > capacity_) {
      if (device_ptr_ != nullptr) cudaFree(device_ptr_);
      device_ptr_ = nullptr;
      capacity_ = 0;
      const cudaError_t err = cudaMalloc(&device_ptr_, bytes);
      if (err != cudaSuccess) return cuda_error("cudaMalloc", err, bytes);
      capacity_ = bytes;
    }
    return device_ptr_;
#else
    return absl::FailedPreconditionError("decode loop: built without CUDA");
#endif
  }

  // Copies `bytes` from host `src` into the buffer and returns it.
  absl::StatusOr<void*> upload(const void* src, size_t bytes) {
    absl::StatusOr<void*> dst = reserve(bytes);
    if (!dst.ok() || bytes == 0) return dst;
    if (device_ == Device::kCpu) {
      std::memcpy(*dst, src, bytes);
      return dst;
    }
#if PAGEDKV_HAVE_CUDA
    const cudaError_t err = cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice);
    if (err != cudaSuccess) return cuda_error("cudaMemcpy to device", err, bytes);
#endif
    return dst;
  }

  // Copies `bytes` from the buffer to host `dst` (after the default stream's work).
  absl::Status download(void* dst, size_t bytes) {
    if (device_ == Device::kCpu) {
      std::memcpy(dst, host_.data(), bytes);
      return absl::OkStatus();
    }
#if PAGEDKV_HAVE_CUDA
    const cudaError_t err = cudaMemcpy(dst, device_ptr_, bytes, cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) return cuda_error("cudaMemcpy to host", err, bytes);
#endif
    return absl::OkStatus();
  }

 private:
#if PAGEDKV_HAVE_CUDA
  static absl::Status cuda_error(const char* what, cudaError_t err, size_t bytes) {
    return absl::InternalError(absl::StrCat("decode loop: ", what, " of ", bytes, " bytes: ",
                                            cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
  void* device_ptr_ = nullptr;
  size_t capacity_ = 0;
#endif
  Device device_;
  std::vector<unsigned char> host_;
};

class PagedKvStore final : public KvStore {
 public:
  PagedKvStore(pagedkv::KvStorage storage, DType attention_dtype)
      : storage_(std::move(storage)),
        attention_dtype_(attention_dtype),
        scales_(storage_.device()),
        slots_(storage_.device()),
        block_table_(storage_.device()),
        context_lens_(storage_.device()),
        qo_indptr_(storage_.device()),
        q_(storage_.device()),
        k_(storage_.device()),
        v_(storage_.device()),
        out_(storage_.device()) {}

  // fp8: the per-layer scales, on the device (the kernels read them by pointer).
  absl::Status set_scales(const KvFormat& format) {
    if (format.k_scales.empty()) return absl::OkStatus();
    std::vector<float> scales = format.k_scales;
    scales.insert(scales.end(), format.v_scales.begin(), format.v_scales.end());
    absl::StatusOr<void*> d_scales = scales_.upload(scales.data(), scales.size() * sizeof(float));
    if (!d_scales.ok()) return d_scales.status();
    d_scales_ = static_cast<const float*>(*d_scales);
    return absl::OkStatus();
  }

  absl::Status execute(const pagedkv::StepOps& ops) override { return storage_.run_step_ops(ops); }

  absl::Status set_batch(std::span<const int64_t> slots, const pagedkv::BlockTables& tables,
                         std::span<const int32_t> qo_indptr, int32_t max_query_len) override {
    num_slots_ = static_cast<int32_t>(slots.size());
    absl::StatusOr<void*> d_slots = slots_.upload(slots.data(), slots.size_bytes());
    if (!d_slots.ok()) return d_slots.status();
    absl::StatusOr<void*> d_table =
        block_table_.upload(tables.block_table.data(), tables.block_table.size() * sizeof(int32_t));
    if (!d_table.ok()) return d_table.status();
    absl::StatusOr<void*> d_lens = context_lens_.upload(
        tables.context_lens.data(), tables.context_lens.size() * sizeof(int32_t));
    if (!d_lens.ok()) return d_lens.status();
    d_slots_ = static_cast<const int64_t*>(*d_slots);
    table_ = {.block_table = static_cast<const int32_t*>(*d_table),
              .context_lens = static_cast<const int32_t*>(*d_lens),
              .num_seqs = tables.num_seqs,
              .max_blocks = tables.max_blocks,
              .block_size = tables.block_size};
    max_context_len_ = 0;
    for (int32_t i = 0; i < tables.num_seqs; ++i) {
      max_context_len_ = std::max(max_context_len_, tables.context_lens[i]);
    }
    d_qo_indptr_ = nullptr;
    max_query_len_ = max_query_len;
    if (!qo_indptr.empty()) {
      absl::StatusOr<void*> d_qo = qo_indptr_.upload(qo_indptr.data(), qo_indptr.size_bytes());
      if (!d_qo.ok()) return d_qo.status();
      d_qo_indptr_ = static_cast<const int32_t*>(*d_qo);
    }
    return absl::OkStatus();
  }

  absl::Status attend(const AttentionIo& io, int32_t num_q_heads) override {
    const pagedkv::KvCacheSpec& spec = storage_.spec();
    const Device device = storage_.device();
    const KvCacheView view = storage_.view(io.layer);
    const float* k_scale = d_scales_ == nullptr ? nullptr : d_scales_ + io.layer;
    const float* v_scale = d_scales_ == nullptr ? nullptr : d_scales_ + spec.num_layers + io.layer;
    if (io.num_tokens != num_slots_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attend: ", io.num_tokens, " tokens but the batch has ", num_slots_, " slots"));
    }
    const size_t kv_bytes =
        static_cast<size_t>(io.num_tokens) * spec.num_kv_heads * spec.head_dim * sizeof(float);
    absl::StatusOr<void*> k = k_.upload(io.k, kv_bytes);
    if (!k.ok()) return k.status();
    absl::StatusOr<void*> v = v_.upload(io.v, kv_bytes);
    if (!v.ok()) return v.status();
    absl::Status status = pagedkv::write_kv(device, view,
                                            {.k = *k,
                                             .v = *v,
                                             .src_dtype = DType::kFloat32,
                                             .slot_mapping = d_slots_,
                                             .num_tokens = io.num_tokens,
                                             .maybe_k_scale = k_scale,
                                             .maybe_v_scale = v_scale});
    if (!status.ok()) return status;

    // The kernels take q and out in the attention dtype: a 16-bit or fp8 cache runs
    // 16-bit attention.
    const size_t q_elems = static_cast<size_t>(io.num_tokens) * num_q_heads * spec.head_dim;
    const DType dtype = attention_dtype_;
    const size_t q_bytes = q_elems * static_cast<size_t>(pagedkv::bytes_per_element(dtype));
    const void* q_host = io.q;
    if (dtype != DType::kFloat32) {
      q_convert_.resize(q_bytes);
      convert_from_float(io.q, q_elems, dtype, q_convert_.data());
      q_host = q_convert_.data();
    }
    absl::StatusOr<void*> q = q_.upload(q_host, q_bytes);
    if (!q.ok()) return q.status();
    absl::StatusOr<void*> out = out_.reserve(q_bytes);
    if (!out.ok()) return out.status();
    if (d_qo_indptr_ == nullptr) {
      status = pagedkv::paged_decode_attention(device, view, table_,
                                               {.q = *q,
                                                .out = *out,
                                                .dtype = dtype,
                                                .num_q_heads = num_q_heads,
                                                .maybe_k_scale = k_scale,
                                                .maybe_v_scale = v_scale,
                                                .max_context_len = max_context_len_});
    } else {
      status = pagedkv::paged_extend_attention(device, view, table_,
                                               {.q = *q,
                                                .out = *out,
                                                .dtype = dtype,
                                                .num_q_heads = num_q_heads,
                                                .maybe_k_scale = k_scale,
                                                .maybe_v_scale = v_scale,
                                                .qo_indptr = d_qo_indptr_,
                                                .max_query_len = max_query_len_});
    }
    if (!status.ok()) return status;
    if (dtype == DType::kFloat32) return out_.download(io.out, q_bytes);
    q_convert_.resize(q_bytes);
    status = out_.download(q_convert_.data(), q_bytes);
    if (status.ok()) convert_to_float(q_convert_.data(), q_elems, dtype, io.out);
    return status;
  }

  absl::Status flip_exponent_bit(int32_t block) override {
    const pagedkv::KvCacheSpec& spec = storage_.spec();
    const KvCacheView view = storage_.view(0);
    const int64_t elem = pagedkv::bytes_per_element(spec.dtype);
    const int64_t count = int64_t{spec.num_kv_heads} * spec.block_size * spec.head_dim;
    unsigned char* data =
        static_cast<unsigned char*>(view.k) + pagedkv::elem_offset(view, block, 0, 0, 0) * elem;
    std::vector<unsigned char> bytes(static_cast<size_t>(count * elem));
    absl::Status status = copy_memory(storage_.device(), bytes.data(), data, bytes.size());
    if (!status.ok()) return status;
    int64_t target = -1;  // the largest magnitude below 1
    float target_abs = 0.0f;
    for (int64_t i = 0; i < count; ++i) {
      const float x = std::abs(element(bytes.data(), spec.dtype, i));
      if (x < 1.0f && x > target_abs) {
        target = i;
        target_abs = x;
      }
    }
    if (target < 0) {
      return absl::NotFoundError(absl::StrCat("flip_exponent_bit: block ", block,
                                              " has no K element of magnitude in (0, 1)"));
    }
    unsigned char* e = &bytes[target * elem];
    uint32_t bits = 0;
    std::memcpy(&bits, e, elem);  // little-endian: an element is the low bytes
    bits ^= exponent_top_bit(spec.dtype);
    std::memcpy(e, &bits, elem);
    return copy_memory(storage_.device(), data + target * elem, e, elem);
  }

  Device device() const override { return storage_.device(); }

 private:
  pagedkv::KvStorage storage_;
  DType attention_dtype_;
  Staging scales_;
  const float* d_scales_ = nullptr;
  Staging slots_, block_table_, context_lens_, qo_indptr_, q_, k_, v_, out_;
  std::vector<unsigned char> q_convert_;
  const int64_t* d_slots_ = nullptr;
  int32_t num_slots_ = 0;
  pagedkv::BlockTableView table_;
  const int32_t* d_qo_indptr_ = nullptr;
  int32_t max_context_len_ = 0;
  int32_t max_query_len_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::create(Device device,
                                                         const pagedkv::KvCacheSpec& spec,
                                                         const KvFormat& format, int32_t num_blocks,
                                                         int32_t num_host_blocks) {
  const bool fp8 = format.cache_dtype == DType::kFloat8E4M3;
  const auto num_layers = static_cast<size_t>(spec.num_layers);
  const size_t num_scales = fp8 ? num_layers : 0;
  if (spec.dtype != format.cache_dtype || format.k_scales.size() != num_scales ||
      format.v_scales.size() != num_scales) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvStore: cache dtype ", pagedkv::dtype_name(format.cache_dtype), " with ",
        format.k_scales.size(), " K and ", format.v_scales.size(), " V scales for spec dtype ",
        pagedkv::dtype_name(spec.dtype), " and ", spec.num_layers,
        " layers (fp8 needs one scale per layer, other dtypes none)"));
  }
  absl::StatusOr<pagedkv::KvStorage> storage = pagedkv::KvStorage::create(
      spec, num_blocks, {.device = device, .num_host_blocks = num_host_blocks});
  if (!storage.ok()) return storage.status();
  auto store = std::make_unique<PagedKvStore>(*std::move(storage), format.attention_dtype());
  if (absl::Status status = store->set_scales(format); !status.ok()) return status;
  return std::unique_ptr<KvStore>(std::move(store));
}

}  // namespace decode_loop
