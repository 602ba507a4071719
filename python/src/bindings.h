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
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
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

// The int64 a Python callback returned (an int or a NumPy integer; not a bool). Anything else
// raises TypeError "<callback> returned str; <expected>", and an int beyond int64 TypeError
// "<callback> returned 2**70's digits, outside the <range_name> range [min, max]; <expected>".
int64_t int64_from_callback(nb::handle result, const char* callback, const char* range_name,
                            const char* expected);

// Converts a KvEvent to its Python object (BlockStored, BlockRemoved, AllBlocksCleared).
nb::object event_to_python(const KvEvent& event);

// --- arrays -----------------------------------------------------------------------------

// A 1-D CPU array of T, C-contiguous (any DLPack or buffer-protocol producer).
template <typename T>
using Array1D = nb::ndarray<T, nb::ndim<1>, nb::device::cpu, nb::c_contig>;

// The C++ name of an integer type, for messages ("int32").
template <typename T>
constexpr const char* int_type_name() {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if constexpr (std::is_signed_v<T>) {
    return sizeof(T) == 1 ? "int8" : sizeof(T) == 2 ? "int16" : sizeof(T) == 4 ? "int32" : "int64";
  } else {
    return sizeof(T) == 1   ? "uint8"
           : sizeof(T) == 2 ? "uint16"
           : sizeof(T) == 4 ? "uint32"
                            : "uint64";
  }
}

// The first entry of an integer input that T cannot hold: its index ("[3]", "[0, 2]"; empty
// for a scalar) and its value in decimal.
struct OutOfRangeEntry {
  std::string index;
  std::string value;
};

// Raises ValueError "function: argument[index] = value is outside the int32 range [lo, hi]".
[[noreturn]] void raise_out_of_range(std::string_view function, std::string_view argument,
                                     const OutOfRangeEntry& entry, const char* type_name,
                                     std::string_view min, std::string_view max);

// Raises the ValueError of `entry` for T's range.
template <typename T>
[[noreturn]] void raise_out_of_range(std::string_view function, std::string_view argument,
                                     const OutOfRangeEntry& entry) {
  raise_out_of_range(function, argument, entry, int_type_name<T>(),
                     std::to_string(std::numeric_limits<T>::min()),
                     std::to_string(std::numeric_limits<T>::max()));
}

// Copies a 1-D or 2-D CPU array of any integer dtype (int8..uint64) and any strides into
// `out` as T, in row-major order, stopping at the first entry T cannot hold, which goes to
// `out_of_range`. Returns false (copying nothing) for any other dtype: float, bool and
// complex values are never read as integers. The one conversion path of integer inputs.
template <typename T, typename... Args>
bool copy_integers(const nb::ndarray<Args...>& array, std::vector<T>& out,
                   std::optional<OutOfRangeEntry>& out_of_range) noexcept {
  const auto copy = [&]<typename Source>() {
    const auto* data = static_cast<const Source*>(array.data());
    const bool matrix = array.ndim() == 2;
    const size_t rows = array.shape(0);
    const size_t columns = matrix ? array.shape(1) : 1;
    out.resize(rows * columns);
    for (size_t row = 0; row < rows; ++row) {
      for (size_t column = 0; column < columns; ++column) {
        const int64_t offset = static_cast<int64_t>(row) * array.stride(0) +
                               (matrix ? static_cast<int64_t>(column) * array.stride(1) : 0);
        const Source entry = data[offset];
        if (!std::in_range<T>(entry)) {
          out_of_range = OutOfRangeEntry{
              matrix ? absl::StrCat("[", row, ", ", column, "]") : absl::StrCat("[", row, "]"),
              std::to_string(entry)};
          return true;
        }
        out[row * columns + column] = static_cast<T>(entry);
      }
    }
    return true;
  };
  const nb::dlpack::dtype dtype = array.dtype();
  if (dtype.lanes != 1 || array.ndim() < 1 || array.ndim() > 2) return false;
  if (dtype.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int)) {
    switch (dtype.bits) {
      case 8:
        return copy.template operator()<int8_t>();
      case 16:
        return copy.template operator()<int16_t>();
      case 32:
        return copy.template operator()<int32_t>();
      case 64:
        return copy.template operator()<int64_t>();
    }
  } else if (dtype.code == static_cast<uint8_t>(nb::dlpack::dtype_code::UInt)) {
    switch (dtype.bits) {
      case 8:
        return copy.template operator()<uint8_t>();
      case 16:
        return copy.template operator()<uint16_t>();
      case 32:
        return copy.template operator()<uint32_t>();
      case 64:
        return copy.template operator()<uint64_t>();
    }
  }
  return false;
}

