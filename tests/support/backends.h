// File: tests/support/backends.h
//
// Test cases written once and run on every backend of the kernels and the KV storage: the
// CPU reference always, CUDA where a device is usable.
//
//   BACKEND_TEST_CASE("write_kv scatters tokens into their slots", "[attention]") {
//     ...  // `device` is Device::kCpu or Device::kCuda
//   }
//
// registers two Catch2 test cases: "write_kv scatters tokens into their slots - CPU" with
// the tags given, and "... - CUDA" with [gpu] added (scripts/gpu-run.sh runs the [gpu] cases
// on a GPU machine). Two cases rather than one with a loop over the backends, so that each
// reports its own result: without a device the CUDA one reports itself skipped (skip.h)
// and never hides, or is hidden by, the CPU run.
//
// BackendMemory puts a case's arrays where the backend reads them (the host arrays
// themselves on the CPU, device copies on CUDA) and reads results back.
#ifndef PAGEDKV_TESTS_SUPPORT_BACKENDS_H_
#define PAGEDKV_TESTS_SUPPORT_BACKENDS_H_

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "pagedkv/device.h"
#include "support/skip.h"

#if PAGEDKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define PAGEDKV_TEST_CONCAT_(a, b) a##b
#define PAGEDKV_TEST_CONCAT(a, b) PAGEDKV_TEST_CONCAT_(a, b)
#define BACKEND_TEST_CASE(name, tags) \
  PAGEDKV_BACKEND_TEST_CASE_(PAGEDKV_TEST_CONCAT(backend_test_case_, __COUNTER__), name, tags)
#define PAGEDKV_BACKEND_TEST_CASE_(body, name, tags)                       \
  static void body(::pagedkv::Device device);                              \
  TEST_CASE(name " - CPU", tags) { body(::pagedkv::Device::kCpu); }        \
  TEST_CASE(name " - CUDA", tags "[gpu]") {                                \
    if (::pagedkv::testing::cuda_usable()) body(::pagedkv::Device::kCuda); \
  }                                                                        \
  static void body([[maybe_unused]] ::pagedkv::Device device)

namespace pagedkv::testing {

// True when a CUDA device is usable; otherwise reports the case skipped.
inline bool cuda_usable() {
  if (cuda_device_available()) return true;
  report_skip(std::string("no usable CUDA device (") + cuda_unavailable_reason() + ")");
  return false;
}

// Copies `bytes` bytes from host memory into memory of `device` (device memory on CUDA).
inline void copy_to_backend(Device device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (device == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if PAGEDKV_HAVE_CUDA
  REQUIRE(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault) == cudaSuccess);
#else
  FAIL("compiled without CUDA");
#endif
}

// Copies `bytes` bytes of memory of `device` into host memory, once the work queued on the
// device is done (and has not failed).
inline void copy_from_backend(Device device, void* dst, const void* src, size_t bytes) {
  if (device == Device::kCpu) {
    if (bytes == 0) return;
    std::memcpy(dst, src, bytes);
    return;
  }
#if PAGEDKV_HAVE_CUDA
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault) == cudaSuccess);
#else
  FAIL("compiled without CUDA");
#endif
}

// The arrays of one kernel call on its backend, freed with this object.
class BackendMemory {
 public:
  explicit BackendMemory(Device device) : device_(device) {}
  BackendMemory(const BackendMemory&) = delete;
  BackendMemory& operator=(const BackendMemory&) = delete;
  ~BackendMemory() {
#if PAGEDKV_HAVE_CUDA
    for (void* p : device_arrays_) cudaFree(p);
#endif
  }

  // `host` where the backend reads it: the array itself on the CPU, a device copy on CUDA.
  template <typename T>
  T* place(std::vector<T>& host) {
    return device_ == Device::kCpu ? host.data() : copy_in(host);
  }
  template <typename T>
  const T* place(const std::vector<T>& host) {
    return device_ == Device::kCpu ? host.data() : copy_in(host);
  }
  // A temporary is copied on both backends: its array would not outlive the call.
  template <typename T>
  const T* place(std::vector<T>&& host) {
    return copy_in(host);
  }
  // A new array of `n` elements equal to `fill` (outputs start with a value the kernel
  // must overwrite).
  template <typename T>
  T* filled(size_t n, T fill) {
    return copy_in(std::vector<T>(n, fill));
  }
  // Elements [0, n) of `array`, an array of this backend, on the host.
  template <typename T>
  std::vector<T> read(const T* array, size_t n) const {
    std::vector<T> host(n);
    copy_from_backend(device_, host.data(), array, n * sizeof(T));
    return host;
  }

 private:
  // A new array of this backend holding a copy of `host` (at least 16 bytes, so that an
  // empty array still has an address).
  template <typename T>
  T* copy_in(const std::vector<T>& host) {
    const size_t bytes = host.size() * sizeof(T);
    void* array = nullptr;
    if (device_ == Device::kCpu) {
      array = host_arrays_.emplace_back(std::max<size_t>(bytes, 16)).data();
    } else {
#if PAGEDKV_HAVE_CUDA
      REQUIRE(cudaMalloc(&array, std::max<size_t>(bytes, 16)) == cudaSuccess);
      device_arrays_.push_back(array);
#endif
    }
    copy_to_backend(device_, array, host.data(), bytes);
    return static_cast<T*>(array);
  }

  Device device_;
  std::vector<std::vector<uint8_t>> host_arrays_;  // the CPU's arrays (moves keep their data)
  std::vector<void*> device_arrays_;               // CUDA's
};

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_BACKENDS_H_
