"""``python -m bench.profile``: where the time of a case goes, by process and by library.

The benchmark says how fast a case is; this says what bounds it. One worker of ours
(``--pool-size 2 --recycle reset``, as in the benchmark) serves a case's requests, sent one at
a time from this process with httpx (as the benchmark and the Strata client do), while
`py-spy <https://github.com/benfred/py-spy>`_ samples this process and every process under it:
the client (this process), the worker, its kernels and fork server. Each sample is charged to
its process's role and to the library of its innermost Python frame (a C call made from
Python counts for the library that made it), so the report reads, per request: how many
milliseconds of CPU the client, the worker and the kernel spent, and in what.

Only busy threads are sampled (py-spy's default), so a role's figure is its CPU time, not its
wall time; a wait shows as absence. ``py-spy`` must be installed (``pip install py-spy``) and
allowed to read other processes' memory (root, or ``kernel.yama.ptrace_scope`` 0).

Results: ``<results-dir>/profile.json`` (every case: wall time per request, CPU per request
by role, the top libraries and functions per role) and one ``<case>.raw.txt`` per case,
py-spy's collapsed stacks, which flame graph tools read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from .cases import Case, arrow_stream, output_case, prepare_request, worker_cases
from .errors import BenchError
from .measure import HttpTarget, http_runner
from .processes import (
    ROOT,
    ServerProcess,
    free_port,
    our_worker_argv,
    process_cpu,
    server_env,
)  # fmt: skip

log = logging.getLogger("bench.profile")

RESULTS = ROOT / "bench" / "results" / "profile"
DEFAULT_CASES = ("trivial", "pandas_mpl", "input_100mb", "output_100mb")
ROLES = ("client", "worker", "kernel")
START_SECONDS = 180.0
TOP = 6
UNPROFILED = 10  # requests timed before sampling starts: the case's own pace

_RECORD = re.compile(r"(.+?) (\d+)$", re.MULTILINE | re.DOTALL)
_PROCESS = re.compile(r'process (\d+):"(.*)"', re.DOTALL)
_FRAME = re.compile(r"(.*) \((.*):(\d+)\)$", re.DOTALL)
_OURS = ("kernel_worker", "kernel_pool", "bench")
_AGENTS = ("<kernel_pool", "<strata_kernel_agent")  # our code shipped into the kernel


@dataclass(frozen=True, slots=True)
class Sample:
    """One collapsed stack: the process chain (outermost first), its frames, its count."""

    processes: tuple[str, ...]  # command lines
    frames: tuple[str, ...]  # "function (file:line)", outermost first
    count: int


def parse_collapsed(text: str) -> list[Sample]:
    """py-spy's ``--format raw`` output (with ``--subprocesses``) as samples.

    A record is ``frame;frame;... count`` on one line, except that a process frame
    (``process PID:"command line"``) carries its command line verbatim, newlines included.
    """
    samples = []
    for match in _RECORD.finditer(text):
        stack, count = match.group(1).strip("\n"), int(match.group(2))
        processes: list[str] = []
        frames: list[str] = []
        for part in _split_frames(stack):
            process = _PROCESS.fullmatch(part)
            if process is not None:
                processes.append(process.group(2))
            else:
                frames.append(part)
        samples.append(Sample(tuple(processes), tuple(frames), count))
    return samples


def _split_frames(stack: str) -> Iterable[str]:
    """``;``-separated frames, where a quoted command line may itself hold ``;``."""
    part: list[str] = []
    quoted = False
    for char in stack:
        if char == '"' and (part[:8] == list("process ") or quoted):
            quoted = not quoted
        if char == ";" and not quoted:
            yield "".join(part)
            part = []
        else:
            part.append(char)
    if part:
        yield "".join(part)


def role_of(processes: Sequence[str]) -> str:
    """``client`` (this process), ``worker`` (the worker's own process), else ``kernel``
    (its kernels, fork server and what they start)."""
    if len(processes) <= 1:
        return "client"
    return "worker" if len(processes) == 2 else "kernel"


def library_of(frame: str) -> str:
    """The top-level package a frame's file belongs to: ``numpy``, ``kernel_worker``,
    ``stdlib:asyncio``, ``cell`` (the cell's own code), ``?`` (no file)."""
    match = _FRAME.match(frame)
    if match is None:
        return "?"
    path = match.group(2)
    if path.startswith("<"):  # code compiled from a string
        return "agent" if path.startswith(_AGENTS) else "cell"
    if "/ipykernel_" in path:  # IPython's file for a cell: $TMPDIR/ipykernel_PID/HASH.py
        return "cell"
    parts = Path(path).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            rest = parts[parts.index(marker) + 1 :]
            return _module_name(rest[0]) if rest else "?"
    for name in _OURS:
        if name in parts:
            return name
    if "lib" in parts:
        rest = parts[len(parts) - 1 - parts[::-1].index("lib") + 1 :]
        if len(rest) >= 2 and rest[0].startswith("python"):
            return "stdlib:" + _module_name(rest[1])
    return _module_name(parts[-1]) if parts else "?"


def _module_name(name: str) -> str:
    return name.removesuffix(".py").split(".")[0] or name


def _function_of(frame: str) -> str:
    match = _FRAME.match(frame)
    if match is None:
        return frame
    function, path, _ = match.groups()
    return f"{function} ({library_of(frame)}/{Path(path).name})"


# Innermost Python frames of a thread that waits: an event loop's poll, a lock, a sleep, or
# a loop around one (py-spy shows no C frame, so a wait in C is charged to its caller).
# py-spy leaves out threads it sees idle, but not every wait looks idle to it; these are
# dropped from the shares, which are of the work done.
WAITS = frozenset({"select", "poll", "sleep", "wait", "acquire", "_wait_for_tstate_lock"})
WAIT_LOOPS = frozenset({
    "OutStream._watch_pipe_fd",  # ipykernel: reads the cell's fd 1/2 pipe
    "GarbageCollectorThread.run",  # pyzmq: frees zero-copy buffers
    "_start_lifeline.<locals>.watch",  # kernel_pool: checks the pool is alive every 0.5 s
    "device",  # pyzmq: the heartbeat's echo loop
})  # fmt: skip


def is_wait(frame: str) -> bool:
    match = _FRAME.match(frame)
    name = frame if match is None else match.group(1)
    return name in WAIT_LOOPS or name.rsplit(".", 1)[-1] in WAITS


@dataclass(slots=True)
class RoleProfile:
    samples: int = 0
    libraries: Counter[str] = field(default_factory=Counter)
    functions: Counter[str] = field(default_factory=Counter)


def summarize_samples(
    samples: Iterable[Sample], *, cpu_seconds: dict[str, float], requests: int
) -> dict[str, dict[str, Any]]:
    """Per role: CPU milliseconds per request (``cpu_seconds``, measured by the operating
    system over the same window), and the shares of the top libraries and functions among
    the role's working samples (waits left out)."""
    roles = {role: RoleProfile() for role in ROLES}
    for sample in samples:
        if not sample.frames or is_wait(sample.frames[-1]):
            continue
        profile = roles[role_of(sample.processes)]
        profile.samples += sample.count
        leaf = sample.frames[-1]
        profile.libraries[library_of(leaf)] += sample.count
        profile.functions[_function_of(leaf)] += sample.count
    report: dict[str, dict[str, Any]] = {}
    for role, profile in roles.items():
        total = profile.samples or 1
        report[role] = {
            "cpu_ms_per_request": 1000.0 * cpu_seconds.get(role, 0.0) / max(requests, 1),
            "samples": profile.samples,
            "libraries": {k: round(v / total, 3) for k, v in profile.libraries.most_common(TOP)},
            "functions": {k: round(v / total, 3) for k, v in profile.functions.most_common(TOP)},
        }
    return report


def _cpu_by_role(server_pid: int) -> dict[str, float]:
    """Cumulative CPU seconds of this process (client), the worker, and its descendants."""
    own = psutil.Process()
    times = own.cpu_times()
    worker, kernels = process_cpu(server_pid)
    return {"client": times.user + times.system, "worker": worker, "kernel": kernels}


class Spy:
    """``py-spy record`` over this process and its descendants, stopped with SIGINT."""

    def __init__(self, binary: str, output: Path, rate: int) -> None:
        # --nonblocking: pausing every process at each sample slows the case down and, in
        # this set-up, made py-spy count more waiting threads as busy, not fewer
        self._argv = [
            binary, "record", "--pid", str(os.getpid()), "--subprocesses", "--nonblocking",
            "--full-filenames", "--format", "raw", "--rate", str(rate), "--output", str(output),
        ]  # fmt: skip
        self._output = output
        self._proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Spy:
        self._proc = await asyncio.create_subprocess_exec(
            *self._argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        await asyncio.sleep(1.0)  # py-spy attaches and finds the children
        if self._proc.returncode is not None:
            raise BenchError(f"py-spy did not start: {await self._stderr()}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(proc.wait(), 30.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if not self._output.exists():
            raise BenchError(f"py-spy wrote no profile: {await self._stderr()}")

    async def _stderr(self) -> str:
        assert self._proc is not None and self._proc.stderr is not None
        return (await self._proc.stderr.read()).decode("utf-8", "replace").strip()[-2000:]


def _cases(names: Sequence[str]) -> list[Case]:
    known = {case.name: case for case in worker_cases(full=True)}
    known["output_1gb"] = output_case("output_1gb", 1000 * 1000 * 1000, "huge")
    unknown = [name for name in names if name not in known]
    if unknown:
        raise BenchError(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[name] for name in names]


async def profile_case(
    case: Case, target: HttpTarget, spy_binary: str, out_dir: Path, *, seconds: float, rate: int
) -> dict[str, Any]:
    payload = arrow_stream(case.input_bytes) if case.input_bytes else None
    run = http_runner(target, case, prepare_request(case, payload))
    for _ in range(3):  # warm the imports on both kernels, and the connection
        attempt = await run()
        if attempt.problem is not None:
            raise BenchError(f"{case.name}: {attempt.problem} {attempt.response[:500]}")
    await target.settle()
    unprofiled = []
    for _ in range(UNPROFILED):
        attempt = await run()
        if attempt.problem is not None:
            raise BenchError(f"{case.name}: {attempt.problem} {attempt.response[:500]}")
        unprofiled.append(attempt.seconds)
    await target.settle()
    raw = out_dir / f"{case.name}.raw.txt"
    walls: list[float] = []
    assert target.server is not None and target.server.pid is not None
    pid = target.server.pid
    async with Spy(spy_binary, raw, rate):
        before = await asyncio.to_thread(_cpu_by_role, pid)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline or len(walls) < 3:
            attempt = await run()
            if attempt.problem is not None:
                raise BenchError(f"{case.name}: {attempt.problem} {attempt.response[:500]}")
            walls.append(attempt.seconds)
        after = await asyncio.to_thread(_cpu_by_role, pid)
    cpu = {role: after[role] - before[role] for role in ROLES}
    samples = parse_collapsed(raw.read_text(encoding="utf-8", errors="replace"))
    roles = summarize_samples(samples, cpu_seconds=cpu, requests=len(walls))
    return {
        "label": case.label,
        "requests": len(walls),
        "wall_ms_per_request": 1000.0 * statistics.median(walls),
        "wall_ms_unprofiled": 1000.0 * statistics.median(unprofiled),
        "roles": roles,
        "raw": raw.name,
    }


def render(results: dict[str, Any]) -> str:
    lines = []
    for name, case in results["cases"].items():
        roles = case["roles"]
        cpu = ", ".join(f"{r} {roles[r]['cpu_ms_per_request']:.1f}" for r in ROLES)
        lines.append(
            f"{name} ({case['label']}): {case['requests']} requests, median "
            f"{case['wall_ms_per_request']:.1f} ms wall ({case['wall_ms_unprofiled']:.1f} ms "
            f"unprofiled); CPU ms per request: {cpu}"
        )
        for role in ROLES:
            libraries = ", ".join(f"{k} {v:.0%}" for k, v in roles[role]["libraries"].items())
            functions = ", ".join(
                f"{k} {v:.0%}" for k, v in list(roles[role]["functions"].items())[:3]
            )
            lines.append(f"  {role:<6} {libraries}")
            lines.append(f"  {'':<6} top: {functions}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile",
        description="Sample client, worker and kernels with py-spy while a case runs: CPU per "
        "request by process and by library, to show what bounds a case.",
    )
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES),
                        help=f"comma-separated case names (default {','.join(DEFAULT_CASES)})")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=15.0, help="sampling per case (15)")
    parser.add_argument("--rate", type=int, default=100, help="samples per second (100)")
    parser.add_argument("--py-spy", default=None, metavar="PATH",
                        help="the py-spy executable (default: beside this Python, then PATH)")  # fmt: skip
    parser.add_argument("--results-dir", type=Path, default=RESULTS, metavar="DIR")
    return parser


def _find_py_spy(explicit: str | None) -> str | None:
    if explicit:
        return explicit if Path(explicit).is_file() else None
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


async def run(args: argparse.Namespace, spy_binary: str) -> dict[str, Any]:
    cases = _cases([name for name in args.cases.split(",") if name])
    args.results_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"rate": args.rate, "seconds": args.seconds, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="kernel-profile-", dir=_scratch()) as scratch:
        port = free_port()
        run_dir = Path(scratch) / "runs"
        run_dir.mkdir()
        argv = our_worker_argv(port, kernels=2, recycle="reset", run_dir=run_dir)
        server = ServerProcess("ours", argv, port, args.results_dir / "worker.log")
        results["worker"] = " ".join(argv[1:])
        async with httpx.AsyncClient(timeout=900.0) as client:
            try:
                await server.start(server_env(inline_matplotlib=True), ROOT)
                await server.wait_healthy(client, START_SECONDS)
                target = HttpTarget("ours", server.url, client, server)
                for case in cases:
                    log.info("profiling %s for %gs", case.name, args.seconds)
                    results["cases"][case.name] = await profile_case(
                        case, target, spy_binary, args.results_dir,
                        seconds=args.seconds, rate=args.rate,
                    )  # fmt: skip
            finally:
                await server.stop()
    return results


def _scratch() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.seconds <= 0:
        parser.error("--rate and --seconds must be positive")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request skews the client
    spy_binary = _find_py_spy(args.py_spy)
    if spy_binary is None:
        parser.error("py-spy not found: pip install py-spy, or give --py-spy PATH")
    try:
        results = asyncio.run(run(args, spy_binary))
    except BenchError as exc:
        sys.exit(f"python -m bench.profile: {exc}")
    path = args.results_dir / "profile.json"
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(render(results))
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
