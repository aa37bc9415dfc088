"""A hostile cell: ``python -m bench.hostile``, the worker while one cell prints 1 GB.

For each way of printing (below), a worker is started alone on 127.0.0.1 (one kernel,
``--console-cap`` as given), warmed with a trivial cell, and then sent one cell that
prints about 1 GB (1000 MiB) while this process measures the worker process itself (its
kernels are other processes):

- its peak RSS above its idle RSS: the kernel's exact high-water mark (``VmHWM``, reset
  through ``/proc/PID/clear_refs`` just before the cell; 5 ms samples where that is not
  available);
- ``/health`` latency, asked back to back on a connection of its own from the moment the
  cell is sent until its answer is read (p50, p99, max, and how many were asked);
- the cell's time, and how many characters of stdout it kept.

- ``print``: ``sys.stdout.write`` of 8 MiB, 125 times;
- ``fd``: a subprocess (``os.system``) writes 1000 MiB to file descriptor 1;
- ``iopub``: goes around the cap, sending 125 stream messages of 8 MiB on the kernel's
  IOPub socket itself, signed by a session of its own (nothing in the kernel sees them);
- ``frames``: one ``display_data`` of 1,600 buffers of 500 KiB (800 MB) on the IOPub socket:
  each frame under the most the worker reads of one message, the message far over it;
- ``payload``: IPython's own ``payload_manager.write_payload``, three payloads of 200 MB,
  which go out in the cell's ``execute_reply`` on the shell socket;
- ``replies``: eight extra replies of 250 MiB sent on the kernel's shell socket itself.

Goal: the peak within 2x the cap above idle (and within 64 MiB for the last three), and
/health under 100 ms throughout.
``print`` and ``fd`` are capped in the kernel; ``iopub`` shows what the worker's own
bounds hold against a kernel that ignores the cap (its messages are over the most the
worker reads of one, so the cell's answer may be a ``502``: the kernel is replaced).
``--before REF`` runs each case on a worker of commit REF too (a git worktree), beside
this tree's, in the same run. Nothing here asserts: it prints a table and writes
``bench/results/hostile.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from .processes import ROOT, free_port, peak_rss, reset_peak_rss

MIB = 1 << 20
_WRITES = 125  # of 8 MiB: 1000 MiB in all
CELLS = {
    "print": (
        "import sys\n"
        "chunk = 'x' * (8 << 20)\n"
        f"for _ in range({_WRITES}):\n"
        "    sys.stdout.write(chunk)\n"
        "del chunk\n"
    ),
    "fd": f"import os\nos.system('head -c {_WRITES * 8 * MIB} /dev/zero | tr \"\\\\0\" x')\n",
    "iopub": (
        "kernel = get_ipython().kernel\n"
        "parent = kernel.get_parent('shell')\n"
        "from jupyter_client.session import Session\n"
        "own = Session(key=kernel.session.key, signature_scheme=kernel.session.signature_scheme)\n"
        "content = {'name': 'stdout', 'text': 'x' * (8 << 20)}\n"
        f"for _ in range({_WRITES}):\n"
        "    own.send(kernel.iopub_socket, 'stream', content, parent=parent)\n"
        "del kernel, parent, content, own, Session\n"
    ),
    "frames": (
        "kernel = get_ipython().kernel\n"
        "parent = kernel.get_parent('shell')\n"
        "from jupyter_client.session import Session\n"
        "own = Session(key=kernel.session.key, signature_scheme=kernel.session.signature_scheme)\n"
        "chunk = b'x' * (500 << 10)\n"
        "own.send(kernel.iopub_socket, 'display_data', {'data': {}, 'metadata': {}},\n"
        "         parent=parent, buffers=[chunk] * 1600)\n"
        "del kernel, parent, own, Session, chunk\n"
    ),
    "payload": (
        "for _ in range(3):\n"
        "    get_ipython().payload_manager.write_payload(\n"
        "        {'source': 'page', 'data': {'text/plain': 'p' * (200 << 20)}})\n"
    ),
    "replies": (
        "kernel = get_ipython().kernel\n"
        "parent = kernel.get_parent('shell')\n"
        "from jupyter_client.session import Session\n"
        "own = Session(key=kernel.session.key, signature_scheme=kernel.session.signature_scheme)\n"
        "content = {'status': 'ok', 'pad': 'r' * (250 << 20)}\n"
        "for _ in range(8):\n"
        "    own.send(kernel.shell_stream.socket, 'execute_reply', content, parent=parent,\n"
        "             ident=kernel._parent_ident['shell'])\n"
        "del kernel, parent, own, Session, content\n"
    ),
}
_SAMPLE_SECONDS = 0.005
_CELL_TIMEOUT_SECONDS = 600


def _metadata(source: str) -> str:
    params = {"source": source, "timeout_seconds": _CELL_TIMEOUT_SECONDS}
    transform = {"ref": "notebook_cell@v1", "params": params}
    return json.dumps({"protocol_version": "v1", "transform": transform, "inputs": []})


def _run_cell(client: httpx.Client, source: str) -> httpx.Response:
    files = {"metadata": ("metadata.json", _metadata(source), "application/json")}
    return client.post("/v1/execute", files=files)


def _stdout_of(bundle: bytes) -> str:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r|*") as tar:
        for member in tar:
            if member.name == "stdout.txt":
                extracted = tar.extractfile(member)
                return extracted.read().decode() if extracted is not None else ""
    return ""


class HealthWatch:
    """While a cell runs: ``/health`` asked back to back on a connection of its own (each
    answer's status and latency), and the worker's RSS sampled every ``sample_seconds``."""

    def __init__(self, url: str, pid: int, sample_seconds: float = _SAMPLE_SECONDS) -> None:
        self._url = url
        self._process = psutil.Process(pid)
        self._sample_seconds = sample_seconds
        self._stop = threading.Event()
        self.latencies: list[float] = []
        self.answers: list[int] = []  # status codes; 0 for no answer
        self.sampled_peak = 0
        self._threads = [threading.Thread(target=self._ask), threading.Thread(target=self._sample)]

    @property
    def failures(self) -> int:
        return sum(status != 200 for status in self.answers)

    def idle_rss(self) -> int:
        """The worker's RSS now: the median of five samples 50 ms apart."""
        samples = []
        for _ in range(5):
            samples.append(self._process.memory_info().rss)
            time.sleep(0.05)
        return int(statistics.median(samples))

    def __enter__(self) -> HealthWatch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _ask(self) -> None:
        with httpx.Client(base_url=self._url, timeout=60) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    status = client.get("/health").status_code
                except httpx.HTTPError:
                    status = 0
                self.latencies.append(time.perf_counter() - started)
                self.answers.append(status)

    def _sample(self) -> None:
        while not self._stop.wait(self._sample_seconds):
            with contextlib.suppress(psutil.Error):
                self.sampled_peak = max(self.sampled_peak, self._process.memory_info().rss)


def _start(cap: str, run_dir: str, root: Path = ROOT) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [sys.executable, "-m", "kernel_worker", "--host", "127.0.0.1", "--port", str(port),
            "--pool-size", "1", "--console-cap", cap, "--queue-wait", "120",
            "--run-dir", run_dir, "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the worker exited with {proc.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        time.sleep(0.05)
    raise SystemExit("the worker did not become ready in 120 s")


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 30 s; then any of its processes still alive, by PID."""
    children: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        children = psutil.Process(proc.pid).children(recursive=True)
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()


def _idle_rss(pid: int) -> int:
    samples = []
    for _ in range(5):
        samples.append(psutil.Process(pid).memory_info().rss)
        time.sleep(0.05)
    return int(statistics.median(samples))


def measure(case: str, cap: str, root: Path = ROOT, build: str = "this tree") -> dict[str, Any]:
    """One worker (of the tree at ``root``), one hostile cell: the worker's memory and
    /health while it runs."""
    run_dir = tempfile.mkdtemp(prefix="skw-bench-hostile-")
    proc, url = _start(cap, run_dir, root)
    try:
        with httpx.Client(base_url=url, timeout=_CELL_TIMEOUT_SECONDS + 60) as client:
            for _ in range(3):  # warm the kernel, the connection and the bundle path
                _run_cell(client, "print('warm')").raise_for_status()
            idle = _idle_rss(proc.pid)
            exact = reset_peak_rss(proc.pid)
            started = time.perf_counter()
            with HealthWatch(url, proc.pid) as watch:
                response = _run_cell(client, CELLS[case])
            seconds = time.perf_counter() - started
        peak = (peak_rss(proc.pid) if exact else None) or watch.sampled_peak
        after = psutil.Process(proc.pid).memory_info().rss
    finally:
        stop_worker(proc)
        subprocess.run(["rm", "-rf", run_dir], check=False)
    kept = len(_stdout_of(response.content)) if response.status_code == 200 else 0
    latencies = sorted(watch.latencies) or [0.0]
    return {
        "case": case,
        "build": build,
        "status": response.status_code,
        "cell_seconds": seconds,
        "stdout_characters": kept,
        "idle_rss_mib": idle / MIB,
        "peak_rss_mib": peak / MIB,
        "peak_growth_mib": (peak - idle) / MIB,
        "after_growth_mib": (after - idle) / MIB,
        "peak_exact": exact,
        "health_asked": len(watch.latencies),
        "health_failed": watch.failures,
        "health_p50_ms": statistics.median(latencies) * 1e3,
        "health_p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        "health_max_ms": latencies[-1] * 1e3,
    }


def _table(rows: list[dict[str, Any]], cap_mib: float) -> str:
    lines = [
        f"hostile cell: ~1 GB printed, --console-cap {cap_mib:g} MiB (goal: peak growth "
        f"<= {2 * cap_mib:g} MiB, /health p99 < 100 ms)",
        f"{'case':<8} {'build':<10} {'status':>6} {'cell s':>7} {'kept MiB':>9} "
        f"{'idle MiB':>9} {'peak +MiB':>10} {'/health p50':>12} {'p99 ms':>8} {'max ms':>8} "
        f"{'asked':>6}",
    ]
    for r in rows:
        lines.append(
            f"{r['case']:<8} {r.get('build', 'this tree'):<10} {r['status']:>6} "
            f"{r['cell_seconds']:>7.1f} "
            f"{r['stdout_characters'] / MIB:>9.1f} {r['idle_rss_mib']:>9.1f} "
            f"{r['peak_growth_mib']:>10.1f} {r['health_p50_ms']:>12.1f} "
            f"{r['health_p99_ms']:>8.1f} {r['health_max_ms']:>8.1f} {r['health_asked']:>6}"
        )
    return "\n".join(lines)


def _cap_bytes(text: str) -> float:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    suffix = text[-1:].upper()
    return float(text[:-1]) * units[suffix] if suffix in units else float(text)


@contextlib.contextmanager
def _worktree(ref: str | None) -> Iterator[Path | None]:
    """A git worktree of ``ref`` for the time of the run (None: none asked)."""
    if ref is None:
        yield None
        return
    where = Path(tempfile.mkdtemp(prefix="skw-bench-before-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(where), ref], cwd=ROOT,
                   check=True, capture_output=True)  # fmt: skip
    try:
        yield where
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT,
                       check=False, capture_output=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__)
    parser.add_argument("--cases", nargs="+", choices=sorted(CELLS), default=list(CELLS))
    parser.add_argument("--console-cap", default="16M", help="the workers' --console-cap")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "hostile.json")
    parser.add_argument("--before", metavar="REF", help="also run each case on commit REF")
    args = parser.parse_args()
    with _worktree(args.before) as before:
        rows = []
        for case in args.cases:
            if before is not None:
                rows.append(measure(case, args.console_cap, before, "before"))
            rows.append(measure(case, args.console_cap, ROOT, "after" if before else "this tree"))
    cap_mib = _cap_bytes(args.console_cap) / MIB
    print(_table(rows, cap_mib))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {"console_cap": args.console_cap, "cores": os.cpu_count(), "before": args.before}
    args.out.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
