// File: python/src/tensors.h
//
// DLPack tensors as the kernels and KvStorage take them: dtype and device mapping, and
// ArgCheck, which validates each tensor argument of one call (dtype, shape, device,
// contiguity) and names the function, the argument, the value and the expectation.
#ifndef PAGEDKV_PYTHON_TENSORS_H_
#define PAGEDKV_PYTHON_TENSORS_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "bindings.h"
#include "pagedkv/device.h"
#include "pagedkv/dtype.h"
#include "pagedkv/kv_cache_view.h"

namespace pagedkv::python {

// Any DLPack tensor; an invalid one stands for None.
using Tensor = nb::ndarray<>;

// The DLPack dtype of `dtype` (fp8 e4m3 is DLPack's float8_e4m3fn).
nb::dlpack::dtype dlpack_dtype(DType dtype);

// DLPack device types.
inline constexpr int kDlCpu = 1;
inline constexpr int kDlCuda = 2;
inline constexpr int kDlCudaHost = 3;
inline constexpr int kDlCudaManaged = 13;

class ArgCheck {
 public:
  explicit ArgCheck(const char* fn) : fn_(fn) {}

  // The device all tensors checked so far live on (CPU until one is checked).
  Device device() const { return device_; }
  int32_t device_id() const { return device_id_; }

  // Checks that `t` lives on the same device as the tensors before it.
  void device_of(const Tensor& t, const char* name);
  // The float dtype of `t`, one of `allowed`.
  DType float_dtype(const Tensor& t, const char* name, std::initializer_list<DType> allowed);
  // Checks an integer dtype of `bits` bits.
  void int_dtype(const Tensor& t, const char* name, int bits);
  void ndim(const Tensor& t, const char* name, size_t ndim);
  // Checks dimension `dim` equals `expected` (named `what` in the message).
  void dim(const Tensor& t, const char* name, size_t dim, int64_t expected, const char* what);
  void contiguous(const Tensor& t, const char* name);
  // A 1-element fp32 tensor's pointer (a k/v scale), or null for None.
  const float* scale(const Tensor& t, const char* name);
  // The one-layer cache view of k_cache / v_cache (4-D, head_dim contiguous, same shape,
  // strides and dtype) in `layout`. `kv_dtype` overrides the dtype of a 1-byte tensor
  // (uint8 storage of fp8 e4m3). An invalid (None) v is a K-only cache: the view's v is
  // null (an MLA latent cache).
  KvCacheView cache_view(const Tensor& k, const Tensor& v, KvLayout layout,
                         std::optional<DType> kv_dtype);

  [[noreturn]] void fail(const std::string& message) const;

 private:
  const char* fn_;
  bool have_device_ = false;
  Device device_ = Device::kCpu;
  int32_t device_id_ = 0;
};

}  // namespace pagedkv::python

#endif  // PAGEDKV_PYTHON_TENSORS_H_
