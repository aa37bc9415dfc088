"""What tracing costs a warm cell: ``python -m bench.tracing [--cells N] [--rounds R]``.

Three workers (one kernel each, started side by side, measured in interleaved rounds so that
drift hits them alike) take the same trivial cell (``x = 1``) with the same
``traceparent``/``tracestate`` headers Strata sends when its own tracing is on:

- ``extra absent``: the worker as installed without the ``otel`` extra (opentelemetry-sdk and
  its exporters made unimportable), ``OTEL_EXPORTER_OTLP_ENDPOINT`` set all the same;
- ``tracing off``: the extra installed, no endpoint set;
- ``tracing on``: the extra installed, spans exported in batches to an OTLP/HTTP sink on
  loopback (a thread of this process that answers 200 and drops the body).

Each cell is timed from the client (a plain ``http.client`` connection per request: the
benchmark's lean client). Results: ``bench/results/tracing.json`` and a table on stdout.
Nothing here asserts on time; every process it starts is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from .lean_client import post
from .processes import ROOT, ServerProcess, free_port, our_worker_argv, server_env
from .stats import summarize

RESULTS = ROOT / "bench" / "results"
TRACE_HEADERS = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "strata=1",
}
NO_EXTRA = """\
import sys


class NoOtelExtra:
    def find_spec(self, name, path=None, target=None):
        for blocked in ("opentelemetry.sdk", "opentelemetry.exporter"):
            if name == blocked or name.startswith(blocked + "."):
                raise ImportError(name + " is not installed (bench.tracing)")


sys.meta_path.insert(0, NoOtelExtra())
"""


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _write_blocker(folder: Path) -> None:
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(NO_EXTRA)


def _cell_request() -> tuple[bytes, str]:
    metadata = {
        "protocol_version": "v1",
        "transform": {"ref": "notebook_cell@v1", "params": {"source": "x = 1"}},
        "inputs": [],
    }
    parts = {"metadata": ("metadata.json", json.dumps(metadata).encode(), "application/json")}
    request = httpx.Request("POST", "http://127.0.0.1/v1/execute", files=parts)
    return request.read(), request.headers["content-type"]


def _time_cells(url: str, body: bytes, headers: dict[str, str], count: int) -> list[float]:
    samples: list[float] = []
    for _ in range(count):
        answer = post(url + "/v1/execute", body, headers, 60.0)
        if answer.status != 200:
            raise RuntimeError(f"{url} answered {answer.status}: {answer.content[:200]!r}")
        samples.append(answer.seconds)
    return samples


async def measure(cells: int, rounds: int, warmup: int) -> dict[str, Any]:
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    sink_thread = threading.Thread(target=sink.serve_forever, daemon=True)
    sink_thread.start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    workers: dict[str, ServerProcess] = {}
    with tempfile.TemporaryDirectory(prefix="skw-bench-tracing-") as tmp:
        blocker = Path(tmp, "no-extra")
        await asyncio.to_thread(_write_blocker, blocker)
        base = server_env(inline_matplotlib=True)
        base.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        envs = {
            "extra absent": {
                **base, "PYTHONPATH": str(blocker), "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            },
            "tracing off": base,
            "tracing on": {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint},
        }  # fmt: skip
        try:
            async with httpx.AsyncClient() as client:
                for name, env in envs.items():
                    port = free_port()
                    run_dir = Path(tmp, name.replace(" ", "-"))
                    await asyncio.to_thread(run_dir.mkdir)
                    argv = our_worker_argv(port, kernels=1, recycle="reset", run_dir=run_dir)
                    log_path = RESULTS / "logs" / f"tracing-{name.replace(' ', '-')}.log"
                    worker = workers[name] = ServerProcess(name, argv, port, log_path)
                    await worker.start(env, ROOT)
                    await worker.wait_healthy(client, 120)
            body, content_type = _cell_request()
            headers = {"content-type": content_type, **TRACE_HEADERS}
            samples: dict[str, list[float]] = {name: [] for name in workers}
            for worker in workers.values():
                await asyncio.to_thread(_time_cells, worker.url, body, headers, warmup)
            for _ in range(rounds):
                for name, worker in workers.items():
                    timed = await asyncio.to_thread(_time_cells, worker.url, body, headers, cells)
                    samples[name] += timed
        finally:
            for worker in workers.values():
                await worker.stop()
            sink.shutdown()
            sink.server_close()
    summaries = {name: summarize(values) for name, values in samples.items()}
    return {
        "cells_per_round": cells,
        "rounds": rounds,
        "series": {name: s.as_dict() for name, s in summaries.items() if s is not None},
    }


def _table(results: dict[str, Any]) -> str:
    series = results["series"]
    absent = series["extra absent"]["p50"]
    lines = ["| worker | p50 | p95 | vs extra absent (p50) |", "|---|---|---|---|"]
    for name, summary in series.items():
        ratio = summary["p50"] / absent if absent else float("nan")
        lines.append(
            f"| {name} | {summary['p50'] * 1000:.2f} ms | {summary['p95'] * 1000:.2f} ms "
            f"| {ratio:.3f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing", description=__doc__)
    parser.add_argument("--cells", type=int, default=100, help="cells per worker per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=20, help="untimed cells per worker first")
    args = parser.parse_args(argv)
    results = asyncio.run(measure(args.cells, args.rounds, args.warmup))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "tracing.json").write_text(json.dumps(results, indent=2) + "\n")
    print(_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
