"""Exceptions raised by ckpt. Each carries the message of the component that
failed (ckptd's, when the daemon refused or failed) and the status code name.

Every class derives from ckpt.Error, and also from the built-in exception a
Python caller would catch for that kind of failure (ValueError, LookupError,
ConnectionError, TimeoutError, PermissionError)."""


class Error(RuntimeError):
    """A ckpt operation failed; `message` says what and why."""

    def __init__(self, message, code="UNKNOWN"):
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self):
        return self.message


class InvalidArgumentError(Error, ValueError):
    """Bad input: a name, dtype, shape, tier or option."""


class NotFoundError(Error, LookupError):
    """A job, step, item or file that does not exist."""


class AlreadyExistsError(Error):
    """A name registered twice, or a step saved twice."""


class FailedPreconditionError(Error):
    """The operation does not fit the current state (e.g. a closed
    checkpointer, a tensor saved with another shape)."""


class UnavailableError(Error, ConnectionError):
    """ckptd cannot be reached (not running, wrong socket, gone)."""


class DeadlineExceededError(Error, TimeoutError):
    """A wait or a call to ckptd ran out of time."""


class ResourceExhaustedError(Error):
    """No staging memory for a save, or a message over its size limit."""


class DataLossError(Error):
    """Checkpoint bytes failed their checksums on every tier."""


class PermissionDeniedError(Error, PermissionError):
    """ckptd refused the caller (another uid)."""


class AbortedError(Error):
    """The operation was cancelled or aborted (e.g. a save given up)."""


__all__ = [
    "Error", "InvalidArgumentError", "NotFoundError", "AlreadyExistsError",
    "FailedPreconditionError", "UnavailableError", "DeadlineExceededError",
    "ResourceExhaustedError", "DataLossError", "PermissionDeniedError",
    "AbortedError"
]
