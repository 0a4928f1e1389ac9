#ifndef MUONSHARD_PYTHON_SRC_STATUS_H_
#define MUONSHARD_PYTHON_SRC_STATUS_H_

// absl::Status -> Python exceptions at the extension's boundary (design
// notes, "Python errors"): INVALID_ARGUMENT -> ValueError, NOT_FOUND ->
// LookupError, DEADLINE_EXCEEDED -> TimeoutError, UNAVAILABLE ->
// ConnectionError, UNAUTHENTICATED / PERMISSION_DENIED -> PermissionError,
// every other code -> RuntimeError; each class is also a muonshard.Error
// carrying the code's name (muonshard/_errors.py defines them), and the
// message is the C++ message unchanged.
//
// The only place the project raises C++ exceptions: pybind11 turns a thrown
// py::error_already_set into the pending Python exception.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pybind11/pybind11.h"

namespace muonshard::python {

// Raises the Python exception for `status`. REQUIRES: !status.ok(), the GIL.
[[noreturn]] void RaiseStatus(const absl::Status& status);

inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) RaiseStatus(status);
}

// The status code whose name (absl::StatusCodeToString, what muonshard.Error
// .code holds) is `name`; INVALID_ARGUMENT for no code's name.
absl::StatusOr<absl::StatusCode> StatusCodeNamed(const std::string& name);

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) RaiseStatus(value.status());
  return *std::move(value);
}

}  // namespace muonshard::python

#endif  // MUONSHARD_PYTHON_SRC_STATUS_H_
