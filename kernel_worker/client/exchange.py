"""The exchange with a worker, without I/O: what the client sends and how it reads answers.

The execute request as sent (the envelope, one file part per input, its HTTP timeout and
its deadline), the cancel and job-poll paths, and each answer as read: a ``200``'s bundle
(its protocol headers checked), a ``202``'s job URL (kept on the worker), a job poll's
pending, failed or finished job, ``/health``. A refusal becomes the :class:`ClientError` it
means, and httpx's exceptions are translated into the client's in one place
(:func:`translated`).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import httpx

from .errors import CellTimeout, ClientError, ProtocolError, RequestFailed, WorkerUnreachable
from .values import InputPart

__all__ = [
    "EXECUTE_PATH",
    "Request",
    "base_url",
    "build_request",
    "cancel_path",
    "detail_of",
    "headers_for",
    "past_deadline",
    "poll_delays",
    "read_answer",
    "read_health",
    "read_poll",
    "translated",
]

EXECUTE_PATH = "/v1/execute"
_PROTOCOL = "v1"
_NOTEBOOK_PROTOCOL = "notebook-cell-v1"
_TRANSFORM_REF = "notebook_cell@v1"
_PENDING_STATES = frozenset({"queued", "provisioning", "starting", "running"})


@dataclass(frozen=True, slots=True)
class Request:
    """One execute request, ready to send."""

    build_id: str
    files: list[tuple[str, tuple[str, bytes, str]]]
    http_timeout_seconds: float
    deadline: float  # monotonic: give up (and cancel) if no bundle by then


def build_request(
    source: str,
    parts: list[InputPart],
    *,
    timeout_seconds: float,
    env: Mapping[str, str] | None,
    queue_timeout_seconds: float,
) -> Request:
    """The execute request for ``source`` with ``parts`` (the encoded inputs)."""
    build_id = f"client-{uuid.uuid4().hex[:16]}"
    envelope = {
        "protocol_version": _PROTOCOL,
        "build_id": build_id,
        "transform": {
            "ref": _TRANSFORM_REF,
            "params": {
                "source": source,
                "timeout_seconds": timeout_seconds,
                "env": dict(env or {}),
            },
        },
        "inputs": [part.descriptor for part in parts],
    }
    files = [("metadata", ("metadata.json", json.dumps(envelope).encode(), "application/json"))]
    files += [(p.file_name, (p.file_name, p.data, "application/octet-stream")) for p in parts]
    return Request(
        build_id=build_id,
        files=files,
        # As Strata's client: the cell's time plus slack, never under 30 s without a byte.
        http_timeout_seconds=max(timeout_seconds + 5.0, 30.0),
        deadline=time.monotonic() + queue_timeout_seconds + timeout_seconds + 5.0,
    )


def base_url(url: str) -> httpx.URL:
    """The worker's root URL, from either it or the full ``…/v1/execute`` URL Strata uses."""
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"not an http(s) URL: {url!r}")
    path = parsed.path.rstrip("/")
    for suffix in (EXECUTE_PATH, "/v1/notebook-execute"):
        path = path.removesuffix(suffix)
    return parsed.copy_with(path=path + "/", query=None, fragment=None)


def headers_for(token: str | None) -> dict[str, str]:
    headers = {"x-strata-executor-protocol": _PROTOCOL}
    if token:
        headers["authorization"] = f"Bearer {token}"
    return headers


def detail_of(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("detail", "error"):
            if body.get(key):
                value = body[key]
                return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(body)[:500]


def _failure(status_code: int, detail: str) -> ClientError:
    if status_code in (408, 504):
        return CellTimeout(status_code, detail)
    return RequestFailed(status_code, detail)


def _bundle_of(response: httpx.Response) -> bytes:
    """The bundle bytes of a 200 answer, after the protocol headers are checked."""
    for header, expected in (
        ("x-strata-executor-protocol", _PROTOCOL),
        ("x-strata-notebook-executor-protocol", _NOTEBOOK_PROTOCOL),
    ):
        sent = response.headers.get(header)
        if sent is not None and sent != expected:
            raise ProtocolError(f"the worker speaks {header} {sent!r}, not {expected!r}")
    return response.content


def _job_url(response: httpx.Response, base: httpx.URL) -> httpx.URL:
    """The job URL of a 202 answer; it must stay on the worker (the token goes with it)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    raw = body.get("job_url") if isinstance(body, dict) else None
    if not isinstance(raw, str) or not raw:
        raise ProtocolError("a 202 answer without a job_url")
    url = base.join(raw)
    if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
        raise ProtocolError(f"the job URL {raw!r} points away from the worker")
    return url


def read_answer(response: httpx.Response, base: httpx.URL) -> bytes | httpx.URL:
    """The bundle of a 200, the job URL of a 202; anything else raises."""
    if response.status_code == 200:
        return _bundle_of(response)
    if response.status_code == 202:
        return _job_url(response, base)
    raise _failure(response.status_code, detail_of(response))


def read_poll(response: httpx.Response) -> bytes | None:
    """A job poll's bundle; None while the job is pending; a failed job raises."""
    if response.status_code != 200:
        raise _failure(response.status_code, detail_of(response))
    if not response.headers.get("content-type", "").startswith("application/json"):
        return _bundle_of(response)
    body = response.json()
    state = body.get("state") if isinstance(body, dict) else None
    if state in _PENDING_STATES:
        return None
    if state == "failed":
        status = body.get("status_code")
        raise _failure(status if isinstance(status, int) else 502, detail_of(response))
    raise ProtocolError(f"a job poll answered state {state!r} without a bundle")


def poll_delays(deadline: float) -> Iterator[float]:
    """Seconds to wait before each job poll (quick at first, then 1 s) until *deadline*."""
    delay = 0.05
    while time.monotonic() + delay <= deadline:
        yield delay
        delay = min(delay * 2, 1.0)


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """httpx's exceptions as the client's: the one place they are translated."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise CellTimeout(None, f"{what}: no answer from the worker in time") from exc
    except httpx.HTTPError as exc:
        raise WorkerUnreachable(f"{what}: {exc}") from exc


def past_deadline() -> CellTimeout:
    return CellTimeout(None, "no result by the client's deadline; the cell was cancelled")


def cancel_path(request: Request) -> str:
    return f"v1/executions/{request.build_id}/cancel"


def read_health(response: httpx.Response) -> dict[str, object]:
    """``/health``'s JSON object (a ``503`` too: it says why the worker is unhealthy)."""
    if response.status_code not in (200, 503):
        raise RequestFailed(response.status_code, detail_of(response))
    try:
        body = response.json()
    except ValueError as exc:
        raise ProtocolError("/health did not answer JSON") from exc
    if not isinstance(body, dict):
        raise ProtocolError("/health did not answer a JSON object")
    return body
