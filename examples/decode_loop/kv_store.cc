// KvStore on the library's storage and kernels (see kv_store.h).
#include "kv_store.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pagedkv/attention.h"
#include "pagedkv/numeric.h"

namespace decode_loop {
namespace {

using pagedkv::BlockCopy;
using pagedkv::KvCacheView;

// fp32 <-> 16-bit conversion of activations for attention in a 16-bit cache dtype.
void convert_from_float(const float* src, size_t n, pagedkv::DType dtype, void* dst) {
  auto* out = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) {
    out[i] = dtype == pagedkv::DType::kBFloat16
                 ? pagedkv::from_float<pagedkv::BFloat16>(src[i]).bits
                 : pagedkv::from_float<pagedkv::Half>(src[i]).bits;
  }
}

void convert_to_float(const void* src, size_t n, pagedkv::DType dtype, float* dst) {
  const auto* in = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) {
    dst[i] = dtype == pagedkv::DType::kBFloat16 ? pagedkv::to_float(pagedkv::BFloat16{in[i]})
                                                : pagedkv::to_float(pagedkv::Half{in[i]});
  }
}

// Host-memory pools (CPU backend).
class HostKvStore final : public KvStore {
 public:
  HostKvStore(const pagedkv::KvCacheSpec& spec, int32_t num_blocks, int32_t num_host_blocks)
      : spec_(spec), num_blocks_(num_blocks) {
    const int64_t elems = static_cast<int64_t>(num_blocks) * block_elems();
    const int64_t host_elems = static_cast<int64_t>(num_host_blocks) * block_elems();
    const int32_t esize = pagedkv::bytes_per_element(spec.dtype);
    for (int32_t l = 0; l < spec.num_layers; ++l) {
      k_.emplace_back(static_cast<size_t>(elems * esize));
      v_.emplace_back(static_cast<size_t>(elems * esize));
      host_k_.emplace_back(static_cast<size_t>(host_elems * esize));
      host_v_.emplace_back(static_cast<size_t>(host_elems * esize));
    }
  }

  absl::Status execute(const pagedkv::SwapOps& swaps, std::span<const BlockCopy> copies) override {
    for (const BlockCopy& op : swaps.swap_out) copy(op, /*from_host=*/false, /*to_host=*/true);
    for (const BlockCopy& op : copies) copy(op, false, false);
    for (const BlockCopy& op : swaps.swap_in) copy(op, true, false);
    return absl::OkStatus();
  }

  absl::Status set_batch(std::span<const int64_t> slots, const pagedkv::BlockTables& tables,
                         std::span<const int32_t> qo_indptr, int32_t max_query_len) override {
    slots_ = slots;
    tables_ = &tables;
    qo_indptr_ = qo_indptr;
    max_query_len_ = max_query_len;
    return absl::OkStatus();
  }

  absl::Status attend(const AttentionIo& io, int32_t num_q_heads) override {
    const KvCacheView view = pagedkv::make_kv_cache_view(
        k_[io.layer].data(), v_[io.layer].data(), spec_.dtype, num_blocks_, spec_.num_kv_heads,
        spec_.block_size, spec_.head_dim);
    absl::Status status = pagedkv::write_kv(pagedkv::Device::kCpu, view,
                                            {.k = io.k,
                                             .v = io.v,
                                             .src_dtype = pagedkv::DType::kFloat32,
                                             .slot_mapping = slots_.data(),
                                             .num_tokens = io.num_tokens});
    if (!status.ok()) return status;
    // The kernels take q in the cache's dtype: a 16-bit cache runs 16-bit attention.
    const size_t q_elems = static_cast<size_t>(io.num_tokens) * num_q_heads * spec_.head_dim;
    const void* q = io.q;
    void* out = io.out;
    if (spec_.dtype != pagedkv::DType::kFloat32) {
      q_buf_.resize(q_elems * 2);
      out_buf_.resize(q_elems * 2);
      convert_from_float(io.q, q_elems, spec_.dtype, q_buf_.data());
      q = q_buf_.data();
      out = out_buf_.data();
    }
    if (qo_indptr_.empty()) {
      status = pagedkv::paged_decode_attention(
          pagedkv::Device::kCpu, view, tables_->padded(),
          {.q = q, .out = out, .dtype = spec_.dtype, .num_q_heads = num_q_heads});
    } else {
      status = pagedkv::paged_extend_attention(pagedkv::Device::kCpu, view, tables_->padded(),
                                               {.q = q,
                                                .out = out,
                                                .dtype = spec_.dtype,
                                                .num_q_heads = num_q_heads,
                                                .qo_indptr = qo_indptr_.data(),
                                                .max_query_len = max_query_len_});
    }
    if (status.ok() && out != io.out)
      convert_to_float(out_buf_.data(), q_elems, spec_.dtype, io.out);
    return status;
  }

  pagedkv::Device device() const override { return pagedkv::Device::kCpu; }

 private:
  int64_t block_elems() const {
    return static_cast<int64_t>(spec_.num_kv_heads) * spec_.block_size * spec_.head_dim;
  }

  // Copies the first op.num_tokens tokens of every head of one block, K and V, all layers.
  void copy(const BlockCopy& op, bool from_host, bool to_host) {
    const int32_t esize = pagedkv::bytes_per_element(spec_.dtype);
    const size_t head_bytes = static_cast<size_t>(spec_.block_size) * spec_.head_dim * esize;
    const size_t token_bytes = static_cast<size_t>(spec_.head_dim) * esize;
    const size_t block_bytes = head_bytes * spec_.num_kv_heads;
    for (int32_t l = 0; l < spec_.num_layers; ++l) {
      for (auto [src_pool, dst_pool] :
           {std::pair{from_host ? &host_k_[l] : &k_[l], to_host ? &host_k_[l] : &k_[l]},
            std::pair{from_host ? &host_v_[l] : &v_[l], to_host ? &host_v_[l] : &v_[l]}}) {
        for (int32_t h = 0; h < spec_.num_kv_heads; ++h) {
          std::memcpy(dst_pool->data() + op.dst * block_bytes + h * head_bytes,
                      src_pool->data() + op.src * block_bytes + h * head_bytes,
                      op.num_tokens * token_bytes);
        }
      }
    }
  }

  pagedkv::KvCacheSpec spec_;
  int32_t num_blocks_;
  std::vector<std::vector<unsigned char>> k_, v_, host_k_, host_v_;
  std::span<const int64_t> slots_;
  const pagedkv::BlockTables* tables_ = nullptr;
  std::span<const int32_t> qo_indptr_;
  int32_t max_query_len_ = 0;
  std::vector<unsigned char> q_buf_, out_buf_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::create(pagedkv::Device device,
                                                         const pagedkv::KvCacheSpec& spec,
                                                         int32_t num_blocks,
                                                         int32_t num_host_blocks) {
  if (device != pagedkv::Device::kCpu) {
    return absl::UnimplementedError("KvStore: CUDA storage is not wired in yet");
  }
  return std::unique_ptr<KvStore>(new HostKvStore(spec, num_blocks, num_host_blocks));
}

}  // namespace decode_loop
