// File: python/src/bindings.h
//
// Shared pieces of the nanobind module pagedkv._pagedkv:
//   - Status -> Python exception mapping (raise_if_error, value_or_raise),
//   - CallbackErrors: Python exceptions raised inside callbacks the library calls (event
//     sinks, preemption hooks, victim policies, clocks) are held and re-raised once the library
//     call has returned, so no exception ever unwinds through library code,
//   - IntValues<T>: integer arguments given as a Python sequence or a 1-D array,
//   - NumPy helpers, and the bind_* functions that module.cc calls in order.
// The module runs on the caller's thread with the GIL held, like the C++ API's one
// owning thread; kernels release the GIL while they run.
#ifndef PAGEDKV_PYTHON_BINDINGS_H_
#define PAGEDKV_PYTHON_BINDINGS_H_

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/kv_events.h"

namespace pagedkv::python {

namespace nb = nanobind;

// --- errors -----------------------------------------------------------------------------

// Raises the Python exception of `status` (which must not be OK), with its message:
// NotFound -> KeyError, InvalidArgument -> ValueError, AlreadyExists -> pagedkv.AlreadyExists
// (a ValueError), ResourceExhausted -> pagedkv.ResourceExhausted, FailedPrecondition ->
// pagedkv.FailedPrecondition, OutOfRange -> IndexError, Unimplemented ->
// NotImplementedError, anything else -> pagedkv.InternalError (all pagedkv.* ones are
// RuntimeErrors).
[[noreturn]] void raise_status(const absl::Status& status);

// The exception object raise_status() would raise, without raising it.
nb::object exception_for(const absl::Status& status);

inline void raise_if_error(const absl::Status& status) {
  if (!status.ok()) raise_status(status);
}

template <typename T>
T value_or_raise(absl::StatusOr<T> result) {
  if (!result.ok()) raise_status(result.status());
  return *std::move(result);
}

// Python exceptions raised by Python callbacks while a library call runs. The library
// is not exception-safe by design (it reports errors as Status), so callbacks catch,
// record the first exception here and return normally; the binding re-raises it after
// the library call, whose own effects are complete.
class CallbackErrors {
 public:
  // Runs `fn` (which calls into Python) and keeps the first exception it raises.
  template <typename Fn>
  void guard(Fn&& fn) noexcept {
    try {
      fn();
    } catch (nb::python_error& e) {
      if (!pending_.has_value()) pending_.emplace(std::move(e));
    } catch (const std::exception& e) {  // a nanobind cast error, for instance
      if (!pending_.has_value()) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        pending_.emplace();
      }
    }
  }

  // Re-raises the kept exception, if any, and forgets it.
  void raise_pending() {
    if (!pending_.has_value()) return;
    nb::python_error error = std::move(*pending_);
    pending_.reset();
    throw error;
  }

 private:
  std::optional<nb::python_error> pending_;
};

// Refuses a mutating call made by a callback of the call in progress (an event sink or a
// hook calling back into the manager or pool that is calling it), which the C++ API
// forbids: the object is mid-update.
class ReentryGuard {
 public:
  ReentryGuard(bool& busy, const char* owner) : busy_(busy) {
    if (busy_) {
      raise_status(absl::FailedPreconditionError(std::string(owner) +
                                                 ": a callback called a mutating method of the " +
                                                 owner + " that is calling it"));
    }
    busy_ = true;
  }
  ~ReentryGuard() { busy_ = false; }
  ReentryGuard(const ReentryGuard&) = delete;
  ReentryGuard& operator=(const ReentryGuard&) = delete;

 private:
  bool& busy_;
};

// --- callbacks --------------------------------------------------------------------------

// The KvEventSink a pool or manager is given: forwards events to a Python object's
// on_event(), or straight to a native pagedkv.KvEventBuffer (no Python per event).
class PythonEventSink : public KvEventSink {
 public:
  PythonEventSink(nb::object sink, CallbackErrors* errors);
  void on_event(const KvEvent& event) override;

  // Garbage-collector support of the owning Python object (a sink may refer back to it).
  int traverse(visitproc visit, void* arg) const;
  void clear();  // drops the sink: later events go nowhere

 private:
  nb::object sink_;
  KvEventSink* native_ = nullptr;  // the KvEventBuffer inside sink_, if it is one
  CallbackErrors* errors_;
};

// The clock of a pool or manager (Options::clock): a Python callable returning the time in
// milliseconds as an int. A clock that raises (or returns something else) keeps the time
// it returned last (0 before its first answer) and the exception is re-raised when the
// library call returns.
class PythonClock {
 public:
  PythonClock(nb::object clock, CallbackErrors* errors);
  int64_t now_ms();

  // The Options::clock calling this object; empty for a None clock (the library's
  // steady clock). The object must outlive the pool or manager it is given to.
  std::function<int64_t()> function();

  // Garbage-collector support of the owning Python object (a clock may refer back to it).
  int traverse(visitproc visit, void* arg) const;
  void clear();  // drops the callable: the time stands still from then on

 private:
  nb::object clock_;
  CallbackErrors* errors_;
  int64_t last_ms_ = 0;
};

// Converts a KvEvent to its Python object (BlockStored, BlockRemoved, AllBlocksCleared).
nb::object event_to_python(const KvEvent& event);

// --- arrays -----------------------------------------------------------------------------

