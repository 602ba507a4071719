// Status -> Python exception mapping, and the exception types of the package.
#include <nanobind/stl/string.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "bindings.h"

namespace pagedkv::python {
namespace {

// The package's own exception types, created by bind_errors(). Module-lifetime globals:
// the module is never unloaded once imported.
PyObject* resource_exhausted = nullptr;
PyObject* failed_precondition = nullptr;
PyObject* already_exists = nullptr;
PyObject* internal_error = nullptr;

PyObject* exception_type(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kNotFound:
      return PyExc_KeyError;
    case absl::StatusCode::kInvalidArgument:
      return PyExc_ValueError;
    case absl::StatusCode::kAlreadyExists:
      return already_exists;
    case absl::StatusCode::kResourceExhausted:
      return resource_exhausted;
    case absl::StatusCode::kFailedPrecondition:
      return failed_precondition;
    case absl::StatusCode::kOutOfRange:
      return PyExc_IndexError;
    case absl::StatusCode::kUnimplemented:
      return PyExc_NotImplementedError;
    default:
      return internal_error;
  }
}

PyObject* new_exception(nb::module_& m, const char* name, PyObject* base, const char* doc) {
  // Qualified by the module's own name, so that stubgen sees a class of this module.
  const std::string qualified = nb::cast<std::string>(m.attr("__name__")) + "." + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, nullptr);
  if (type == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(type);
  return type;
}

}  // namespace

nb::object exception_for(const absl::Status& status) {
  nb::str message(status.message().data(), status.message().size());
  return nb::handle(exception_type(status.code()))(message);
}

void raise_status(const absl::Status& status) {
  const std::string message(status.message());
  PyErr_SetString(exception_type(status.code()), message.c_str());
  throw nb::python_error();
}

void raise_out_of_range(std::string_view function, std::string_view argument,
                        const OutOfRangeEntry& entry, const char* type_name, std::string_view min,
                        std::string_view max) {
  raise_status(absl::InvalidArgumentError(absl::StrCat(
      std::string(function), ": ", std::string(argument), entry.index, " = ", entry.value,
      " is outside the ", type_name, " range [", std::string(min), ", ", std::string(max), "]")));
}

void bind_errors(nb::module_& m) {
  resource_exhausted =
      new_exception(m, "ResourceExhausted", PyExc_RuntimeError,
                    "Not enough blocks (or memory): nothing changed; preempt or free and retry.");
  failed_precondition = new_exception(
      m, "FailedPrecondition", PyExc_RuntimeError,
      "The call is not valid in the sequence's (or pool's) current state; nothing changed.");
  already_exists =
      new_exception(m, "AlreadyExists", PyExc_ValueError, "The sequence id is already in use.");
  internal_error = new_exception(m, "InternalError", PyExc_RuntimeError,
                                 "A broken invariant or a failed CUDA call (a pagedkv bug).");
}

}  // namespace pagedkv::python
