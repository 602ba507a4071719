// The cache's storage format as values (see kv_format.h).
#include "kv_format.h"

#include "pagedkv/numeric.h"

namespace decode_loop {
namespace {

// Same arithmetic as the kernels' write_kv: multiply by the reciprocal, round, and on
// read multiply the scale back.
float stored(pagedkv::DType dtype, const std::vector<float>& scales, int32_t layer, float x) {
  if (dtype != pagedkv::DType::kFloat8E4M3 || scales.empty()) return round_to(dtype, x);
  const float scale = scales[layer];
  return round_to(dtype, x * (1.0f / scale)) * scale;
}

}  // namespace

float round_to(pagedkv::DType dtype, float x) {
  switch (dtype) {
    case pagedkv::DType::kFloat16:
      return pagedkv::to_float(pagedkv::from_float<pagedkv::Half>(x));
    case pagedkv::DType::kBFloat16:
      return pagedkv::to_float(pagedkv::from_float<pagedkv::BFloat16>(x));
    case pagedkv::DType::kFloat8E4M3:
      return pagedkv::to_float(pagedkv::from_float<pagedkv::Fp8E4M3>(x));
    case pagedkv::DType::kFloat32:
      break;
  }
  return x;
}

pagedkv::DType KvFormat::attention_dtype() const {
  return cache_dtype == pagedkv::DType::kFloat8E4M3 ? pagedkv::DType::kBFloat16 : cache_dtype;
}

float KvFormat::stored_k(int32_t layer, float x) const {
  return stored(cache_dtype, k_scales, layer, x);
}

float KvFormat::stored_v(int32_t layer, float x) const {
  return stored(cache_dtype, v_scales, layer, x);
}

float KvFormat::attention_value(float x) const { return round_to(attention_dtype(), x); }

}  // namespace decode_loop
