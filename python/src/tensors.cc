// ArgCheck: validation of DLPack tensor arguments.
#include "tensors.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pagedkv::python {
namespace {

using nb::dlpack::dtype_code;

std::string shape_string(const Tensor& t) {
  std::vector<int64_t> dims(t.shape_ptr(), t.shape_ptr() + t.ndim());
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

std::string dtype_string(nb::dlpack::dtype dtype) {
  const char* kind = "?";
  switch (static_cast<dtype_code>(dtype.code)) {
    case dtype_code::Int:
      kind = "int";
      break;
    case dtype_code::UInt:
      kind = "uint";
      break;
    case dtype_code::Float:
      kind = "float";
      break;
    case dtype_code::Bfloat:
      kind = "bfloat";
      break;
    case dtype_code::Float8_E4M3FN:
      return "float8_e4m3fn";
    default:
      break;
  }
  return absl::StrCat(kind, dtype.bits);
}

std::optional<DType> float_dtype_of(nb::dlpack::dtype dtype) {
  if (dtype.lanes != 1) return std::nullopt;
  const auto code = static_cast<dtype_code>(dtype.code);
  if (code == dtype_code::Float && dtype.bits == 32) return DType::kFloat32;
  if (code == dtype_code::Float && dtype.bits == 16) return DType::kFloat16;
  if (code == dtype_code::Bfloat && dtype.bits == 16) return DType::kBFloat16;
  if (code == dtype_code::Float8_E4M3FN && dtype.bits == 8) return DType::kFloat8E4M3;
  return std::nullopt;
}

}  // namespace

nb::dlpack::dtype dlpack_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return nb::dtype<float>();
    case DType::kFloat16:
      return {static_cast<uint8_t>(dtype_code::Float), 16, 1};
    case DType::kBFloat16:
      return {static_cast<uint8_t>(dtype_code::Bfloat), 16, 1};
    case DType::kFloat8E4M3:
      return {static_cast<uint8_t>(dtype_code::Float8_E4M3FN), 8, 1};
  }
  return {};
}

void ArgCheck::fail(const std::string& message) const {
  raise_status(absl::InvalidArgumentError(absl::StrCat(fn_, ": ", message)));
}

void ArgCheck::device_of(const Tensor& t, const char* name) {
  Device device;
  switch (t.device_type()) {
    case kDlCpu:
    case kDlCudaHost:
      device = Device::kCpu;
      break;
    case kDlCuda:
    case kDlCudaManaged:
      device = Device::kCuda;
      break;
    default:
      fail(absl::StrCat(name, " is on DLPack device type ", t.device_type(),
                        "; pagedkv runs on CPU and CUDA"));
  }
  const int32_t id = device == Device::kCuda ? t.device_id() : 0;
  if (!have_device_) {
    have_device_ = true;
    device_ = device;
    device_id_ = id;
  } else if (device != device_ || id != device_id_) {
    fail(absl::StrCat(name, " is on ", device_name(device), ":", id, ", the other tensors on ",
                      device_name(device_), ":", device_id_));
  }
}

DType ArgCheck::float_dtype(const Tensor& t, const char* name,
                            std::initializer_list<DType> allowed) {
  const std::optional<DType> dtype = float_dtype_of(t.dtype());
  for (const DType a : allowed) {
    if (dtype == a) return a;
  }
  std::vector<std::string> names;
  for (const DType a : allowed) names.push_back(dtype_name(a));
  fail(absl::StrCat(name, " has dtype ", dtype_string(t.dtype()), "; expected one of ",
                    absl::StrJoin(names, ", ")));
}

void ArgCheck::int_dtype(const Tensor& t, const char* name, int bits) {
  const nb::dlpack::dtype d = t.dtype();
  if (static_cast<dtype_code>(d.code) != dtype_code::Int || d.bits != bits || d.lanes != 1) {
    fail(absl::StrCat(name, " has dtype ", dtype_string(d), "; expected int", bits));
  }
}

