"""The worker's exception tree and the one table that turns it into HTTP answers.

::

    WorkerError (.detail: str)          status
    ├── BadRequest                      400
    │   └── Unprocessable               422 (the mount cache probe's body)
    ├── Unauthorized                    401
    ├── NotFound                        404
    ├── PayloadTooLarge                 413
    ├── Cancelled                       409
    ├── CellTimedOut                    408 (504 when the caller asks for it)
    ├── BodyStalled                     408 (an upload that stopped sending)
    ├── KernelCrashed                   502
    ├── UpstreamFailed                  502
    ├── WorkerBusy (.retry_after_seconds) 503 + Retry-After
    ├── EnvironmentFailed               500 (a locked environment's spec or build)
    ├── LanguageUnavailable             500 (a cell language this worker cannot run now)
    └── InsufficientStorage             507

Domain code raises these; only :func:`error_response` chooses a status and a body, and
nothing below the route layer raises ``HTTPException``. :func:`storage_checked` is where a
full disk (a foreign ``OSError``) becomes :class:`InsufficientStorage`.

``detail`` is shown to whoever sent the request, so callers pass clean, human-readable
text: never a file path, a hostname of ours, a traceback or an exception's ``repr`` that
may carry one (log those under an error id instead). This module does not scrub text;
it trusts the caller to have written it that way.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

from starlette.responses import JSONResponse

__all__ = [
    "BadRequest",
    "BodyStalled",
    "Cancelled",
    "CellTimedOut",
    "EnvironmentFailed",
    "InsufficientStorage",
    "KernelCrashed",
    "LanguageUnavailable",
    "NotFound",
    "PayloadTooLarge",
    "Unauthorized",
    "Unprocessable",
    "UpstreamFailed",
    "WorkerBusy",
    "WorkerError",
    "error_response",
    "status_for",
    "storage_checked",
]


class WorkerError(Exception):
    """Root of every error the worker answers a request with.

    Args:
        detail: Clean, user-facing text (no paths, no tracebacks).
    """

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class BadRequest(WorkerError):
    """The request is malformed: envelope, descriptor, form framing, missing upload."""


class Unprocessable(BadRequest):
    """Well-formed JSON of the wrong shape, where the reference's validation answers 422
    (the mount cache probe)."""


class Unauthorized(WorkerError):
    """The bearer-token gate refused the request."""


class NotFound(WorkerError):
    """The thing asked for (a job, typically) does not exist or has expired."""


class PayloadTooLarge(WorkerError):
    """An input (or the metadata part) is larger than the configured cap."""


class Cancelled(WorkerError):
    """The execution was cancelled (cancel route or client disconnect); its kernel retired."""


class CellTimedOut(WorkerError):
    """The cell ran past its ``timeout_seconds``."""


class BodyStalled(WorkerError):
    """A request body sent nothing for longer than the worker waits (``--body-timeout``)."""


class KernelCrashed(WorkerError):
    """The kernel died or stopped answering before the cell produced a result."""


class UpstreamFailed(WorkerError):
    """A pull-model transfer (input download, bundle upload, finalize), or a peer asked
    for a job (``--peers``), failed."""


class WorkerBusy(WorkerError):
    """Every execution slot is taken and the queue is full.

    Args:
        detail: Clean, user-facing text.
        retry_after_seconds: Sent as the ``Retry-After`` header.
    """

    def __init__(self, detail: str, *, retry_after_seconds: int = 5) -> None:
        super().__init__(detail)
        self.retry_after_seconds = retry_after_seconds


class EnvironmentFailed(WorkerError):
    """The cell's locked environment is malformed, or could not be built or started; the
    detail starts ``locked environment:`` as the reference's does."""

    def __init__(self, message: str) -> None:
        super().__init__(f"locked environment: {message}")


class LanguageUnavailable(WorkerError):
    """The cell's language is one the worker knows but cannot run here (R without R, or
    turned off): the reference's 500, with its words."""


class InsufficientStorage(WorkerError):
    """The worker's run directory filesystem is full (or over quota): nothing was run."""


_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})


@contextmanager
def storage_checked(what: str) -> Iterator[None]:
    """Turn a full disk while writing *what* (e.g. "this request's inputs") into
    :class:`InsufficientStorage`; any other ``OSError`` propagates as it is."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _NO_ROOM:
            raise
        raise InsufficientStorage(
            f"The worker has no room left on its run directory's filesystem for {what}"
        ) from exc


# The one status table, most specific first. CellTimedOut's entry is the default;
# see status_for.
_STATUS: Mapping[type[WorkerError], int] = MappingProxyType(
    {
        Unprocessable: 422,
        BadRequest: 400,
        Unauthorized: 401,
        NotFound: 404,
        PayloadTooLarge: 413,
        Cancelled: 409,
        CellTimedOut: 408,
        BodyStalled: 408,
        KernelCrashed: 502,
        UpstreamFailed: 502,
        WorkerBusy: 503,
        InsufficientStorage: 507,
        WorkerError: 500,
    }
)
# The real client treats exactly 408 as a timeout; 504 is the seed page's code.
_TIMEOUT_STATUSES = frozenset({408, 504})
# Statuses whose body also carries the reference's ``{"success": false, "error": ...}``
# result shape (it answers timeouts and dead cell processes that way); the client reads
# ``detail``, then ``error``, so both keys name the same text. A 500 is the reference's
# locked-environment failure.
_RESULT_SHAPED = frozenset({408, 409, 500, 502, 503, 504})


def status_for(exc: WorkerError, *, timeout_status: int = 408) -> int:
    """The HTTP status for *exc*, looked up by its nearest class in the table.

    Raises:
        ValueError: *timeout_status* is neither 408 nor 504.
    """
    if timeout_status not in _TIMEOUT_STATUSES:
        raise ValueError(f"timeout_status must be 408 or 504, not {timeout_status}")
    if isinstance(exc, CellTimedOut):
        return timeout_status
    # Most specific classes come first; WorkerError, last, catches the rest.
    return next(status for cls, status in _STATUS.items() if isinstance(exc, cls))


def error_response(exc: WorkerError, *, timeout_status: int = 408) -> JSONResponse:
    """The JSON answer for *exc*: ``{"detail": ...}``, plus the result shape and headers.

    ``timeout_status`` chooses the status of :class:`CellTimedOut` (408 or 504).
    """
    status = status_for(exc, timeout_status=timeout_status)
    body: dict[str, object] = {"detail": exc.detail}
    if status in _RESULT_SHAPED:
        body["success"] = False
        body["error"] = exc.detail
    headers: dict[str, str] = {}
    if isinstance(exc, WorkerBusy):
        headers["Retry-After"] = str(max(0, exc.retry_after_seconds))
    return JSONResponse(status_code=status, content=body, headers=headers or None)
