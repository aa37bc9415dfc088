"""Warm reuse across the libraries notebooks import (``bench/library_matrix.py``).

Each library's cell runs twice on a worker with one kernel, over HTTP: the second run must
find the same kernel (no retirement, ``/health`` counts none) and the same module object
(the import stayed warm). The cells start what these libraries start: tqdm's monitor
thread, dask's thread pool, joblib's worker processes and resource tracker, matplotlib's
backends, widgets and rich displays.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from bench.library_matrix import LIBRARIES, Library
from tests.conftest import WorkerProcess, start_worker
from tests.wire import run_ok


@pytest.fixture(scope="module")
def one_kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = start_worker(tmp_path_factory, "--pool-size", "1", capture_logs=True)
    yield w
    w.stop()


def _retirements(client: httpx.Client) -> dict[str, int]:
    return dict(client.get("/health").json()["pool"]["retirements"])


def _run(client: httpx.Client, library: Library) -> tuple[int, int]:
    bundle = run_ok(client, library.cell, timeout_seconds=120)
    return bundle.variables["pid"]["preview"], bundle.variables["warm"]["preview"]


@pytest.mark.parametrize("library", LIBRARIES, ids=[lib.name for lib in LIBRARIES])
def test_a_library_stays_warm_and_keeps_its_kernel(
    one_kernel: WorkerProcess, library: Library
) -> None:
    assert library.installed(), f"{library.module} is missing: install the dev extra"
    with httpx.Client(base_url=one_kernel.url, timeout=180) as client:
        before = _retirements(client)
        first = _run(client, library)
        second = _run(client, library)
        after = _retirements(client)
    assert second[0] == first[0], f"{library.name} retired its kernel: {one_kernel.logs()}"
    assert second[1] == first[1], f"{library.name} was imported again"
    assert after == before, one_kernel.logs()
