"""What :mod:`kernel_worker.client.session` raises::

ClientError
├── WorkerUnreachable     the worker could not be reached, or the connection broke
├── RequestFailed         a non-200 answer: status_code and the worker's detail
├── CellTimeout           408/504, or no answer by the client's own deadline
├── ProtocolError         the answer is not something this protocol allows
├── InputEncodingError    an input value could not be encoded
├── OutputDecodingError   an output was not serialized by the worker, or cannot be decoded
└── CellError             CellResult.raise_for_error() on a cell that raised
"""

from __future__ import annotations

from typing import Protocol

__all__ = [
    "CellError",
    "CellTimeout",
    "ClientError",
    "InputEncodingError",
    "OutputDecodingError",
    "ProtocolError",
    "RequestFailed",
    "WorkerUnreachable",
]


class ClientError(Exception):
    """Root of everything this client raises on purpose."""


class WorkerUnreachable(ClientError):
    """The worker could not be reached, or the connection broke mid-answer."""


class RequestFailed(ClientError):
    """The worker answered with a status other than 200 (or 202 then a failed job)."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"the worker answered {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class CellTimeout(ClientError):
    """The cell outran its timeout (status 408/504), or the client's deadline passed (None)."""

    def __init__(self, status_code: int | None, detail: str) -> None:
        super().__init__(detail if status_code is None else f"{status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class ProtocolError(ClientError):
    """The answer is not a bundle, a job URL or an error this protocol allows."""


class InputEncodingError(ClientError):
    """An input value could not be encoded (or its name is not a Python identifier)."""


class OutputDecodingError(ClientError):
    """An output was not serialized by the worker, or cannot be decoded here."""


class FailedCell(Protocol):
    """What :class:`CellError` reads of the failed cell's result (a ``CellResult``)."""

    @property
    def error_type(self) -> str | None: ...

    @property
    def error(self) -> str | None: ...


class CellError(ClientError):
    """The cell raised; ``result`` holds its console, error type, message and traceback."""

    def __init__(self, result: FailedCell) -> None:
        kind = result.error_type or "Error"
        super().__init__(f"the cell raised {kind}: {result.error or ''}")
        self.result = result
