"""Shared fixtures: fault-injection kernelspecs, running workers, leak checks."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from kernel_worker.settings import memory_backed

ROOT = Path(__file__).resolve().parent.parent
SHM = Path("/dev/shm")
_INTEROP_VENV_PYTHON = ROOT / ".venv-interop" / "bin" / "python"
if "STRATA_INTEROP_PYTHON" not in os.environ and _INTEROP_VENV_PYTHON.exists():
    # the environment scripts/interop-env.sh builds: interop tests use it when present
    os.environ["STRATA_INTEROP_PYTHON"] = str(_INTEROP_VENV_PYTHON)

_SIGINT_IGNORING = (
    "import signal\n"
    "_real = signal.signal\n"
    "def _patched(sig, handler):\n"
    "    return _real(sig, signal.SIG_IGN if sig == signal.SIGINT else handler)\n"
    "signal.signal = _patched\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "from ipykernel.kernelapp import launch_new_instance\n"
    "launch_new_instance()\n"
)
_SLOW_START = (
    "import time\n"
    "time.sleep(1.5)\n"
    "from ipykernel.kernelapp import launch_new_instance\n"
    "launch_new_instance()\n"
)
_FAILS_TO_START = "import sys\nsys.exit(3)\n"

FAULT_KERNELS = {
    "ignores-sigint": _SIGINT_IGNORING,
    "slow-start": _SLOW_START,
    "fails-to-start": _FAILS_TO_START,
}


SYSTEM_TESTS = Path(__file__).resolve().parent / "system"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under ``tests/system`` ``system``, and every test that builds locked
    environments with real uv (the ``uv`` fixture) ``slow``: ``-m "not slow"`` leaves them."""
    for item in items:
        if SYSTEM_TESTS in item.path.parents:
            item.add_marker(pytest.mark.system)
        if "uv" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


