// File: examples/decode_loop/kv_format.h
//
// How the paged cache holds K and V, which is what the dense reference must round to:
//   cache dtype       fp32, fp16, bf16, or fp8 e4m3
//   attention dtype   of q and out around the kernels: the cache dtype, or bf16 for an fp8
//                     cache (fp8 is a storage format; attention runs in the activation
//                     dtype, as in an engine serving a bf16 model with an fp8 KV cache)
//   fp8 scales        one per layer for K and one for V (per-tensor scales): the cache
//                     stores round(x / scale) and attention multiplies the scale back in
//
// fp8 scales come from calibrate_fp8() (dense_reference.h): a pass over a calibration
// prompt sets each scale so the largest |K| or |V| seen maps to half of e4m3's range.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_KV_FORMAT_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_KV_FORMAT_H_

#include <cstdint>
#include <vector>

#include "pagedkv/dtype.h"

namespace decode_loop {

struct KvFormat {
  pagedkv::DType cache_dtype = pagedkv::DType::kFloat32;
  std::vector<float> k_scales;  // [num_layers] for fp8, else empty (scale 1)
  std::vector<float> v_scales;

  pagedkv::DType attention_dtype() const;
  // The value the cache returns for K (or V) element x of `layer`, scale applied back.
  float stored_k(int32_t layer, float x) const;
  float stored_v(int32_t layer, float x) const;
  // x as a q or out element around the kernels (rounded to attention_dtype()).
  float attention_value(float x) const;
};

// x rounded to nearest even in `dtype` (fp8 saturates to +-448), back as a float.
float round_to(pagedkv::DType dtype, float x);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_KV_FORMAT_H_
