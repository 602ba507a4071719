// New NumPy arrays through NumPy's C API: about 10x cheaper than exporting a buffer through
// numpy.asarray(), which matters for the per-sequence calls' small results.
#define PY_ARRAY_UNIQUE_SYMBOL pagedkv_python_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "bindings.h"

namespace pagedkv::python {
namespace {

template <typename T>
constexpr int numpy_type() {
  static_assert(std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>);
  return std::is_same_v<T, int32_t> ? NPY_INT32 : NPY_INT64;
}

}  // namespace

void import_numpy() {
  if (_import_array() < 0) throw nb::python_error();
}

template <typename T>
NumpyArray<T> new_numpy_array(size_t size) {
  npy_intp dims[1] = {static_cast<npy_intp>(size)};
  PyObject* array = PyArray_SimpleNew(1, dims, numpy_type<T>());
  if (array == nullptr) throw nb::python_error();
  NumpyArray<T> result;
  result.data = static_cast<T*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(array)));
  result.size = size;
  result.array = nb::steal(array);
  return result;
}

template NumpyArray<int32_t> new_numpy_array<int32_t>(size_t);
template NumpyArray<int64_t> new_numpy_array<int64_t>(size_t);

}  // namespace pagedkv::python
