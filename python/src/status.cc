#include "python/src/status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace muonshard::python {

namespace py = pybind11;

void RaiseStatus(const absl::Status& status) {
  const std::string code = absl::StatusCodeToString(status.code());
  const std::string message(status.message());
  py::object errors = py::module_::import("muonshard._errors");
  py::object error = errors.attr("from_status")(code, message);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

absl::StatusOr<absl::StatusCode> StatusCodeNamed(const std::string& name) {
  for (int c = 0; c <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    if (absl::StatusCodeToString(code) == name) return code;
  }
  return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" is not a status code name"));
}

}  // namespace muonshard::python
