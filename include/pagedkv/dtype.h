// File: pagedkv/dtype.h
//
// Element types of queries, outputs and the KV cache. No Abseil or CUDA dependency, so
// CUDA code includes it too.
#ifndef PAGEDKV_DTYPE_H_
#define PAGEDKV_DTYPE_H_

#include <cstdint>

namespace pagedkv {

enum class DType : uint8_t {
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat8E4M3,  // KV cache only, with per-tensor fp32 scales.
};

// Bytes of one element of `dtype`.
constexpr int32_t bytes_per_element(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat8E4M3:
      return 1;
  }
  return 0;
}

// Lower-case name ("fp32", "fp16", "bf16", "fp8_e4m3") for messages and reports.
constexpr const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat8E4M3:
      return "fp8_e4m3";
  }
  return "unknown";
}

}  // namespace pagedkv

#endif  // PAGEDKV_DTYPE_H_
