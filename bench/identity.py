"""What kernel identities cost: ``python -m bench.identity`` (as root).

Side by side in one run, one worker after another on 127.0.0.1 (each stopped by its PID
before the next): kernels as the worker's own user, as one shared ``--kernel-user``, and
each as a uid of its own (``--kernel-user FIRST-LAST``). For each: the time until the pool
of two is ready, and the trivial cell's latency (p50, p90) over HTTP; printed as ratios
against the worker's own user. Goal: per-kernel uids at no measurable cost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from .hostile import stop_worker
from .processes import ROOT, free_port

CONFIGS = {
    "own user": [],
    "shared user": ["--kernel-user", "nobody"],
    "uid per kernel": ["--kernel-user", "31100-31107"],
}
_TRIVIAL = {
    "protocol_version": "v1",
    "transform": {"ref": "notebook_cell@v1", "params": {"source": "x = 1"}},
    "inputs": [],
}


def measure(extra: list[str], cells: int) -> dict[str, float]:
    port = free_port()
    runs = tempfile.mkdtemp(prefix="skw-bench-identity-")
    os.chmod(runs, 0o711)
    argv = [sys.executable, "-m", "kernel_worker", "--host", "127.0.0.1", "--port", str(port),
            "--pool-size", "2", "--run-dir", runs, "--log-level", "warning", *extra]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            while True:
                try:
                    if client.get("/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.perf_counter() - started > 120:
                    raise RuntimeError(f"the worker did not start ({' '.join(extra)})")
                time.sleep(0.02)
            ready = time.perf_counter() - started
            files = {"metadata": ("metadata.json", json.dumps(_TRIVIAL), "application/json")}
            times = []
            for n in range(cells + 5):
                t = time.perf_counter()
                response = client.post("/v1/execute", files=files)
                response.raise_for_status()
                if n >= 5:  # the first few warm the connection and the kernels
                    times.append(time.perf_counter() - t)
    finally:
        stop_worker(proc)
        shutil.rmtree(runs, ignore_errors=True)
    quantiles = statistics.quantiles(times, n=10)
    return {
        "ready_s": ready,
        "p50_ms": statistics.median(times) * 1e3,
        "p90_ms": quantiles[8] * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.identity", description=__doc__)
    parser.add_argument("--cells", type=int, default=200, help="trivial cells per worker")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "identity.json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench.identity needs root (kernels run as other users)")
    results = {name: measure(extra, args.cells) for name, extra in CONFIGS.items()}
    base = results["own user"]
    print(
        f"{'kernels run as':<16} {'ready (s)':>10} {'x':>6} {'p50 (ms)':>9} {'x':>6} {'p90 (ms)':>9}"
    )
    for name, r in results.items():
        print(
            f"{name:<16} {r['ready_s']:>10.3f} {r['ready_s'] / base['ready_s']:>6.2f}"
            f" {r['p50_ms']:>9.2f} {r['p50_ms'] / base['p50_ms']:>6.2f} {r['p90_ms']:>9.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
