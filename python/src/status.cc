#include "python/src/status.h"

#include <string>

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

}  // namespace muonshard::python
