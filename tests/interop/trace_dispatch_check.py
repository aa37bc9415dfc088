"""Run cells on a worker through the real Strata client with its tracing on.

Run it with the interpreter that has ``strata-notebook[notebook,otel]`` installed::

    python trace_dispatch_check.py EXECUTE_URL OTLP_ENDPOINT

The client's own tracing starts as its server starts it (``init_tracing``), with no endpoint
of its own: it would export over OTLP/gRPC, and the test's receiver speaks OTLP/HTTP, so an
OTLP/HTTP exporter to ``OTLP_ENDPOINT`` is added to the provider it set up. Then the cells go
through ``CellExecutor.execute_cell`` exactly as in ``client_dispatch_check.py``: the client
opens its ``notebook.dispatch`` span and sends its trace context with each request.

Prints one JSON line on stdout: ``{"tracing": bool, "cells": {cell_id: {"success": ...}}}``.
Exit status: 0 every cell ran; 1 otherwise; 2 usage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from client_dispatch_check import CheckingExecutor, open_notebook
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from strata.observability.tracing import init_tracing

CELLS = ["simple", "error"]


async def run(session: object) -> dict[str, dict[str, object]]:
    executor = CheckingExecutor(session)  # type: ignore[arg-type]
    from client_dispatch_check import CELLS as ALL

    done: dict[str, dict[str, object]] = {}
    for _, cell_id, source in ALL:
        if cell_id in CELLS:
            result = await executor.execute_cell(cell_id, source)
            done[cell_id] = {"success": result.success, "method": result.execution_method}
    return done


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    execute_url, endpoint = argv
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    logging.disable(logging.INFO)
    tracing = init_tracing()  # the client's own set-up
    provider = trace.get_tracer_provider()
    if tracing and isinstance(provider, TracerProvider):
        exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tempfile.TemporaryDirectory(prefix="skw-trace-interop-") as tmp:
        session = open_notebook(Path(tmp), execute_url)
        cells = asyncio.run(run(session))
    if isinstance(provider, TracerProvider):
        provider.force_flush()
    print(json.dumps({"tracing": tracing, "cells": cells}))
    return 0 if tracing and len(cells) == len(CELLS) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
