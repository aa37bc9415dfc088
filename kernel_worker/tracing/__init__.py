"""Traces of cell requests that continue the dispatcher's (W3C trace context, OTLP).

Tracing is on when the ``otel`` extra is installed (opentelemetry-sdk and the OTLP/HTTP
exporter), ``OTEL_SDK_DISABLED`` is not ``true``, ``OTEL_TRACES_EXPORTER`` is not ``none``
and an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT``). The other standard ``OTEL_*`` variables (service name,
resource attributes, headers, sampler, batch sizes, propagators) apply as the SDK reads them.

Otherwise the worker's :class:`Tracing` is :data:`OFF`: each call returns a shared object
that does nothing, and no module of opentelemetry is imported.

The spans of one request (names are stable; see docs/operations.md)::

    worker.execute            the request; parent: the caller's ``traceparent``
      worker.inputs           the inputs received and staged (push) or downloaded (pull)
      worker.environment      the notebook's locked environment found or built
      worker.mounts           remote mounts fetched
      worker.lease            waiting in the queue for a kernel, until it is leased
      worker.run_cell         the cell on its kernel
      worker.bundle           the bundle planned and written
      worker.upload           the bundle uploaded and the build finalized (pull)

``worker.execute`` carries ``build_id`` (and, from a manifest, ``notebook_id`` and
``cell_id``), the kernel that ran the cell (``worker.kernel.*``), ``worker.outcome`` and
the HTTP status; the request's JSON log lines carry its ``trace_id``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import TracebackType

__all__ = [
    "OFF",
    "TRACE_CONTEXT_KEYS",
    "Attributes",
    "Span",
    "Tracing",
    "Value",
    "from_environ",
    "trace_context",
]

log = logging.getLogger(__name__)

Value = str | int | float | bool
Attributes = Mapping[str, Value | None]
"""Span attributes; a ``None`` value is left unset."""
TRACE_CONTEXT_KEYS = ("traceparent", "tracestate")
"""What carries a trace from the dispatcher: request headers, or a manifest's metadata."""


class Span:
    """A span being recorded; this one, tracing's off state, records nothing."""

    __slots__ = ()

    def set(self, key: str, value: Value | None) -> None:
        """Set attribute ``key`` (``None`` leaves it unset)."""

    def end(self) -> None:
        """End a span begun with :meth:`Tracing.begin` (a second call does nothing)."""


class _Nothing(AbstractContextManager[Span]):
    """A context manager that yields :data:`_NO_SPAN` and does nothing else (reusable)."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return _NO_SPAN

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


_NO_SPAN = Span()
_NOTHING = _Nothing()


class Tracing:
    """Where a request's spans go; this one, tracing off, keeps none."""

    __slots__ = ()

    enabled = False

    def request(
        self, carrier: Mapping[str, str], attributes: Attributes
    ) -> AbstractContextManager[Span]:
        """The ``worker.execute`` span of a request, parented to ``carrier``'s trace context
        (a new trace without one); current (and its trace id in the log lines) inside."""
        return _NOTHING

    def step(self, name: str) -> AbstractContextManager[Span]:
        """A child span of the current one, current inside; an error ends it as failed."""
        return _NOTHING

    def begin(self, name: str) -> Span:
        """A child span of the current one that its caller ends (not made current)."""
        return _NO_SPAN

    def annotate(self, attributes: Attributes) -> None:
        """Set ``attributes`` on this request's ``worker.execute`` span, while it lasts."""

    def shutdown(self) -> None:
        """Send what is still buffered and stop (blocking: call it in a thread)."""


OFF = Tracing()
"""Tracing off: every call is a no-op."""


def trace_context(
    headers: Mapping[str, str], metadata: Mapping[str, object] | None = None
) -> dict[str, str]:
    """The caller's W3C trace context: from the headers when they carry a ``traceparent``
    (a dispatcher in between sends its own, nearer span), else from a manifest's
    ``metadata`` (the orchestrator's copy)."""
    if headers.get("traceparent"):
        return {key: headers[key] for key in TRACE_CONTEXT_KEYS if headers.get(key)}
    if metadata is None:
        return {}
    found = {key: metadata.get(key) for key in TRACE_CONTEXT_KEYS}
    return {key: value for key, value in found.items() if isinstance(value, str) and value}


_ON = ("otlp",)


def from_environ(environ: Mapping[str, str], *, version: str, worker_id: str) -> Tracing:
    """The worker's tracing as the ``OTEL_*`` variables and the installed extra say (see
    the module); :data:`OFF` when any of them says no."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return OFF
    endpoint = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )
    exporter = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if not endpoint or exporter == "none":
        return OFF
    if exporter not in _ON:
        log.warning("OTEL_TRACES_EXPORTER=%s: only otlp is supported; no traces", exporter)
        return OFF
    try:
        from .otel import OtelTracing
    except ImportError:
        log.warning(
            "an OTLP endpoint is set but the otel extra is not installed "
            "(pip install 'strata-kernel-worker[otel]'): no traces"
        )
        return OFF
    return OtelTracing.from_environ(environ, version=version, worker_id=worker_id)
