"""The servers the benchmark starts: our worker (reset and fresh) and the reference worker.

Each is a child of the benchmark process, bound to 127.0.0.1 on a free port, and stopped
by PID at the end: SIGTERM, a grace period, then SIGKILL, for the server and for every
process it started (kernels) that is still alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx
import psutil

from .errors import BenchError
from .rawkernel import stop_pids

log = logging.getLogger("bench.processes")

ROOT = Path(__file__).resolve().parent.parent
STOP_GRACE_SECONDS = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_reference_bin(explicit: str | None) -> Path | None:
    """``--reference-bin``, else ``strata-worker`` on PATH, else the one beside the interop
    interpreter (``$STRATA_INTEROP_PYTHON``), else the one in ``.venv-interop/``, where
    ``scripts/interop-env.sh`` installs it."""
    if explicit:
        path = Path(explicit)
        return path if path.is_file() else None
    found = shutil.which("strata-worker")
    if found:
        return Path(found)
    interop = os.environ.get("STRATA_INTEROP_PYTHON")
    candidates = [Path(interop).parent / "strata-worker"] if interop else []
    candidates.append(ROOT / ".venv-interop" / "bin" / "strata-worker")
    return next((path for path in candidates if path.is_file()), None)


INTEROP_SCRIPT = ROOT / "scripts" / "interop-env.sh"


def build_reference(script: Path = INTEROP_SCRIPT) -> Path | None:
    """Build (or reuse) the interop environment with ``scripts/interop-env.sh``, which
    installs strata-notebook and with it ``strata-worker``; that executable, or None when
    the script failed (it says why on stderr: no Python >= 3.12, no network...)."""
    print(
        "--with-reference: no strata-worker found; building .venv-interop/ with "
        f"{script.relative_to(ROOT) if script.is_relative_to(ROOT) else script} "
        "(strata-notebook, a minute or two the first time)",
        file=sys.stderr, flush=True,
    )  # fmt: skip
    done = subprocess.run(
        ["bash", str(script)], cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0 or not done.stdout.strip():
        return None
    found = Path(done.stdout.strip().splitlines()[-1]).parent / "strata-worker"
    return found if found.is_file() else None


def our_worker_argv(
    port: int, *, kernels: int, recycle: str, run_dir: Path, spares: int = 0,
    preload: Path | None = None,
) -> list[str]:  # fmt: skip
    argv = [
        sys.executable, "-m", "kernel_worker", "--host", "127.0.0.1", "--port", str(port),
        "--pool-size", str(kernels), "--recycle", recycle, "--queue-wait", "120",
        "--run-dir", str(run_dir), "--log-level", "warning",
    ]  # fmt: skip
    if spares:
        argv += ["--spares", str(spares)]
    if preload is not None:
        argv += ["--preload", str(preload)]
    return argv


def reference_argv(binary: Path, port: int) -> list[str]:
    return [str(binary), "--host", "127.0.0.1", "--port", str(port)]


class ServerProcess:
    """One HTTP server started by the benchmark, known by its PID."""

    def __init__(self, name: str, argv: list[str], port: int, log_path: Path) -> None:
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self._argv = argv
        self._log_path = log_path
        self._log: IO[bytes] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._children: set[int] = set()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    async def start(self, env: dict[str, str], cwd: Path) -> None:
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = await asyncio.to_thread(self._log_path.open, "wb")  # closed in stop()
        self._proc = await asyncio.create_subprocess_exec(
            *self._argv, stdout=self._log, stderr=asyncio.subprocess.STDOUT, env=env, cwd=cwd
        )
        log.info("started %s (pid %s) on %s", self.name, self._proc.pid, self.url)

    async def wait_healthy(self, client: httpx.AsyncClient, timeout_seconds: float) -> None:
        """Poll ``/health`` (bounded) until it answers 200 with every kernel idle."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.returncode is not None:
                raise BenchError(f"{self.name} exited; see {self._log_path}")
            with contextlib.suppress(httpx.TransportError):
                response = await client.get(self.url + "/health", timeout=5.0)
                if response.status_code == 200 and _all_idle(response.json()):
                    self.remember_children()
                    return
            await asyncio.sleep(0.05)
        raise BenchError(f"{self.name} did not become healthy in {timeout_seconds:g}s")

    def remember_children(self) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(self._proc.pid).children(recursive=True)
            self._children |= {p.pid for p in children}

    async def stop(self) -> None:
        """SIGTERM, wait, SIGKILL; then the same for any child it left behind."""
        proc = self._proc
        if proc is not None:
            self.remember_children()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), STOP_GRACE_SECONDS)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()
            leftovers = await asyncio.to_thread(stop_pids, sorted(self._children))
            if leftovers:
                log.warning(
                    "%s left %d process(es) behind; stopped them", self.name, len(leftovers)
                )
        if self._log is not None:
            self._log.close()
            self._log = None


def _all_idle(health: Any) -> bool:
    """Our worker reports its pool (every kernel, spares included, idle); the reference has
    none (healthy is enough)."""
    pool = health.get("pool") if isinstance(health, dict) else None
    if not isinstance(pool, dict):
        return True
    kernels = pool.get("kernels") or {}
    wanted = int(pool.get("size", 1) or 1) + int(pool.get("spares", 0) or 0)
    return int(kernels.get("idle", 0)) >= wanted


def process_cpu(pid: int) -> tuple[float, float]:
    """Cumulative CPU seconds of a process and of its descendants (live ones + reaped ones).

    Blocking (reads /proc): call in a thread. A process that is gone counts as zero.
    """
    try:
        proc = psutil.Process(pid)
        times = proc.cpu_times()
        children = proc.children(recursive=True)
    except psutil.Error:
        return 0.0, 0.0
    descendants = times.children_user + times.children_system
    for child in children:
        with contextlib.suppress(psutil.Error):
            child_times = child.cpu_times()
            descendants += child_times.user + child_times.system
    return times.user + times.system, descendants


def server_env(*, inline_matplotlib: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MPLBACKEND", None)
    if inline_matplotlib:
        env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    return env


def process_rss(pid: int) -> tuple[int, int]:
    """Resident bytes of a process and the sum over its live descendants (kernels).

    Blocking (reads /proc): call in a thread. A process that is gone counts as zero.
    """
    try:
        proc = psutil.Process(pid)
        own = int(proc.memory_info().rss)
        children = proc.children(recursive=True)
    except psutil.Error:
        return 0, 0
    descendants = 0
    for child in children:
        with contextlib.suppress(psutil.Error):
            descendants += int(child.memory_info().rss)
    return own, descendants


def reset_peak_rss(pid: int) -> bool:
    """Reset the kernel's record of a process's peak RSS (``VmHWM``); False where unsupported."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss(pid: int) -> int | None:
    """A process's peak resident bytes since start or :func:`reset_peak_rss` (Linux only)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None