void ArgCheck::ndim(const Tensor& t, const char* name, size_t ndim) {
  if (t.ndim() != ndim) {
    fail(absl::StrCat(name, " has shape ", shape_string(t), "; expected ", ndim, " dimensions"));
  }
}

void ArgCheck::dim(const Tensor& t, const char* name, size_t dim, int64_t expected,
                   const char* what) {
  if (static_cast<int64_t>(t.shape(dim)) != expected) {
    fail(absl::StrCat(name, " has shape ", shape_string(t), "; dimension ", dim, " must be ", what,
                      " = ", expected));
  }
}

void ArgCheck::contiguous(const Tensor& t, const char* name) {
  if (t.stride_ptr() == nullptr) return;  // DLPack: no strides means C-contiguous
  int64_t expected = 1;
  for (size_t i = t.ndim(); i-- > 0;) {
    if (t.shape(i) != 1 && t.stride(i) != expected) {
      fail(absl::StrCat(name, " with shape ", shape_string(t), " is not C-contiguous (stride ",
                        t.stride(i), " in dimension ", i, ", expected ", expected, ")"));
    }
    expected *= static_cast<int64_t>(t.shape(i));
  }
}

const float* ArgCheck::scale(const Tensor& t, const char* name) {
  if (!t.is_valid()) return nullptr;
  device_of(t, name);
  float_dtype(t, name, {DType::kFloat32});
  if (t.size() != 1) fail(absl::StrCat(name, " must hold one fp32 value, has ", t.size()));
  return static_cast<const float*>(t.data());
}

KvCacheView ArgCheck::cache_view(const Tensor& k, const Tensor& v, KvLayout layout,
                                 std::optional<DType> kv_dtype) {
  device_of(k, "k_cache");
  ndim(k, "k_cache", 4);
  if (v.is_valid()) {
    device_of(v, "v_cache");
    ndim(v, "v_cache", 4);
    if (k.dtype() != v.dtype()) {
      fail(absl::StrCat("v_cache has dtype ", dtype_string(v.dtype()), ", k_cache ",
                        dtype_string(k.dtype())));
    }
    for (size_t i = 0; i < 4; ++i) {
      if (k.shape(i) != v.shape(i) || k.stride(i) != v.stride(i)) {
        fail(absl::StrCat("v_cache (shape ", shape_string(v), ") must have k_cache's shape ",
                          shape_string(k), " and strides"));
      }
    }
  }
  DType dtype;
  if (kv_dtype.has_value()) {
    if (static_cast<int32_t>(k.itemsize()) != bytes_per_element(*kv_dtype)) {
      fail(absl::StrCat("kv_dtype ", dtype_name(*kv_dtype), " needs ", bytes_per_element(*kv_dtype),
                        "-byte elements; k_cache has ", dtype_string(k.dtype())));
    }
    dtype = *kv_dtype;
  } else {
    dtype = float_dtype(k, "k_cache",
                        {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3});
  }
  if (k.stride(3) != 1) {
    fail(absl::StrCat("k_cache must be contiguous in head_dim (last stride ", k.stride(3), ")"));
  }
  for (size_t i = 0; i < 4; ++i) {
    if (k.shape(i) > static_cast<size_t>(INT32_MAX) || k.stride(i) < 0) {
      fail(absl::StrCat("k_cache has shape ", shape_string(k),
                        "; dimensions must fit int32 and strides be non-negative"));
    }
  }
  const bool hnd = layout == KvLayout::kHND;
  KvCacheView view;
  view.k = k.data();
  view.v = v.is_valid() ? v.data() : nullptr;
  view.dtype = dtype;
  view.num_blocks = static_cast<int32_t>(k.shape(0));
  view.num_kv_heads = static_cast<int32_t>(k.shape(hnd ? 1 : 2));
  view.block_size = static_cast<int32_t>(k.shape(hnd ? 2 : 1));
  view.head_dim = static_cast<int32_t>(k.shape(3));
  view.block_stride = k.stride(0);
  view.head_stride = k.stride(hnd ? 1 : 2);
  view.token_stride = k.stride(hnd ? 2 : 1);
  return view;
}

}  // namespace pagedkv::python
