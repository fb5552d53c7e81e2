"""Helpers of the pure-Python part of the package."""

from ._hisparse import InvalidArgumentError


def invalid(message: str) -> InvalidArgumentError:
    """An ``InvalidArgumentError`` with ``kind`` and ``message`` set, as the compiled module
    raises them."""
    error = InvalidArgumentError(message)
    error.kind, error.message = "invalid argument", message
    return error
