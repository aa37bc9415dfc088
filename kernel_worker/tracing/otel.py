"""Tracing on: spans recorded by opentelemetry-sdk and sent by its OTLP exporter.

Imported only when tracing is on (see :func:`kernel_worker.tracing.from_environ`); an
ImportError here means the ``otel`` extra is missing. The worker's tracer provider is its
own (the process-wide one is left alone); the propagators are the configured ones
(``OTEL_PROPAGATORS``, W3C trace context by default).

Failures are data here too: a span that ends by an exception is marked as an error with
the exception's type only (its message may hold a cell's data, a traceback paths), and a
``worker.outcome`` the code set is kept.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from opentelemetry import propagate
from opentelemetry import trace as api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from .. import logs
from . import OFF, Span, Tracing, Value

log = logging.getLogger(__name__)

SERVICE_NAME = "strata-kernel-worker"
_EXPORTERS = {
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
}


class OtelSpan(Span):
    """An SDK span behind the worker's :class:`Span` interface."""

    __slots__ = ("_span",)

    def __init__(self, span: api.Span) -> None:
        self._span = span

    def set(self, key: str, value: Value | None) -> None:
        if value is not None and self._span.is_recording():  # an ended span takes nothing
            self._span.set_attribute(key, value)

    def end(self) -> None:
        if self._span.is_recording():
            self._span.end()

    def failed(self, exc: BaseException) -> None:
        """Mark the span as ended by ``exc`` (its type only)."""
        if not self._span.is_recording():
            return
        kind = type(exc).__name__
        self._span.set_attribute("error.type", kind)
        self._span.set_status(Status(StatusCode.ERROR, kind))


_request_span: ContextVar[OtelSpan | None] = ContextVar("worker_request_span", default=None)
"""The request's ``worker.execute`` span (a job's task inherits it)."""


class OtelTracing(Tracing):
    """Spans of the worker's own provider; exported in batches in the background."""

    __slots__ = ("_provider", "_tracer")

    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("kernel_worker")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], *, version: str, worker_id: str) -> Tracing:
        exporter = _exporter(environ)
        if exporter is None:
            return OFF
        attributes: dict[str, str] = {"service.version": version, "service.instance.id": worker_id}
        if not environ.get("OTEL_SERVICE_NAME", "").strip():  # else the SDK's reading wins
            attributes["service.name"] = SERVICE_NAME
        provider = TracerProvider(resource=Resource.create(attributes))
        provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider)

    @contextlib.contextmanager
    def request(
        self, carrier: Mapping[str, str], attributes: Mapping[str, Value | None]
    ) -> Iterator[Span]:
        parent = propagate.extract(carrier)
        given = {k: v for k, v in attributes.items() if v is not None}
        with self._tracer.start_as_current_span(
            "worker.execute",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=given,
            record_exception=False,
            set_status_on_exception=False,
        ) as raw:
            span = OtelSpan(raw)
            ids = raw.get_span_context()
            logs.trace_id.set(api.format_trace_id(ids.trace_id))  # the middleware resets it
            token = _request_span.set(span)
            try:
                yield span
            except BaseException as exc:
                span.failed(exc)
                raise
            finally:
                _request_span.reset(token)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[Span]:
        with self._tracer.start_as_current_span(
            name, record_exception=False, set_status_on_exception=False
        ) as raw:
            span = OtelSpan(raw)
            try:
                yield span
            except BaseException as exc:
                span.failed(exc)
                raise

    def begin(self, name: str) -> Span:
        return OtelSpan(self._tracer.start_span(name))

    def annotate(self, attributes: Mapping[str, Value | None]) -> None:
        span = _request_span.get()
        if span is not None:
            for key, value in attributes.items():
                span.set(key, value)

    def shutdown(self) -> None:
        self._provider.shutdown()


def _endpoint(environ: Mapping[str, str], protocol: str) -> str:
    """The traces endpoint: the traces variable as given, else the base one plus the
    signal's path (over HTTP)."""
    traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return base.rstrip("/") + "/v1/traces" if protocol == "http/protobuf" else base


def _exporter(environ: Mapping[str, str]) -> SpanExporter | None:
    """The OTLP exporter the protocol variables name (http/protobuf unless told grpc)."""
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        or "http/protobuf"
    )
    module = _EXPORTERS.get(protocol)
    if module is None:
        log.warning("OTLP protocol %s is not supported (use http/protobuf): no traces", protocol)
        return None
    try:
        exporters: Any = importlib.import_module(module)
    except ImportError:  # grpc: not in the extra (opentelemetry-exporter-otlp-proto-grpc)
        log.warning("OTLP over %s needs %s installed: no traces", protocol, module)
        return None
    # the endpoint as decided on (headers, timeout, compression: the OTEL_* variables)
    exporter: SpanExporter = exporters.OTLPSpanExporter(endpoint=_endpoint(environ, protocol))
    return exporter
