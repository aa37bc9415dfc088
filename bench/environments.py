"""The environments case: cells in a notebook's locked environment, ours beside the reference.

One uv project, as ``strata new`` and ``strata dep add humanize`` leave it (``requires-python
==3.12.*``; pyarrow, orjson and cloudpickle, which every Strata notebook depends on and the
reference's harness imports; and ``humanize``, small and pure Python), is locked once, and
its wheels are put in uv's cache by an untimed sync, so no series downloads anything. The request is what Strata sends: ``params.environment``
with the lock's key, ``"3.12"``, the lock and the pyproject. Per repetition, each worker is
started alone with an environment root of its own, empty, and stopped before the next:

* ``first``: the first request in the environment, from sending it to its answer (our 202
  polled where it comes): uv builds the environment, then ours starts a kernel of it
  (spawned, with its kernel overlay), the reference a fresh interpreter for the cell;
* ``warm`` (the last repetition, before the worker stops): a trivial cell (``result`` is
  the interpreter's minor version) in the environment on ours, interleaved with the same
  cell on our default pool, a few requests at a time; then the same cell in the reference's
  cached environment.

Every answer must be a bundle whose manifest says ``success`` with the value expected where
the cell ran (the package's output; 12 in the environment, the worker's own minor on the
default pool). Ours must also name the environment in the manifest (``installed`` true for
a first request, false after it; none on the default pool); the reference's manifest does
not carry it.
Python 3.12 and uv must be on this machine (the case is skipped, with its reason, without
them); the reference needs ``--with-reference`` (its environment root must be fresh).
:mod:`bench.environments_report` holds the ratios, the goals and the table's lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from kernel_worker.environments import lock_key, probe_uv

from .cases import Case, PreparedRequest, manifest_problem, prepare_request, read_manifest
from .environments_report import environments_ratios
from .errors import BenchError, Failure
from .measure import RESPONSE_CAP, Attempt, HttpTarget, RunOnce, failure, interleaved_latency
from .measure import latency as serial_latency
from .processes import ServerProcess, free_port, our_worker_argv, reference_argv, server_env

log = logging.getLogger("bench.environments")

ROOT = Path(__file__).resolve().parent.parent
CASE = "environments"
PACKAGE = "humanize"
DEPENDENCIES = ("pyarrow>=18.0.0", "orjson>=3.10.0", "cloudpickle>=3.0.0", "humanize>=4.0")
PYTHON = "3.12"
POLL_SECONDS = 0.05
FIRST = Case(f"{CASE}_first", "first request, new environment",
             "import humanize\nresult = humanize.intcomma(1234567)\n", "small")  # fmt: skip
FIRST_RESULT = "1,234,567"
WARM = Case(f"{CASE}_warm", "trivial cell", "import sys\nresult = sys.version_info.minor\n",
            "small")  # fmt: skip
ENV_MINOR = int(PYTHON.split(".")[1])
SERIES = ("ours_env", "ours_default")  # interleaved on one worker of ours


@dataclass(frozen=True, slots=True)
class EnvironmentsPlan:
    firsts: int = 1  # repetitions of the first request, each worker with a fresh root
    cells: int = 60  # warm cells on ours, per series
    reference_cells: int = 4  # warm cells on the reference (~0.3-0.5 s each)
    block: int = 5
    budget_seconds: float = 240.0  # one start, one first request, one series

    @classmethod
    def make(cls, *, quick: bool) -> EnvironmentsPlan:
        return cls() if quick else cls(firsts=3, cells=300, reference_cells=10)


def find_python(minor: str = PYTHON) -> Path | None:
    """A real interpreter of ``minor`` (pyenv's, else on ``PATH`` but not a shim), or None."""
    found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{minor}.*/bin/python{minor}")))
    if found:
        return Path(found[-1])
    which = shutil.which(f"python{minor}")
    return Path(which).resolve() if which and "shims" not in which else None


def lock_project(directory: Path, uv: str, python: Path) -> dict[str, str]:
    """Lock the case's project and fill uv's cache with its wheels (blocking: a thread).

    Returns ``params.environment`` for it, as Strata computes it."""
    directory.mkdir(parents=True, exist_ok=True)
    dependencies = ", ".join(f'"{dependency}"' for dependency in DEPENDENCIES)
    (directory / "pyproject.toml").write_text(
        f'[project]\nname = "bench-env"\nversion = "0.1.0"\n'
        f'requires-python = "=={PYTHON}.*"\ndependencies = [{dependencies}]\n'
    )
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    for args in (["lock"], ["sync", "--frozen", "--no-install-project"]):
        subprocess.run([uv, *args, "--quiet", "--python", str(python)], cwd=directory, env=env,
                       check=True, capture_output=True, timeout=600)  # fmt: skip
    lockfile = (directory / "uv.lock").read_text()
    return {"key": lock_key(lockfile), "python": PYTHON, "lockfile": lockfile,
            "pyproject": (directory / "pyproject.toml").read_text()}  # fmt: skip


@dataclass(slots=True)
class Context:
    client: httpx.AsyncClient
    workdir: Path
    logs: Path
    failures: list[Failure]
    path: str  # PATH for the workers: Python 3.12's bin and uv's directory first
    environment: dict[str, str]
    reference: Path | None


@dataclass(frozen=True, slots=True)
class Expected:
    """What a right answer holds: ``result``'s preview, and (ours only) the manifest's
    ``environment``: ``installed`` true when this answer built it, false after; None when
    the cell ran on the default pool."""

    result: Any
    installed: bool | None
    check_environment: bool = True


def answer_problem(manifest: dict[str, Any], expected: Expected) -> str | None:
    preview = ((manifest.get("variables") or {}).get("result") or {}).get("preview")
    if preview != expected.result:
        return f"result {preview!r}, expected {expected.result!r}"
    if not expected.check_environment:
        return None
    found, installed = manifest.get("environment"), expected.installed
    if installed is None:
        return None if found is None else f"an environment where none was asked: {found!r}"
    if not isinstance(found, dict) or found.get("installed") is not installed:
        return f"environment {found!r}, expected installed={installed}"
    return None


async def _answer(target: HttpTarget, response: httpx.Response) -> httpx.Response:
    """The bundle for a 202: its job polled until it is no longer queued or running."""
    if response.status_code != 202:
        return response
    job_url = target.url + response.json()["job_url"]
    while True:
        await asyncio.sleep(POLL_SECONDS)
        response = await target.client.get(job_url)
        is_json = response.headers.get("content-type", "").startswith("application/json")
        if not (is_json and response.json().get("state") in ("queued", "running")):
            return response


def runner(target: HttpTarget, case: Case, request: PreparedRequest, expected: Expected) -> RunOnce:
    headers = {"content-type": request.content_type}

    async def run() -> Attempt:
        started = time.perf_counter()
        try:
            posted = await target.client.post(
                target.url + "/v1/execute", content=request.body, headers=headers
            )
            response = await _answer(target, posted)
        except httpx.HTTPError as exc:
            return Attempt(time.perf_counter() - started, None, f"transport: {exc!r}")
        seconds = time.perf_counter() - started
        if response.status_code != 200:
            text = response.content[:RESPONSE_CAP].decode("utf-8", "replace")
            return Attempt(seconds, response.status_code, f"HTTP {response.status_code}", text)
        manifest, problem = await asyncio.to_thread(read_manifest, response.content)
        if manifest is not None:
            problem = manifest_problem(case, manifest) or answer_problem(manifest, expected)
        shown = "" if problem is None or manifest is None else repr(manifest)[:RESPONSE_CAP]
        return Attempt(seconds, 200, problem, shown)

    return run


@contextlib.asynccontextmanager
async def _worker(ctx: Context, name: str, root: Path) -> AsyncIterator[HttpTarget]:
    """Ours (one kernel, ``--env-root``) or the reference (``STRATA_WORKER_ENV_ROOT``)."""
    port = free_port()
    env = {**server_env(inline_matplotlib=False), "PATH": ctx.path}
    if name == "reference":
        assert ctx.reference is not None
        argv = reference_argv(ctx.reference, port)
        env["STRATA_WORKER_ENV_ROOT"] = str(root)
    else:
        run_dir = ctx.workdir / f"runs-{root.name}"
        run_dir.mkdir()
        argv = [*our_worker_argv(port, kernels=1, recycle="reset", run_dir=run_dir),
                "--env-root", str(root), "--env-pool-size", "1"]  # fmt: skip
    server = ServerProcess(name, argv, port, ctx.logs / CASE / f"{root.name}.log")
    try:
        await server.start(env, ROOT)
        await server.wait_healthy(ctx.client, 180.0)
        if name != "reference":  # what --env-warm-up makes ahead, made before the first cell
            await _warmed_up(ctx, server.url, 300.0)
        yield HttpTarget(name, server.url, ctx.client, server)
    finally:
        await server.stop()


async def _warmed_up(ctx: Context, url: str, seconds: float) -> None:
    """Wait until our worker's environment warm-up (``/health`` ``environments.warm_up``)
    has ended; it runs beside the serving, and the first request is measured after it."""
    deadline = time.monotonic() + seconds
    while True:
        health = (await ctx.client.get(url + "/health")).json()
        if (health.get("environments") or {}).get("warm_up") != "running":
            return
        if time.monotonic() > deadline:
            raise BenchError("the environment warm-up did not end in time")
        await asyncio.sleep(0.2)


async def _first(ctx: Context, target: HttpTarget) -> dict[str, Any]:
    request = await asyncio.to_thread(prepare_request, FIRST, None, ctx.environment)
    expected = Expected(FIRST_RESULT, installed=True, check_environment=target.name == "ours")
    attempt = await runner(target, FIRST, request, expected)()
    if attempt.problem is not None:
        ctx.failures.append(failure((target.name, FIRST.name, request.description[:2000]), attempt))
        raise BenchError(f"{target.name}: the first request failed: {attempt.problem}")
    first: dict[str, Any] = {"seconds": attempt.seconds}
    if target.name == "ours":  # how much of it was the build (uv), as the worker timed it
        health = (await ctx.client.get(target.url + "/health")).json()
        first["build_seconds"] = (health.get("environments") or {}).get("build_seconds")
    return first


async def _warm_ours(ctx: Context, plan: EnvironmentsPlan, ours: HttpTarget) -> dict[str, Any]:
    env_request, default_request = await asyncio.gather(
        asyncio.to_thread(prepare_request, WARM, None, ctx.environment),
        asyncio.to_thread(prepare_request, WARM, None),
    )
    runs = {"ours_env": runner(ours, WARM, env_request, Expected(ENV_MINOR, installed=False)),
            "ours_default": runner(ours, WARM, default_request,
                                   Expected(sys.version_info.minor, installed=None))}  # fmt: skip
    where = {name: (name, WARM.name, WARM.source) for name in runs}
    return await interleaved_latency(
        runs, reps=plan.cells, burst=0, block=plan.block, budget_seconds=plan.budget_seconds,
        where=where, failures=ctx.failures,
    )  # fmt: skip


async def _warm_reference(
    ctx: Context, plan: EnvironmentsPlan, reference: HttpTarget
) -> dict[str, Any]:
    request = await asyncio.to_thread(prepare_request, WARM, None, ctx.environment)
    return await serial_latency(
        runner(reference, WARM, request, Expected(ENV_MINOR, False, check_environment=False)),
        reps=plan.reference_cells,
        warmups=0, burst=0, budget_seconds=plan.budget_seconds,
        where=("reference_env", WARM.name, WARM.source), failures=ctx.failures,
    )  # fmt: skip


async def _repetition(
    ctx: Context, plan: EnvironmentsPlan, index: int, results: dict[str, Any]
) -> None:
    """One first request per worker, each on a fresh root; the warm series on the last."""
    names = ["ours", *(["reference"] if ctx.reference is not None else [])]
    if index % 2:
        names.reverse()  # who builds first alternates: the page cache favours neither
    last = index == plan.firsts - 1
    for name in names:
        log.info("environments case: %s, first request %d", name, index + 1)
        async with _worker(ctx, name, ctx.workdir / f"envs-{name}-{index}") as target:
            results["first"][name].append(await _first(ctx, target))
            if last and name == "ours":
                results["warm"].update(await _warm_ours(ctx, plan, target))
            elif last:
                results["warm"]["reference_env"] = await _warm_reference(ctx, plan, target)


async def run_environments(
    plan: EnvironmentsPlan, reference: Path | None, workdir: Path, logs: Path,
    failures: list[Failure],
) -> dict[str, Any]:  # fmt: skip
    """The case, or why it was skipped (no Python 3.12 or no uv here)."""
    python, uv = find_python(), await asyncio.to_thread(probe_uv)
    if python is None or uv is None:
        return {"skipped": f"needs Python {PYTHON} and uv on this machine"}
    root = workdir / CASE
    environment = await asyncio.to_thread(lock_project, root / "project", uv, python)
    path = os.pathsep.join([str(python.parent), str(Path(uv).parent), os.environ["PATH"]])
    results: dict[str, Any] = {
        "package": PACKAGE, "python": PYTHON, "key": environment["key"],
        "reference": "started with a fresh STRATA_WORKER_ENV_ROOT" if reference else
        "not run (needs --with-reference: its environment root must be fresh)",
        "first": {"ours": [], "reference": []}, "warm": {},
    }  # fmt: skip
    async with httpx.AsyncClient(timeout=plan.budget_seconds) as client:
        ctx = Context(client, root, logs, failures, path, environment, reference)
        try:
            for index in range(plan.firsts):
                await _repetition(ctx, plan, index, results)
        except (BenchError, TimeoutError, httpx.HTTPError) as exc:
            failures.append(Failure("worker", "setup", CASE, "-", None, repr(exc)))
    results["ratios"] = environments_ratios(results)
    return results
