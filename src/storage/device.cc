// Run-time device detection: one binary serves machines with and without a GPU.
#include "pagedkv/device.h"

#include <string>

#if PAGEDKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace pagedkv {
namespace {

struct Probe {
  bool available = false;
  std::string reason;
};

Probe probe() {
  Probe result;
#if PAGEDKV_HAVE_CUDA
  int count = 0;
  // Without a driver this returns an error (not a zero count): any error means no device.
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    result.reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " +
                    cudaGetErrorString(err);
  } else if (count == 0) {
    result.reason = "cudaGetDeviceCount: 0 devices";
  } else {
    result.available = true;
  }
#else
  result.reason = "pagedkv was compiled without CUDA (nvcc not found at configure time)";
#endif
  return result;
}

const Probe& cached_probe() {
  static const Probe cached = probe();
  return cached;
}

}  // namespace

bool cuda_device_available() { return cached_probe().available; }

std::string cuda_unavailable_reason() { return cached_probe().reason; }

Device default_device() { return cuda_device_available() ? Device::kCuda : Device::kCpu; }

}  // namespace pagedkv