// A 1-D CPU array of T, C-contiguous (any DLPack or buffer-protocol producer).
template <typename T>
using Array1D = nb::ndarray<T, nb::ndim<1>, nb::device::cpu, nb::c_contig>;

// Integer values taken as a 1-D array of T (no copy) or any Python sequence of ints (one
// copy), and with AllowScalar a single int meaning "this value for every entry".
template <typename T, bool AllowScalar = false>
struct IntValues {
  Array1D<const T> array;
  std::vector<T> copy;
  bool scalar = false;

  std::span<const T> span() const {
    if (array.is_valid()) return {array.data(), array.shape(0)};
    return copy;
  }
  size_t size() const { return array.is_valid() ? array.shape(0) : copy.size(); }
  // Entry i, or the scalar for every i.
  T at(size_t i) const { return scalar ? copy[0] : span()[i]; }
};

// A new 1-D NumPy array of T (int32 or int64), returned to Python as is.
template <typename T>
struct NumpyArray {
  nb::object array;
  T* data = nullptr;
  size_t size = 0;
};

// Loads NumPy's C API (module init).
void import_numpy();

template <typename T>
NumpyArray<T> new_numpy_array(size_t size);

// A new NumPy array holding a copy of `values`.
template <typename T>
NumpyArray<T> to_numpy(std::span<const T> values) {
  NumpyArray<T> result = new_numpy_array<T>(values.size());
  std::copy(values.begin(), values.end(), result.data);
  return result;
}

// --- module parts, in module.cc's order -------------------------------------------------

void bind_errors(nb::module_& m);
void bind_types(nb::module_& m);  // enums, BlockHash, BlockCopy, events, hash_block
void bind_block_pool(nb::module_& m);
void bind_kv_cache_manager(nb::module_& m);
void bind_kv_storage(nb::module_& m);
void bind_kernels(nb::module_& m);

}  // namespace pagedkv::python

namespace nanobind::detail {

// Caster of IntValues<T>: an array of T first (no copy), then any sequence of ints.
template <typename T, bool AllowScalar>
struct type_caster<pagedkv::python::IntValues<T, AllowScalar>> {
  using Values = pagedkv::python::IntValues<T, AllowScalar>;
  NB_TYPE_CASTER(Values, const_name<AllowScalar>(
                             "int | collections.abc.Sequence[int] | numpy.typing.ArrayLike",
                             "collections.abc.Sequence[int] | numpy.typing.ArrayLike"))

  bool from_python(handle src, uint8_t flags, cleanup_list* cleanup) noexcept {
    if (PyList_CheckExact(src.ptr()) || PyTuple_CheckExact(src.ptr())) {
      return from_sequence(src, flags, cleanup);  // the common small case, first
    }
    // Arrays of another integer dtype are converted; float arrays are refused, never
    // truncated into ids.
    make_caster<pagedkv::python::Array1D<const T>> array_caster;
    const uint8_t no_convert = flags & ~static_cast<uint8_t>(cast_flags::convert);
    if (array_caster.from_python(src, no_convert, cleanup) ||
        (integer_array(src) && array_caster.from_python(src, flags, cleanup))) {
      value.array = array_caster.value;
      return true;
    }
    if (hasattr(src, "dtype")) return false;
    if (AllowScalar && PyLong_Check(src.ptr())) {
      make_caster<T> scalar_caster;
      if (!scalar_caster.from_python(src, flags, cleanup)) return false;
      value.copy.assign(1, scalar_caster.value);
      value.scalar = true;
      return true;
    }
    return from_sequence(src, flags, cleanup);
  }

  bool from_sequence(handle src, uint8_t flags, cleanup_list* cleanup) noexcept {
    make_caster<std::vector<T>> list_caster;
    if (!list_caster.from_python(src, flags, cleanup)) return false;
    value.copy = std::move(list_caster.value);
    return true;
  }

  // True for an array object (NumPy, PyTorch, ...) whose dtype is an integer type.
  static bool integer_array(handle src) noexcept {
    try {
      if (!hasattr(src, "dtype")) return false;
      object dtype = src.attr("dtype");
      if (hasattr(dtype, "kind")) {  // NumPy
        const std::string kind = cast<std::string>(dtype.attr("kind"));
        return kind == "i" || kind == "u";
      }
      if (hasattr(dtype, "is_floating_point")) {  // PyTorch
        return !cast<bool>(dtype.attr("is_floating_point")) &&
               !cast<bool>(dtype.attr("is_complex"));
      }
    } catch (const std::exception&) {
      PyErr_Clear();
    }
    return false;
  }
};

// NumpyArray<T> goes to Python as its array object.
template <typename T>
struct type_caster<pagedkv::python::NumpyArray<T>> {
  using Array = pagedkv::python::NumpyArray<T>;
  static constexpr bool kInt64 = std::is_same_v<T, int64_t>;
  NB_TYPE_CASTER(Array, const_name("numpy.typing.NDArray[") +
                            const_name<kInt64>("numpy.int64", "numpy.int32") + const_name("]"))

  bool from_python(handle, uint8_t, cleanup_list*) noexcept { return false; }
  static handle from_cpp(const Array& value, rv_policy, cleanup_list*) noexcept {
    return value.array.inc_ref();
  }
};

}  // namespace nanobind::detail

#endif  // PAGEDKV_PYTHON_BINDINGS_H_
