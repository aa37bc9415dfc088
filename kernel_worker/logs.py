"""Logging: one request id through every line of a request, text or JSON lines.

Logs carry ids, sizes, statuses and timings — never cell source or values (at any level
above DEBUG).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

request_id: ContextVar[str] = ContextVar("request_id", default="-")
trace_id: ContextVar[str | None] = ContextVar("trace_id", default=None)
"""The request's trace (hex), when tracing is on: its JSON log lines carry it."""
PROBE_PATHS = frozenset({"/ready", "/health"})
"""Probes a load balancer sends every few seconds: out of the access log unless kept."""
_VALID_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
access_log = logging.getLogger("kernel_worker.access")
_log = logging.getLogger("kernel_worker")


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        record.trace_id = trace_id.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        trace = getattr(record, "trace_id", None)
        if trace is not None:
            entry["trace_id"] = trace
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(level: str, fmt: str = "text") -> None:
    """Install the root handler once (the CLI calls this; an embedding host may not)."""
    handler = logging.StreamHandler()
    handler.addFilter(_RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.captureWarnings(True)  # Python's warnings as log lines (JSON lines stay JSON)


class RequestIdMiddleware:
    """Give every HTTP request an id (the caller's ``X-Request-Id`` if sane), log it, echo it.

    A ``GET``/``HEAD`` of one of ``quiet_paths`` that succeeds leaves no access-log line.
    """

    def __init__(self, app: ASGIApp, quiet_paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.quiet_paths = quiet_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        rid = sent if _VALID_ID.match(sent) else uuid.uuid4().hex
        token = request_id.set(rid)
        traced = trace_id.set(None)  # a traced route sets it, for every line after
        started = time.monotonic()
        status = 500
        answered = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status, answered = message["status"], True
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # a bug, not a bad request: logged once, under the request's id, which the
            # caller is given to quote (an answer under way can only be cut off)
            _log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if answered:
                raise
            body = json.dumps({"detail": f"Internal error (request id {rid})"}).encode()
            headers = [(b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode())]  # fmt: skip
            await send_with_id({"type": "http.response.start", "status": 500, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        finally:
            if not self._quiet(scope, status):
                access_log.info(
                    "%s %s %d %.1fms",
                    scope.get("method"),
                    scope.get("path"),
                    status,
                    (time.monotonic() - started) * 1000,
                )
            trace_id.reset(traced)
            request_id.reset(token)

    def _quiet(self, scope: Scope, status: int) -> bool:
        """A probe that succeeded: not worth a line (a failing one is)."""
        return (
            status < 400
            and scope.get("method") in ("GET", "HEAD")
            and scope.get("path") in self.quiet_paths
        )
