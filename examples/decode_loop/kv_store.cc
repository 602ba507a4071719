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

// One group's batch on the device: its slots and block tables.
struct GroupBatch {
  explicit GroupBatch(Device device) : slots(device), block_table(device), context_lens(device) {}
  Staging slots, block_table, context_lens;
  const int64_t* d_slots = nullptr;
  int32_t num_slots = 0;
  pagedkv::BlockTableView table;
  int32_t max_context_len = 0;
  int64_t total_context_len = 0;
  // MLA prefill: one table row per new token (the host copy of what `table` points at).
  std::vector<int32_t> row_table, row_lens;
};

class PagedKvStore final : public KvStore {
 public:
  PagedKvStore(Device device, const Model& model, const CachePlan& plan,
               std::vector<pagedkv::KvStorage> storages, DType attention_dtype)
      : device_(device),
        model_(model),
        places_(plan.places),
        storages_(std::move(storages)),
        attention_dtype_(attention_dtype),
        scales_(device),
        qo_indptr_(device),
        q_(device),
        k_(device),
        v_(device),
        out_(device) {
    for (size_t g = 0; g < storages_.size(); ++g) {
      batches_.push_back(std::make_unique<GroupBatch>(device));
    }
  }

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

  absl::Status execute(const pagedkv::StepOps& ops) override {
    for (pagedkv::KvStorage& storage : storages_) {
      if (absl::Status s = storage.run_step_ops(ops); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status set_batch(std::span<const std::vector<int64_t>> slots,
                         std::span<const pagedkv::BlockTables> tables,
                         std::span<const int32_t> qo_indptr, int32_t max_query_len) override {
    if (slots.size() != storages_.size() || tables.size() != storages_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("set_batch: ", slots.size(), " slot lists and ", tables.size(),
                       " tables for ", storages_.size(), " layer groups"));
    }
    const bool mla_rows = model_.config().mla() && !qo_indptr.empty();
    for (size_t g = 0; g < storages_.size(); ++g) {
      if (storages_[g].holds_state()) continue;  // its slots come with set_state_batch()
      GroupBatch& b = *batches_[g];
      const pagedkv::BlockTables& t = tables[g];
      b.num_slots = static_cast<int32_t>(slots[g].size());
      absl::StatusOr<void*> d_slots = b.slots.upload(slots[g].data(), slots[g].size() * 8);
      if (!d_slots.ok()) return d_slots.status();
      b.d_slots = static_cast<const int64_t*>(*d_slots);
      std::span<const int32_t> table = t.block_table;
      std::span<const int32_t> lens = t.context_lens;
      int32_t num_rows = t.num_seqs;
      if (mla_rows) {
        // Row r of sequence i is its new token at position context_lens[i] - n_i + j:
        // the sequence's table, with the context ending at that token.
        b.row_table.clear();
        b.row_lens.clear();
        for (int32_t i = 0; i < t.num_seqs; ++i) {
          const int32_t n = qo_indptr[i + 1] - qo_indptr[i];
          for (int32_t j = 0; j < n; ++j) {
            const auto row = table.subspan(static_cast<size_t>(i) * t.max_blocks, t.max_blocks);
            b.row_table.insert(b.row_table.end(), row.begin(), row.end());
            b.row_lens.push_back(lens[i] - n + 1 + j);
          }
        }
        table = b.row_table;
        lens = b.row_lens;
        num_rows = static_cast<int32_t>(b.row_lens.size());
      }
      absl::StatusOr<void*> d_table = b.block_table.upload(table.data(), table.size_bytes());
      if (!d_table.ok()) return d_table.status();
      absl::StatusOr<void*> d_lens = b.context_lens.upload(lens.data(), lens.size_bytes());
      if (!d_lens.ok()) return d_lens.status();
      b.table = {.block_table = static_cast<const int32_t*>(*d_table),
                 .context_lens = static_cast<const int32_t*>(*d_lens),
                 .num_seqs = num_rows,
                 .max_blocks = t.max_blocks,
                 .block_size = t.block_size};
      b.max_context_len = 0;
      b.total_context_len = 0;
      for (const int32_t len : lens.first(num_rows)) {
        b.max_context_len = std::max(b.max_context_len, len);
        b.total_context_len += len;
      }
    }
    d_qo_indptr_ = nullptr;
    max_query_len_ = max_query_len;
    if (!qo_indptr.empty() && !mla_rows) {
      absl::StatusOr<void*> d_qo = qo_indptr_.upload(qo_indptr.data(), qo_indptr.size_bytes());
      if (!d_qo.ok()) return d_qo.status();
      d_qo_indptr_ = static_cast<const int32_t*>(*d_qo);
    }
    return absl::OkStatus();
  }

  absl::Status attend(const AttentionIo& io) override {
    const ModelConfig& c = model_.config();
    const LayerPlace place = places_[io.layer];
    const pagedkv::KvStorage& storage = storages_[place.group];
    const GroupBatch& batch = *batches_[place.group];
    const KvCacheView view = storage.view(place.index);
    const float* k_scale = d_scales_ == nullptr ? nullptr : d_scales_ + io.layer;
    const float* v_scale = d_scales_ == nullptr ? nullptr : d_scales_ + c.num_layers + io.layer;
    if (io.num_tokens != batch.num_slots) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attend: ", io.num_tokens, " tokens but the batch has ", batch.num_slots, " slots"));
    }
    const size_t kv_bytes = static_cast<size_t>(io.num_tokens) * c.kv_dim() * sizeof(float);
    absl::StatusOr<void*> k = k_.upload(io.k, kv_bytes);
    if (!k.ok()) return k.status();
    void* v = nullptr;  // MLA: the latents only
    if (io.v != nullptr) {
      absl::StatusOr<void*> d_v = v_.upload(io.v, kv_bytes);
      if (!d_v.ok()) return d_v.status();
      v = *d_v;
    }
    absl::Status status = pagedkv::write_kv(device_, view,
                                            {.k = *k,
                                             .v = v,
                                             .src_dtype = DType::kFloat32,
                                             .slot_mapping = batch.d_slots,
                                             .num_tokens = io.num_tokens,
                                             .maybe_k_scale = k_scale,
                                             .maybe_v_scale = v_scale});
    if (!status.ok()) return status;

    // The kernels take q and out in the attention dtype: a 16-bit or fp8 cache runs
    // 16-bit attention. MLA attends with the absorbed queries and returns latents.
    const float* q_host = io.q;
    int32_t q_dim = c.qk_head_dim();
    int32_t out_dim = c.value_head_dim();
    if (c.mla()) {
      q_abs_.resize(static_cast<size_t>(io.num_tokens) * c.num_q_heads * c.latent_dim());
      model_.mla_absorb_queries(io.layer, io.q, io.num_tokens, q_abs_.data());
      q_host = q_abs_.data();
      q_dim = c.latent_dim();
      out_dim = c.kv_lora_rank;
    }
    const DType dtype = attention_dtype_;
    const auto elem = static_cast<size_t>(pagedkv::bytes_per_element(dtype));
    const size_t rows = static_cast<size_t>(io.num_tokens) * c.num_q_heads;
    absl::StatusOr<void*> q = upload_converted(q_host, rows * q_dim, dtype);
    if (!q.ok()) return q.status();
    const size_t out_elems = rows * out_dim;
    absl::StatusOr<void*> out = out_.reserve(out_elems * elem);
    if (!out.ok()) return out.status();
    const LayerAttention attention = c.attention(io.layer);
    if (c.mla()) {
      status = pagedkv::paged_mla_decode(
          device_, view, batch.table,
          {.q = *q,
           .out = *out,
           .dtype = dtype,
           .num_heads = c.num_q_heads,
           .kv_lora_rank = c.kv_lora_rank,
           .qk_rope_head_dim = c.qk_rope_head_dim,
           .sm_scale = 1.0f / std::sqrt(static_cast<float>(c.qk_head_dim())),
           .maybe_kv_scale = k_scale,
           .max_context_len = batch.max_context_len,
           .total_context_len = batch.total_context_len});
    } else if (d_qo_indptr_ == nullptr) {
      status = pagedkv::paged_decode_attention(device_, view, batch.table,
                                               {.q = *q,
                                                .out = *out,
                                                .dtype = dtype,
                                                .num_q_heads = c.num_q_heads,
                                                .maybe_k_scale = k_scale,
                                                .maybe_v_scale = v_scale,
                                                .max_context_len = batch.max_context_len,
                                                .kind = attention.kind,
                                                .window = attention.window});
    } else {
      status = pagedkv::paged_extend_attention(device_, view, batch.table,
                                               {.q = *q,
                                                .out = *out,
                                                .dtype = dtype,
                                                .num_q_heads = c.num_q_heads,
                                                .maybe_k_scale = k_scale,
                                                .maybe_v_scale = v_scale,
                                                .qo_indptr = d_qo_indptr_,
                                                .max_query_len = max_query_len_,
                                                .kind = attention.kind,
                                                .window = attention.window});
    }
    if (!status.ok()) return status;
    float* out_host = io.out;
    if (c.mla()) {
      out_latent_.resize(out_elems);
      out_host = out_latent_.data();
    }
    status = download_converted(out_host, out_elems, dtype);
    if (!status.ok()) return status;
    if (c.mla()) model_.mla_apply_values(io.layer, out_latent_.data(), io.num_tokens, io.out);
    return absl::OkStatus();
  }

  absl::Status set_state_batch(StateBatch batch) override {
    const auto num_seqs = static_cast<int32_t>(batch.seqs.size());
    if (std::ssize(batch.row_indptr) != num_seqs + 1 || batch.slots.size() != storages_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "set_state_batch: ", num_seqs, " sequences, ", batch.row_indptr.size(), " row offsets, ",
          batch.slots.size(), " slot lists for ", storages_.size(), " groups"));
    }
    for (int32_t i = 0; i < num_seqs; ++i) {
      if (batch.row_indptr[i] < 0 || batch.row_indptr[i + 1] <= batch.row_indptr[i] ||
          batch.row_indptr[i + 1] > std::ssize(batch.positions)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "set_state_batch: sequence ", i, "'s rows [", batch.row_indptr[i], ", ",
            batch.row_indptr[i + 1], ") are empty or outside the ", batch.positions.size()));
      }
    }
    for (size_t g = 0; g < storages_.size(); ++g) {
      const int32_t expected = storages_[g].holds_state() ? num_seqs : 0;
      if (std::ssize(batch.slots[g]) != expected) {
        return absl::InvalidArgumentError(absl::StrCat("set_state_batch: group ", g, " has ",
                                                       batch.slots[g].size(), " slots for ",
                                                       num_seqs, " sequences"));
      }
      for (const int32_t slot : batch.slots[g]) {
        if (slot < 0 || slot >= storages_[g].num_blocks()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "set_state_batch: slot ", slot, " outside [0, ", storages_[g].num_blocks(), ")"));
        }
      }
    }
    for (const pagedkv::StateSave& save : batch.saves) {
      const auto it = std::find(batch.seqs.begin(), batch.seqs.end(), save.seq);
      const auto i = static_cast<int32_t>(it - batch.seqs.begin());
      const bool known = it != batch.seqs.end() && save.group >= 0 &&
                         save.group < std::ssize(storages_) && storages_[save.group].holds_state();
      const int32_t first = known ? batch.positions[batch.row_indptr[i]] : 0;
      const int32_t end = known ? batch.positions[batch.row_indptr[i + 1] - 1] + 1 : -1;
      if (!known || save.position < first || save.position > end ||
          save.src != batch.slots[save.group][i] || save.dst < 0 ||
          save.dst >= storages_[save.group].num_blocks()) {
        return absl::InvalidArgumentError(
            absl::StrCat("set_state_batch: the save of seq ", save.seq, " at position ",
                         save.position, " from slot ", save.src, " to ", save.dst, " in group ",
                         save.group, " is not one this batch reaches"));
      }
    }
    state_batch_ = std::move(batch);
    return absl::OkStatus();
  }

  absl::Status scan(const ScanIo& io) override {
    const ModelConfig& c = model_.config();
    const LayerPlace place = places_[io.layer];
    const pagedkv::KvStorage& storage = storages_[place.group];
    const StateBatch& b = state_batch_;
    if (!storage.holds_state() || io.num_tokens != std::ssize(b.positions)) {
      return absl::InvalidArgumentError(absl::StrCat("scan: layer ", io.layer, " with ",
                                                     io.num_tokens, " tokens; the batch has ",
                                                     b.positions.size()));
    }
    const int32_t ch = c.state_channels();
    const size_t bytes = static_cast<size_t>(storage.state_shape().bytes_per_layer());
    // Runs the saves of sequence i at `position`: the scan has processed that many tokens.
    const auto save_at = [&](pagedkv::SeqId seq, int32_t position) {
      for (const pagedkv::StateSave& save : b.saves) {
        if (save.seq != seq || save.position != position || save.group != place.group) continue;
        std::memcpy(storage.state(place.index, save.dst), storage.state(place.index, save.src),
                    bytes);
      }
    };
    const std::vector<int64_t>& row_slots = b.row_slots[place.group];
    for (size_t i = 0; i < b.seqs.size(); ++i) {
      auto* conv = reinterpret_cast<float*>(storage.state(place.index, b.slots[place.group][i]));
      const int32_t first_row = b.row_indptr[i];
      const int32_t end_row = b.row_indptr[i + 1];
      // A sequence computed from its first token starts from zero, whatever its slot held.
      if (b.positions[first_row] == 0) std::memset(conv, 0, bytes);
      for (int32_t r = first_row; r < end_row; ++r) {
        save_at(b.seqs[i], b.positions[r]);
        // A draft's state goes to its own slot, from the state before it: the sequence's
        // slot keeps the state after its last verified token.
        if (row_slots[r] >= 0) {
          auto* draft = reinterpret_cast<float*>(storage.state(place.index, row_slots[r]));
          std::memcpy(draft, conv, bytes);
          conv = draft;
        }
        const size_t row = static_cast<size_t>(r) * ch;
        model_.scan_token(io.layer, io.input + row, io.decay + row, conv,
                          conv + c.conv_state_elements(), io.out + row);
      }
      save_at(b.seqs[i], b.positions[end_row - 1] + 1);
    }
    return absl::OkStatus();
  }

  absl::Status flip_exponent_bit(int32_t group, int32_t block) override {
    const pagedkv::KvStorage& storage = storages_[group];
    const pagedkv::KvCacheSpec& spec = storage.spec();
    const KvCacheView view = storage.view(0);
    const int64_t elem = pagedkv::bytes_per_element(spec.dtype);
    const int64_t count = int64_t{spec.num_kv_heads} * spec.block_size * spec.head_dim;
    unsigned char* data =
        static_cast<unsigned char*>(view.k) + pagedkv::elem_offset(view, block, 0, 0, 0) * elem;
    std::vector<unsigned char> bytes(static_cast<size_t>(count * elem));
    absl::Status status = copy_memory(storage.device(), bytes.data(), data, bytes.size());
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
      return absl::NotFoundError(absl::StrCat("flip_exponent_bit: block ", block, " of group ",
                                              group, " has no K element of magnitude in (0, 1)"));
    }
    unsigned char* e = &bytes[target * elem];
    uint32_t bits = 0;
    std::memcpy(&bits, e, elem);  // little-endian: an element is the low bytes
    bits ^= exponent_top_bit(spec.dtype);
    std::memcpy(e, &bits, elem);
    return copy_memory(storage.device(), data + target * elem, e, elem);
  }

  Device device() const override { return device_; }
  pagedkv::KvStorage& storage(int32_t group) override { return storages_[group]; }

 private:
  // `n` fp32 values from the host, as the kernels' dtype on the device.
  absl::StatusOr<void*> upload_converted(const float* src, size_t n, DType dtype) {
    if (dtype == DType::kFloat32) return q_.upload(src, n * sizeof(float));
    convert_.resize(n * 2);
    convert_from_float(src, n, dtype, convert_.data());
    return q_.upload(convert_.data(), n * 2);
  }

  // The kernels' `n` outputs back to the host as fp32.
  absl::Status download_converted(float* dst, size_t n, DType dtype) {
    if (dtype == DType::kFloat32) return out_.download(dst, n * sizeof(float));
    convert_.resize(n * 2);
    absl::Status status = out_.download(convert_.data(), n * 2);
    if (status.ok()) convert_to_float(convert_.data(), n, dtype, dst);
    return status;
  }

  Device device_;
  const Model& model_;
  std::vector<LayerPlace> places_;
  std::vector<pagedkv::KvStorage> storages_;          // per group
  std::vector<std::unique_ptr<GroupBatch>> batches_;  // per group
  DType attention_dtype_;
  Staging scales_;
  const float* d_scales_ = nullptr;
  Staging qo_indptr_, q_, k_, v_, out_;
  std::vector<unsigned char> convert_;
  std::vector<float> q_abs_, out_latent_;  // MLA
  StateBatch state_batch_;
  const int32_t* d_qo_indptr_ = nullptr;
  int32_t max_query_len_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::create(Device device, const Model& model,
                                                         const CachePlan& plan,
                                                         const KvFormat& format) {
  const bool fp8 = format.cache_dtype == DType::kFloat8E4M3;
  const auto num_layers = static_cast<size_t>(model.config().num_layers);
  const size_t num_scales = fp8 ? num_layers : 0;
  if (plan.config.dtype != format.cache_dtype || format.k_scales.size() != num_scales ||
      format.v_scales.size() != num_scales) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvStore: cache dtype ", pagedkv::dtype_name(format.cache_dtype), " with ",
                     format.k_scales.size(), " K and ", format.v_scales.size(),
                     " V scales for plan dtype ", pagedkv::dtype_name(plan.config.dtype), " and ",
                     num_layers, " layers (fp8 needs one scale per layer, other dtypes none)"));
  }
  absl::StatusOr<pagedkv::KvCachePlan> kv_plan = plan.kv_plan();
  if (!kv_plan.ok()) return kv_plan.status();
  std::vector<pagedkv::KvStorage> storages;
  for (int32_t g = 0; g < plan.num_groups(); ++g) {
    if (plan.groups[g].kind == pagedkv::AttentionKind::kState && device != Device::kCpu) {
      return absl::FailedPreconditionError(
          "KvStore: the example's state-space scan runs on the host: use --device cpu");
    }
    absl::StatusOr<pagedkv::KvStorage> storage = kv_plan->create_storage(g, device);
    if (!storage.ok()) return storage.status();
    storages.push_back(*std::move(storage));
  }
  auto store = std::make_unique<PagedKvStore>(device, model, plan, std::move(storages),
                                              format.attention_dtype());
  if (absl::Status status = store->set_scales(format); !status.ok()) return status;
  return std::unique_ptr<KvStore>(std::move(store));
}

}  // namespace decode_loop