// Integer values taken as a 1-D array of T (no copy), a 1-D array of any other integer dtype
// (int8..uint64, any strides; one checked copy) or any Python sequence of ints (one checked
// copy), and with AllowScalar a single int meaning "this value for every entry". A value T
// cannot hold is never truncated: the caster accepts the input and records the first such
// entry, and checked() raises ValueError naming it. Float, bool and complex arrays are
// refused by the caster (TypeError).
template <typename T, bool AllowScalar = false>
struct IntValues {
  Array1D<const T> array;
  std::vector<T> copy;
  bool scalar = false;
  std::optional<OutOfRangeEntry> out_of_range;

  // The values, once they are all in T's range; else raises ValueError naming `function`,
  // `argument`, the entry and the range. The only way to the values.
  std::span<const T> checked(std::string_view function, std::string_view argument) const {
    if (out_of_range.has_value()) raise_out_of_range<T>(function, argument, *out_of_range);
    if (array.is_valid()) return {array.data(), array.shape(0)};
    return copy;
  }
  size_t size() const { return array.is_valid() ? array.shape(0) : copy.size(); }
  // Entry i, or the scalar for every i (after checked()).
  T at(size_t i) const { return scalar ? copy[0] : array.is_valid() ? array.data()[i] : copy[i]; }
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

// --- counter structs --------------------------------------------------------------------

// One field of a plain counters struct (Stats, GroupStats): its Python name, member and
// docstring (nullptr: none).
template <typename S, typename M>
struct CounterField {
  const char* name;
  M S::*member;
  const char* doc = nullptr;
};

template <typename S, typename M>
CounterField<S, M> counter(const char* name, M S::*member, const char* doc = nullptr) {
  return {name, member, doc};
}

// Binds each field read-only, `_asdict()` and `__repr__` (`type_name(a=1, b=2)`) from the
// one list, so that the dict and the repr never miss a field.
template <typename S, typename... M>
void bind_counters(nb::class_<S>& cls, const char* type_name, CounterField<S, M>... fields) {
  const auto bind_field = [&cls](const auto& f) {
    if (f.doc != nullptr) {
      cls.def_ro(f.name, f.member, f.doc);
    } else {
      cls.def_ro(f.name, f.member);
    }
  };
  (bind_field(fields), ...);
  cls.def(
      "_asdict",
      [fields...](const S& s) {
        nb::dict d;
        ((d[fields.name] = s.*(fields.member)), ...);
        return d;
      },
      "The counters as a dict.");
  cls.def("__repr__", [type_name, fields...](const S& s) {
    std::string out = absl::StrCat(type_name, "(");
    const char* separator = "";
    ((absl::StrAppend(&out, std::exchange(separator, ", "), fields.name, "=", s.*(fields.member))),
     ...);
    return out + ")";
  });
}

// --- module parts, in module.cc's order -------------------------------------------------

void bind_errors(nb::module_& m);
void bind_types(nb::module_& m);  // enums, BlockHash, BlockCopy, events, hash_block
void bind_block_pool(nb::module_& m);
void bind_kv_cache_manager(nb::module_& m);
void bind_kv_storage(nb::module_& m);
void bind_kv_cache_config(nb::module_& m);  // after bind_kv_storage (KvCacheSpec)
void bind_kernels(nb::module_& m);
#ifdef PAGEDKV_PYTHON_HAVE_PLANNER
void bind_capacity_plan(nb::module_& m);  // only when the planner library is built
#endif

}  // namespace pagedkv::python