# where this session's workers put their run directories in /dev/shm (set by the fixture)
_session_shm: list[Path] = []
LEFT_IN_SHM = ("joblib_memmapping_folder_*",)  # what kernels would leave there, not a worker
# uv's own lock files, kept in TMPDIR by design (uv takes them again); they go with the folder
KEPT_BY_DESIGN = ("uv-*.lock",)


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Run the session with a temp folder of its own (``TMPDIR``: pools' private folders,
    the folders tests make, whatever a worker or kernel leaves) and a folder of its own in
    /dev/shm for workers' run directories; at the end, fail listing what is left in either,
    or in /dev/shm itself, of ours (``LEFT_IN_SHM``, such as joblib's memmapping folders)."""
    tmp_path_factory.getbasetemp()  # pytest's own folders stay where they are
    session_tmp = Path(tempfile.mkdtemp(prefix="skw-tests-"))
    session_tmp.chmod(0o1777)  # as /tmp: kernels of other uids reach the folders made here
    shm = SHM if memory_backed(SHM) and os.access(SHM, os.W_OK) else None
    if shm is not None:
        _session_shm.append(Path(tempfile.mkdtemp(prefix="skw-tests-", dir=shm)))
    in_shm = {p for pattern in LEFT_IN_SHM for p in SHM.glob(pattern)} if shm else set()
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(session_tmp)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        tempfile.tempdir = None
        left = sorted(
            str(p)
            for p in session_tmp.iterdir()
            if not any(p.match(pattern) for pattern in KEPT_BY_DESIGN)
        )
        for folder in _session_shm:
            left += sorted(str(p) for p in folder.iterdir())
            shutil.rmtree(folder, ignore_errors=True)
        if shm is not None:
            left += sorted(str(p) for pattern in LEFT_IN_SHM for p in SHM.glob(pattern))
            left = [p for p in left if Path(p) not in in_shm]
        shutil.rmtree(session_tmp, ignore_errors=True)
    assert not left, f"the test session left these behind: {left}"


@pytest.fixture(scope="session")
def fault_kernels_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Jupyter data dir holding the fault-injection kernelspecs (use as JUPYTER_PATH)."""
    root = tmp_path_factory.mktemp("jupyter")
    for name, code in FAULT_KERNELS.items():
        spec = root / "kernels" / name
        spec.mkdir(parents=True)
        argv = [sys.executable, "-c", code, "-f", "{connection_file}"]
        spec.joinpath("kernel.json").write_text(
            json.dumps({"argv": argv, "display_name": name, "language": "python"})
        )
    return root


@pytest.fixture
def fault_kernels(fault_kernels_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JUPYTER_PATH", str(fault_kernels_path))
    return fault_kernels_path


def alive(pid: int | None) -> bool:
    """Whether ``pid`` is a running process (a zombie is not)."""
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: Iterable[int], seconds: float, message: str) -> None:
    """Wait (bounded) until none of ``pids`` runs; fail with ``message`` if one still does."""
    pids = list(pids)
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def stop_process(proc: subprocess.Popen[Any], grace_seconds: float) -> None:
    """SIGTERM ``proc``, then SIGKILL it if it is still there after ``grace_seconds``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def kernel_uid_unavailable(uid: int) -> str | None:
    """Why kernels cannot run as ``uid`` here (not root, or the interpreter lies under a
    directory that uid cannot enter), or None when they can."""
    if os.geteuid() != 0:
        return "needs root"
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import ipykernel"],
            user=uid, group=uid, extra_groups=[], capture_output=True, check=False,
        )  # fmt: skip
    except OSError:
        probe = None
    if probe is None or probe.returncode != 0:
        return f"uid {uid} cannot run {sys.executable} (a parent directory is private)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class WorkerProcess:
    """A ``strata-kernel-worker`` started as a real process on loopback."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        run_dir: Path,
        log_file: Path | None = None,
        *,
        owns_run_dir: bool = False,
    ) -> None:
        self.port = free_port()
        self.run_dir = run_dir
        self._owns_run_dir = owns_run_dir  # a folder outside pytest's tmp dirs: removed by stop()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "kernel_worker", "--host", "127.0.0.1",
               "--port", str(self.port), "--run-dir", str(run_dir), "--log-level", "warning", *args]  # fmt: skip
        self.log_file = log_file
        stderr = open(log_file, "wb") if log_file is not None else None  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=stderr, stderr=stderr)
        if stderr is not None:
            stderr.close()
        self.kernel_pids: set[int] = set()

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    self.remember_kernels()
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError("worker did not become healthy")

    def logs(self) -> str:
        """What the worker wrote to stdout and stderr so far (only with ``capture_logs``)."""
        return self.log_file.read_text() if self.log_file is not None else ""

    def remember_kernels(self) -> set[int]:
        """Record the worker's current kernel processes (checked for leaks at the end)."""
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return set()
        pids = {p.pid for p in children}
        self.kernel_pids |= pids
        return pids

    def stop(self) -> None:
        self.remember_kernels()
        stop_process(self.proc, 30)
        for pid in self.kernel_pids:  # anything the worker failed to stop is a test failure
            if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                psutil.Process(pid).kill()
                raise AssertionError(f"kernel process {pid} outlived its worker")
        leftovers = [*self.run_dir.glob("skw-run-*"), *self.run_dir.glob("skw-kept-*")]
        if self._owns_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        assert not leftovers, f"run directories left behind: {leftovers}"


def start_worker(
    tmp_path_factory: pytest.TempPathFactory,
    *args: str,
    env: dict[str, str] | None = None,
    capture_logs: bool = False,
    run_dir: Path | None = None,
) -> WorkerProcess:
    owns_run_dir = False
    if run_dir is None:  # like the worker's own default: a memory filesystem when there is one
        if memory_backed(SHM) and os.access(SHM, os.W_OK):
            shm = _session_shm[0] if _session_shm else SHM
            run_dir, owns_run_dir = Path(tempfile.mkdtemp(prefix="skw-test-", dir=shm)), True
        else:
            run_dir = tmp_path_factory.mktemp("runs")
    log_file = tmp_path_factory.mktemp("logs") / "worker.log" if capture_logs else None
    full_env = {**os.environ, "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    full_env.update(env or {})
    full_env.pop("PYTEST_CURRENT_TEST", None)  # ipykernel stops capturing fd output under it
    if "--queue-wait" not in args:  # slow CI machines: wait inline rather than answer 202
        args = (*args, "--queue-wait", "30")
    if "--env-warm-up" not in args:  # nothing made ahead in ~/.strata by tests that need none
        args = (*args, "--env-warm-up", "off")
    worker = WorkerProcess(list(args), full_env, run_dir, log_file, owns_run_dir=owns_run_dir)
    try:
        worker.wait_ready()
    except BaseException:
        worker.stop()
        raise
    return worker


@pytest.fixture(scope="session")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A shared worker with two warm kernels."""
    w = start_worker(tmp_path_factory, "--pool-size", "2", "--queue-wait", "30")
    yield w
    w.stop()


@pytest.fixture(scope="session")
def solo_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A worker with exactly one kernel (isolation between consecutive requests)."""
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--queue-wait", "30")
    yield w
    w.stop()
