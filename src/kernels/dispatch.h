// Runtime dtype / head_dim values to compile-time types, shared by the CPU reference and
// the CUDA launchers so both accept exactly the same set. Each dispatcher returns false for
// an unsupported value, before any work starts. No Abseil (cuda/ includes it). Internal,
// kernel side (src/kernels: included by src/attention and cuda/ alike).
#ifndef PAGEDKV_KERNELS_DISPATCH_H_
#define PAGEDKV_KERNELS_DISPATCH_H_

#include <cstdint>
#include <type_traits>

#include "pagedkv/dtype.h"
#include "pagedkv/numeric.h"

namespace pagedkv::internal {

template <typename T>
struct TypeTag {
  using type = T;
};

// head_dim 64, 128, 256 -> std::integral_constant<int, HD>.
template <typename F>
bool dispatch_head_dim(int32_t head_dim, F&& f) {
  switch (head_dim) {
    case 64:
      f(std::integral_constant<int, 64>{});
      return true;
    case 128:
      f(std::integral_constant<int, 128>{});
      return true;
    case 256:
      f(std::integral_constant<int, 256>{});
      return true;
    default:
      return false;
  }
}

// fp32 / fp16 / bf16 -> TypeTag<float / Half / BFloat16>.
template <typename F>
bool dispatch_compute_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(TypeTag<float>{});
    case DType::kFloat16:
      return f(TypeTag<Half>{});
    case DType::kBFloat16:
      return f(TypeTag<BFloat16>{});
    default:
      return false;
  }
}

// Any cache dtype -> TypeTag.
template <typename F>
bool dispatch_cache_dtype(DType dtype, F&& f) {
  if (dtype == DType::kFloat8E4M3) return f(TypeTag<Fp8E4M3>{});
  return dispatch_compute_dtype(dtype, f);
}

// Attention dtypes: q dtype (fp32/fp16/bf16), KV in the q dtype or fp8 e4m3. Calls
// f(TypeTag<QT>, TypeTag<KVT>) and returns what it returns (true: served).
template <typename F>
bool dispatch_attention_dtypes(DType q_dtype, DType kv_dtype, F&& f) {
  return dispatch_compute_dtype(q_dtype, [&](auto q_tag) {
    using QT = typename decltype(q_tag)::type;
    if (kv_dtype == DTypeOf<QT>::value) return f(q_tag, TypeTag<QT>{});
    if (kv_dtype == DType::kFloat8E4M3) return f(q_tag, TypeTag<Fp8E4M3>{});
    return false;
  });
}

// Attention kernels: the dtypes above and head_dim 64/128/256. Calls
// f(TypeTag<QT>, TypeTag<KVT>, integral_constant<int, HD>).
template <typename F>
bool dispatch_attention(DType q_dtype, DType kv_dtype, int32_t head_dim, F&& f) {
  return dispatch_attention_dtypes(q_dtype, kv_dtype, [&](auto q_tag, auto kv_tag) {
    return dispatch_head_dim(head_dim, [&](auto hd) { f(q_tag, kv_tag, hd); });
  });
}

// write_kv: source fp32/fp16/bf16 into any cache dtype. Calls f(TypeTag<Src>, TypeTag<Dst>).
template <typename F>
bool dispatch_write_kv(DType src_dtype, DType cache_dtype, F&& f) {
  return dispatch_compute_dtype(src_dtype, [&](auto src_tag) {
    return dispatch_cache_dtype(cache_dtype, [&](auto dst_tag) {
      f(src_tag, dst_tag);
      return true;
    });
  });
}

}  // namespace pagedkv::internal

#endif  // PAGEDKV_KERNELS_DISPATCH_H_