namespace nanobind::detail {

// Caster of IntValues<T>: an array of T first (no copy), then an array of another integer
// dtype or any sequence of ints, each entry range-checked (never truncated).
template <typename T, bool AllowScalar>
struct type_caster<pagedkv::python::IntValues<T, AllowScalar>> {
  using Values = pagedkv::python::IntValues<T, AllowScalar>;
  // Any 1-D CPU array, of any dtype and strides, read-only.
  using AnyArray = ndarray<ro, ndim<1>, device::cpu>;
  NB_TYPE_CASTER(Values, const_name<AllowScalar>(
                             "int | collections.abc.Sequence[int] | numpy.typing.ArrayLike",
                             "collections.abc.Sequence[int] | numpy.typing.ArrayLike"))

  bool from_python(handle src, uint8_t flags, cleanup_list* cleanup) noexcept {
    if (PyList_CheckExact(src.ptr()) || PyTuple_CheckExact(src.ptr())) {
      return from_sequence(src);  // the common small case, first
    }
    // Nothing is converted by nanobind: its dtype conversion truncates.
    const uint8_t no_convert = flags & ~static_cast<uint8_t>(cast_flags::convert);
    make_caster<pagedkv::python::Array1D<const T>> exact_caster;
    if (exact_caster.from_python(src, no_convert, cleanup)) {
      value.array = exact_caster.value;
      return true;
    }
    make_caster<AnyArray> any_caster;
    if (any_caster.from_python(src, no_convert, cleanup)) return from_array(any_caster.value);
    PyErr_Clear();
    if (hasattr(src, "dtype")) return false;  // an array we cannot read: 0-d, 2-D, on a GPU
    if (AllowScalar && PyLong_Check(src.ptr())) {
      value.copy.assign(1, T{});
      value.scalar = true;
      return load_int(src.ptr(), "", value.copy[0]);
    }
    return from_sequence(src);
  }

  // An integer array of any width: copied with a range check. Other dtypes are refused.
  bool from_array(const AnyArray& array) noexcept {
    return pagedkv::python::copy_integers(array, value.copy, value.out_of_range);
  }

  // A Python sequence (not a str) of ints or objects with __index__ (NumPy integer scalars);
  // floats are refused.
  bool from_sequence(handle src) noexcept {
    if (!PySequence_Check(src.ptr()) || PyUnicode_Check(src.ptr())) return false;
    PyObject* items = PySequence_Fast(src.ptr(), "");
    if (items == nullptr) {
      PyErr_Clear();
      return false;
    }
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(items);
    PyObject** item = PySequence_Fast_ITEMS(items);
    value.copy.resize(static_cast<size_t>(size));
    bool ok = true;
    for (Py_ssize_t i = 0; ok && i < size && !value.out_of_range.has_value(); ++i) {
      ok = load_int(item[i], absl::StrCat("[", i, "]"), value.copy[static_cast<size_t>(i)]);
    }
    Py_DECREF(items);
    return ok;
  }

  // Loads one int into `out`, or records it as out of range (and returns true); false for
  // a non-integer.
  bool load_int(PyObject* item, std::string index, T& out) noexcept {
    if (PyFloat_Check(item)) return false;
    object number;  // the int of a NumPy integer scalar
    if (!PyLong_Check(item)) {
      if (!PyIndex_Check(item)) return false;
      number = steal(PyNumber_Index(item));
      if (!number.is_valid()) {
        PyErr_Clear();
        return false;
      }
      item = number.ptr();
    }
    int overflow = 0;
    const long long signed_value = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow == 0 && std::in_range<T>(signed_value)) {
      out = static_cast<T>(signed_value);
      return true;
    }
    if (overflow > 0 && std::is_unsigned_v<T>) {
      const unsigned long long unsigned_value = PyLong_AsUnsignedLongLong(item);
      if (!PyErr_Occurred() && std::in_range<T>(unsigned_value)) {
        out = static_cast<T>(unsigned_value);
        return true;
      }
    }
    PyErr_Clear();
    PyObject* text = PyObject_Str(item);
    const char* chars = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
    value.out_of_range =
        pagedkv::python::OutOfRangeEntry{std::move(index), chars != nullptr ? chars : "?"};
    Py_XDECREF(text);
    PyErr_Clear();
    return true;
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
