"""Exceptions raised by muonshard, one class per status code.

Every error the C++ layer returns arrives as a subclass of `Error` (with the
status code's name in `.code` and the C++ message unchanged) that is also the
built-in exception a Python user would catch:

    INVALID_ARGUMENT                     ValueError
    NOT_FOUND                            LookupError
    DEADLINE_EXCEEDED                    TimeoutError
    UNAVAILABLE                          ConnectionError
    UNAUTHENTICATED, PERMISSION_DENIED   PermissionError
    anything else                        RuntimeError
"""


class Error(Exception):
    """Base of every muonshard error; `code` is the status code's name."""

    code = "UNKNOWN"

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self):
        return self.args[0] if self.args else ""


class InvalidArgumentError(Error, ValueError):
    code = "INVALID_ARGUMENT"


class NotFoundError(Error, LookupError):
    code = "NOT_FOUND"


class DeadlineExceededError(Error, TimeoutError):
    code = "DEADLINE_EXCEEDED"


class UnavailableError(Error, ConnectionError):
    code = "UNAVAILABLE"


class PermissionDeniedError(Error, PermissionError):
    code = "PERMISSION_DENIED"


class UnauthenticatedError(PermissionDeniedError):
    code = "UNAUTHENTICATED"


class FailedPreconditionError(Error, RuntimeError):
    code = "FAILED_PRECONDITION"


class AbortedError(Error, RuntimeError):
    code = "ABORTED"


class StatusError(Error, RuntimeError):
    """Every other code (INTERNAL, DATA_LOSS, RESOURCE_EXHAUSTED, ...)."""


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        DeadlineExceededError,
        UnavailableError,
        PermissionDeniedError,
        UnauthenticatedError,
        FailedPreconditionError,
        AbortedError,
    )
}


def from_status(code, message):
    """The exception for a status code name and message."""
    cls = _BY_CODE.get(code, StatusError)
    return cls(message, code)
