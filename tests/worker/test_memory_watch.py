"""Kernel memory is measured in the background, never by a probe: ``/health`` and
``/metrics`` serve the last measurement, however costly a kernel makes reading it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from kernel_worker.memory_watch import DEFAULT_INTERVAL_SECONDS
from tests.conftest import WorkerProcess, start_worker
from tests.wire import run_ok

# 60k small mappings (the default vm.max_map_count is 65530), made through libc so that no Python object holds them: they survive
# the namespace reset, and reading the kernel's smaps_rollup walks every one of them
MAPPINGS = (
    "import ctypes\n"
    "libc = ctypes.CDLL(None)\n"
    "libc.mmap.restype = ctypes.c_void_p\n"
    "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,"
    " ctypes.c_int, ctypes.c_long]\n"
    "for i in range(60000):\n"
    "    # alternate protections so the kernel cannot merge neighbours into one mapping\n"
    "    libc.mmap(None, 4096, 1 if i % 2 else 3, 0x22, -1, 0)\n"
    "maps = sum(1 for _ in open('/proc/self/maps'))\n"
)


@pytest.fixture(scope="module")
def mapped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    worker = start_worker(tmp_path_factory, "--pool-size", "1")
    yield worker
    worker.stop()


def test_a_probe_serves_the_last_measurement(mapped: WorkerProcess) -> None:
    with httpx.Client(base_url=mapped.url, timeout=60) as client:
        first = _measured_memory(client)
        time.sleep(DEFAULT_INTERVAL_SECONDS / 4)  # time passing is the point: it ages
        second = client.get("/health").json()["pool"]["memory"]
    if second["measured_seconds_ago"] < first["measured_seconds_ago"]:
        pytest.skip("a measurement fell between the two probes")  # rare: the next run holds
    # the same measurement, older: the probe measured nothing itself
    assert second["measured_seconds_ago"] >= first["measured_seconds_ago"] + 0.4
    assert second["kernels"] == first["kernels"]


def test_a_kernel_with_many_mappings_is_still_measured_and_served(
    mapped: WorkerProcess,
) -> None:
    with httpx.Client(base_url=mapped.url, timeout=120) as client:
        bundle = run_ok(client, MAPPINGS)
        assert bundle.variables["maps"]["preview"] > 60000
        # probes answer while the mappings stay (they survive the reset)...
        for _ in range(20):
            assert client.get("/health").status_code == 200
        assert run_ok(client, "x = 1").manifest["success"]
        # ...and the background measurement still covers the kernel
        deadline = time.monotonic() + 10 * DEFAULT_INTERVAL_SECONDS
        while True:
            memory = client.get("/health").json()["pool"]["memory"]
            if memory["measured_seconds_ago"] < DEFAULT_INTERVAL_SECONDS and memory["kernels"]:
                break
            assert time.monotonic() < deadline, memory
            time.sleep(0.2)
        assert all(kernel["rss"] > 0 for kernel in memory["kernels"].values())
        assert "strata_kernel_worker_kernel_memory_bytes" in client.get("/metrics").text


def _measured_memory(client: httpx.Client) -> dict[str, object]:
    """/health's memory once a measurement exists."""
    deadline = time.monotonic() + 10 * DEFAULT_INTERVAL_SECONDS
    while True:
        memory = client.get("/health").json()["pool"]["memory"]
        if memory["measured_seconds_ago"] is not None:
            return memory
        assert time.monotonic() < deadline, memory
        time.sleep(0.05)
