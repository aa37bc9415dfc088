"""Probes beside a costly kernel: ``python -m bench.mappings``.

A worker with two kernels is started alone on 127.0.0.1. Eight threads ask ``/health``
back to back (each on a connection of its own) while this process sends a trivial cell
(``x = 1``) one after another, twice: before, and after a cell has left 60,000 memory
mappings in one kernel (made through libc, so that no Python object holds them and they
survive the reset; reading that kernel's ``smaps_rollup`` walks every one of them). It
prints, side by side, the cells' p50 and the probes' p50, p99 and max, and writes
``bench/results/mappings.json``.

Goal: the cells keep their p50, and ``/health`` answers in under 20 ms, with the mappings
there. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from .processes import ROOT, free_port, our_worker_argv

MAPPINGS = (
    "import ctypes\n"
    "libc = ctypes.CDLL(None)\n"
    "libc.mmap.restype = ctypes.c_void_p\n"
    "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,"
    " ctypes.c_int, ctypes.c_long]\n"
    "for i in range(60000):\n"
    "    libc.mmap(None, 4096, 1 if i % 2 else 3, 0x22, -1, 0)\n"
    "maps = sum(1 for _ in open('/proc/self/maps'))\n"
)
PROBES = 8
RESULTS = ROOT / "bench" / "results" / "mappings.json"


def _cell(client: httpx.Client, source: str) -> float:
    params = {"source": source, "timeout_seconds": 120}
    metadata = {"protocol_version": "v1", "inputs": [],
                "transform": {"ref": "notebook_cell@v1", "params": params}}  # fmt: skip
    files = {"metadata": ("metadata.json", json.dumps(metadata), "application/json")}
    started = time.perf_counter()
    answer = client.post("/v1/execute", files=files)
    seconds = time.perf_counter() - started
    if answer.status_code != 200:
        raise RuntimeError(f"the cell answered {answer.status_code}: {answer.text[:200]}")
    return seconds


def _phase(url: str, cells: int) -> dict[str, Any]:
    """``cells`` trivial cells in a row while eight threads ask ``/health``."""
    stop = threading.Event()
    latencies: list[float] = []
    lock = threading.Lock()

    def probe() -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            while not stop.is_set():
                started = time.perf_counter()
                client.get("/health")
                with lock:
                    latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=probe, daemon=True) for _ in range(PROBES)]
    for thread in threads:
        thread.start()
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            times = [_cell(client, "x = 1") for _ in range(cells)]
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    ordered = sorted(latencies)
    return {
        "cell_p50_ms": round(statistics.median(times) * 1000, 2),
        "health_p50_ms": round(statistics.median(ordered) * 1000, 2),
        "health_p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2),
        "health_max_ms": round(ordered[-1] * 1000, 2),
        "health_asked": len(ordered),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=100, help="trivial cells per phase")
    args = parser.parse_args(argv)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="skw-bench-mappings-") as runs:
        argv_ = our_worker_argv(port, kernels=2, recycle="reset", run_dir=Path(runs))
        proc = _popen(argv_)
        try:
            _wait_ready(url)
            before = _phase(url, args.cells)
            with httpx.Client(base_url=url, timeout=120) as client:
                _cell(client, MAPPINGS)
            after = _phase(url, args.cells)
        finally:
            proc.terminate()
            proc.wait(60)
    result = {"probes": PROBES, "cells": args.cells, "before": before, "with_mappings": after}
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"{'':24}{'no mappings':>14}{'60k mappings':>14}")
    for key in ("cell_p50_ms", "health_p50_ms", "health_p99_ms", "health_max_ms"):
        print(f"{key:24}{before[key]:>14}{after[key]:>14}")


def _popen(argv: list[str]) -> Any:
    import subprocess

    return subprocess.Popen(
        argv, cwd=ROOT, env={**os.environ, "STRATA_KERNEL_WORKER_ENV_WARM_UP": "off"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _wait_ready(url: str, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the worker did not become ready")


if __name__ == "__main__":
    main()
