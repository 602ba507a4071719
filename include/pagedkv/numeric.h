// File: pagedkv/numeric.h
//
// Storage types of the 16- and 8-bit element formats and their conversions to and from
// fp32, shared by the CPU reference and the CUDA kernels so both read and write the same
// bits. No Abseil dependency; under nvcc the device side uses the hardware conversions
// where they are exact (fp16 -> fp32, fp8 -> fp16), which give the same values.
//
//   Half      IEEE binary16 bits.
//   BFloat16  the top 16 bits of an fp32.
//   Fp8E4M3   OCP E4M3 "fn": bias 7, no infinities, 0x7f / 0xff are NaN, largest 448.
//
// Rounding: from_float<T>() rounds to nearest even. fp8 saturates finite values to
// +-448 (like __NV_SATFINITE); NaN stays NaN in every format.
#ifndef PAGEDKV_NUMERIC_H_
#define PAGEDKV_NUMERIC_H_

#include <cstdint>
#include <cstring>

#include "pagedkv/dtype.h"
#include "pagedkv/host_device.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace pagedkv {

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
struct Fp8E4M3 {
  uint8_t bits;
};

// DType of each storage type, for dispatch and checks.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::kFloat16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBFloat16;
};
template <>
struct DTypeOf<Fp8E4M3> {
  static constexpr DType value = DType::kFloat8E4M3;
};

namespace internal {

PAGEDKV_HOST_DEVICE PAGEDKV_INLINE float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

PAGEDKV_HOST_DEVICE PAGEDKV_INLINE uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

// Exact conversions to fp32.
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE float half_bits_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp_mant = static_cast<uint32_t>(h & 0x7fffu) << 13;
  if (exp_mant >= 0x0f800000u) {  // Inf or NaN: all-ones exponent.
    return bits_to_float(sign | 0x7f800000u | exp_mant);
  }
  // Rebias by multiplying with 2^112: exact for normal and subnormal halves.
  const float magnitude = bits_to_float(exp_mant) * 5.192296858534828e+33f;
  return bits_to_float(sign | float_to_bits(magnitude));
#endif
}

PAGEDKV_HOST_DEVICE PAGEDKV_INLINE float fp8_e4m3_bits_to_float(uint8_t b) {
#if defined(__CUDA_ARCH__)
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
#else
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t mant = b & 0x7u;
  if (exp == 0xfu && mant == 0x7u) return bits_to_float(sign | 0x7fc00000u);
  if (exp == 0) {  // subnormal: mant x 2^-9
    const float magnitude = static_cast<float>(mant) * 0.001953125f;
    return bits_to_float(sign | float_to_bits(magnitude));
  }
  return bits_to_float(sign | ((exp + 120u) << 23) | (mant << 20));
#endif
}

// Round-to-nearest-even conversions from fp32 (same bits on host and device).
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE uint16_t float_to_half_bits(float f) {
  const uint32_t x = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to Inf
  if (ax >= 0x38800000u) {  // normal half: rebias the exponent, round the low 13 bits
    const uint32_t rounded = ax - 0x38000000u + 0xfffu + ((ax >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  // Subnormal half: adding 0.5f puts the unit 2^-24 at the float's last mantissa bit, so
  // the addition itself rounds to nearest even.
  const float sum = bits_to_float(ax) + 0.5f;
  return static_cast<uint16_t>(sign | (float_to_bits(sum) - 0x3f000000u));
}

PAGEDKV_HOST_DEVICE PAGEDKV_INLINE uint16_t float_to_bfloat16_bits(float f) {
  const uint32_t x = float_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

PAGEDKV_HOST_DEVICE PAGEDKV_INLINE uint8_t float_to_fp8_e4m3_bits(float f) {
  const uint32_t x = float_to_bits(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);   // NaN
  if (ax >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448: saturate
  if (ax < 0x3c800000u) {  // below 2^-6: subnormal, unit 2^-9
    // Adding 2^23 / 2^9 = 16384 puts the unit 2^-9 at the float's last mantissa bit.
    const float sum = bits_to_float(ax) + 16384.0f;
    return static_cast<uint8_t>(sign | (float_to_bits(sum) - 0x46800000u));
  }
  const uint32_t rounded = (ax + 0x7ffffu + ((ax >> 20) & 1u)) & 0xfff00000u;
  const uint32_t exp = (rounded >> 23) - 120u;
  const uint32_t mant = (rounded >> 20) & 0x7u;
  if (exp > 15u || (exp == 15u && mant == 7u)) return static_cast<uint8_t>(sign | 0x7eu);
  return static_cast<uint8_t>(sign | (exp << 3) | mant);
}

}  // namespace internal

PAGEDKV_HOST_DEVICE PAGEDKV_INLINE float to_float(float x) { return x; }
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE float to_float(Half x) {
  return internal::half_bits_to_float(x.bits);
}
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE float to_float(BFloat16 x) {
  return internal::bits_to_float(static_cast<uint32_t>(x.bits) << 16);
}
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE float to_float(Fp8E4M3 x) {
  return internal::fp8_e4m3_bits_to_float(x.bits);
}

template <typename T>
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE T from_float(float x);
template <>
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE float from_float<float>(float x) {
  return x;
}
template <>
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE Half from_float<Half>(float x) {
  return Half{internal::float_to_half_bits(x)};
}
template <>
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE BFloat16 from_float<BFloat16>(float x) {
  return BFloat16{internal::float_to_bfloat16_bits(x)};
}
template <>
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE Fp8E4M3 from_float<Fp8E4M3>(float x) {
  return Fp8E4M3{internal::float_to_fp8_e4m3_bits(x)};
}

}  // namespace pagedkv

#endif  // PAGEDKV_NUMERIC_H_
