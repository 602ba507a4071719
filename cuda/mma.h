// Warp-level tensor-core and async-copy primitives of the attention kernel (sm_80+):
// cp.async with zero fill, ldmatrix, mma.sync m16n8k16 with fp32 accumulation, and the
// packed conversions that turn KV elements into MMA operands. No Abseil; device code only.
//
// Fragments of mma.m16n8k16 (PTX ISA "Matrix Fragments for mma.m16n8k16"), lane = 4 g + q:
//   A (16 x 16, row major): a[0] rows g, cols 2q..2q+1   a[1] rows g+8, cols 2q..2q+1
//                           a[2] rows g, cols 2q+8..+9   a[3] rows g+8, cols 2q+8..+9
//   B (16 x 8, "col"):      b[0] k rows 2q..2q+1, col g  b[1] k rows 2q+8..2q+9, col g
//   C (16 x 8, fp32):       c[0..1] row g, cols 2q..2q+1  c[2..3] row g+8, cols 2q..2q+1
// Each a/b register holds two 16-bit values, the lower k index in the low half.
#ifndef PAGEDKV_CUDA_MMA_H_
#define PAGEDKV_CUDA_MMA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace pagedkv::internal {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; with `valid` false the destination is zero
// filled and nothing is read (src-size 0), which is how masked tokens stay finite.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 16-bit matrices; lane l gives the row address of matrix l / 8, row l % 8 (a
// pointer, or a shared-memory address: base + a constant folds into the instruction).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  ldmatrix_x4(r, smem_address(row));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  ldmatrix_x4_trans(r, smem_address(row));
}

// c += a * b on 16x16 x 16x8 tiles; `kHalf` picks fp16 operands, otherwise bf16.
template <bool kHalf>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4],
                                          const uint32_t (&b)[2]) {
  if constexpr (kHalf) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// Two fp32 values as one packed operand register (lo in the low half), rounded to nearest.
template <bool kHalf>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kHalf) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// The MMA-type value nearest to x, as fp32 (the remainder x - round(x) is exact in fp32).
template <bool kHalf>
__device__ __forceinline__ float round_to_operand(float x) {
  if constexpr (kHalf) {
    return __half2float(__float2half_rn(x));
  } else {
    return __bfloat162float(__float2bfloat16_rn(x));
  }
}

// Two e4m3 bytes (lo in bits 0-7) as two fp16 values, exactly (e4m3 is a subset of fp16).
// sm_89+ converts both in one instruction; earlier GPUs move the sign, exponent and
// mantissa bits into fp16 position (a value 2^-8 of the real one, subnormals included)
// and rescale both halves with one packed multiply.
__device__ __forceinline__ __half2 fp8x2_to_half2(uint16_t bits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(bits));
  return *reinterpret_cast<const __half2*>(&r);
#else
  const uint32_t x = __byte_perm(static_cast<uint32_t>(bits), 0u, 0x1404);  // b0 << 8 | b1 << 24
  const uint32_t h = (x & 0x80008000u) | ((x >> 1) & 0x3f803f80u);
  const __half2 scale = __floats2half2_rn(256.0f, 256.0f);
  return __hmul2(*reinterpret_cast<const __half2*>(&h), scale);
#endif
}

// Two e4m3 bytes as one packed operand register of the MMA type.
template <bool kHalf>
__device__ __forceinline__ uint32_t fp8x2_to_operand(uint16_t bits) {
  const __half2 h = fp8x2_to_half2(bits);
  if constexpr (kHalf) {
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const float2 f = __half22float2(h);
    return pack2<false>(f.x, f.y);
  }
}

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CUDA_MMA_H_
