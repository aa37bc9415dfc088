"""A small OTLP/HTTP trace receiver for tests: a real HTTP server on 127.0.0.1 that decodes
``ExportTraceServiceRequest`` protobuf bodies posted to ``/v1/traces`` and keeps the spans.

Used as a context manager; its thread and socket are stopped on exit::

    with OtlpReceiver() as receiver:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        ...
        spans = receiver.wait_for(lambda spans: ..., seconds=30)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any] = field(default_factory=dict)
    status_code: int = 0


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        status_code=span.status.code,
                    )
                )
    return spans


class OtlpReceiver:
    """Collects the spans exporters send it (``endpoint`` is the OTLP base URL)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                spans = decode(body)
                with receiver._arrived:
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                    receiver._arrived.notify_all()
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def received(self) -> list[ReceivedSpan]:
        with self._arrived:
            return list(self.spans)

    def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], seconds: float
    ) -> list[ReceivedSpan]:
        """The spans received once ``done(spans)`` holds; fails after ``seconds``."""
        with self._arrived:
            if self._arrived.wait_for(lambda: done(list(self.spans)), seconds):
                return list(self.spans)
            raise AssertionError(f"spans received: {[s.name for s in self.spans]}")
