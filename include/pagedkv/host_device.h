// File: pagedkv/host_device.h
//
// Macros that let one helper serve the CPU reference (g++) and the CUDA kernels (nvcc):
//   PAGEDKV_HOST_DEVICE  __host__ __device__ under nvcc, empty under a host compiler.
//   PAGEDKV_INLINE       __forceinline__ under nvcc, inline otherwise.
// No Abseil or CUDA dependency.
#ifndef PAGEDKV_HOST_DEVICE_H_
#define PAGEDKV_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define PAGEDKV_HOST_DEVICE __host__ __device__
#define PAGEDKV_INLINE __forceinline__
#else
#define PAGEDKV_HOST_DEVICE
#define PAGEDKV_INLINE inline
#endif

#endif  // PAGEDKV_HOST_DEVICE_H_
