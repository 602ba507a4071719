// File: pagedkv/device.h
//
// Where KV storage lives and kernels run, chosen at run time so that one binary works with
// and without a GPU. No Abseil or CUDA dependency.
//
// Example:
//   Device device = default_device();  // kCuda when a GPU is usable, else kCpu
//   if (device == Device::kCpu) std::puts(cuda_unavailable_reason().c_str());
#ifndef PAGEDKV_DEVICE_H_
#define PAGEDKV_DEVICE_H_

#include <string>

namespace pagedkv {

enum class Device {
  kCpu,   // host memory, CPU reference kernels
  kCuda,  // device memory of the current CUDA device, CUDA kernels
};

// "cpu" or "cuda".
constexpr const char* device_name(Device device) { return device == Device::kCpu ? "cpu" : "cuda"; }

// True when the library was compiled with CUDA and a CUDA device is usable. Any error of
// cudaGetDeviceCount (no driver, no device, driver too old) counts as "no device". The
// answer is computed once and cached.
bool cuda_device_available();

// Why no CUDA device is usable ("compiled without CUDA", "cudaGetDeviceCount: ..."), or
// an empty string when one is.
std::string cuda_unavailable_reason();

// kCuda when cuda_device_available(), else kCpu.
Device default_device();

}  // namespace pagedkv

#endif  // PAGEDKV_DEVICE_H_
