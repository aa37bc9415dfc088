"""The libraries case: retirements and second-run latency per library of the matrix.

For each library of :data:`bench.library_matrix.LIBRARIES`, a worker of ours is started
with one kernel (``--pool-size 1 --recycle reset``) and stopped afterwards, so the first
run is the library's cold import on a kernel that ran nothing else, and every later run
must find that kernel and that module again. Each run starts with the kernel idle (an
untimed wait for its reset, as between a user's runs of a cell). Recorded per library:

* retirements: the growth of ``/health``'s ``pool.retirements`` over the library's runs, by
  reason, and whether ``pid`` (the kernel) and ``warm`` (the module's id) stayed the same;
* latency: the first run (the cold import), the second run, the p50 of the warm runs (the
  second and later) and first/warm;
* the reference's latency for the same cell, when it runs, and ``ref/ours`` on the warm p50.

A cell the reference cannot run (its environment lacks most of these libraries) is shown
as n/a with the reason: a baseline with nothing to compare, not a failure of ours. The goal
is zero retirements over the matrix; a kernel replaced without a retirement counted (its
``pid`` changed) counts as one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .cases import Case, PreparedRequest, manifest_problem, prepare_request, read_manifest
from .errors import BenchError, Failure
from .library_matrix import LIBRARIES, Library
from .measure import RESPONSE_CAP, Attempt, HttpTarget, failure, http_runner, latency
from .plan import LibraryPlan
from .processes import ServerProcess, free_port, our_worker_argv, server_env
from .stats import ratio, result_p50, summarize

log = logging.getLogger("bench.libraries")

ROOT = Path(__file__).resolve().parent.parent
START_SECONDS = 180.0
CASE_NAME = "libraries"


@dataclass(frozen=True, slots=True)
class CellRun:
    """One run of a library's cell on our worker: the attempt, and what the cell bound."""

    attempt: Attempt
    pid: int | None = None
    warm: int | None = None


def library_case(library: Library) -> Case:
    return Case(f"library_{library.name}", library.name, library.cell, "small",
                expect_variable="warm")  # fmt: skip


async def run_cell(target: HttpTarget, case: Case, request: PreparedRequest) -> CellRun:
    """POST the cell; read ``pid`` and ``warm`` from the manifest's previews (untimed)."""
    headers = {"content-type": request.content_type}
    started = time.perf_counter()
    try:
        response = await target.client.post(
            target.url + "/v1/execute", content=request.body, headers=headers
        )
    except httpx.HTTPError as exc:
        return CellRun(Attempt(time.perf_counter() - started, None, f"transport: {exc!r}"))
    seconds = time.perf_counter() - started
    if response.status_code != 200:
        text = response.content[:RESPONSE_CAP].decode("utf-8", "replace")
        return CellRun(Attempt(seconds, response.status_code, f"HTTP {response.status_code}", text))
    manifest, problem = await asyncio.to_thread(read_manifest, response.content)
    if manifest is not None:
        problem = manifest_problem(case, manifest)
    if manifest is None or problem is not None:
        shown = json.dumps(manifest)[:RESPONSE_CAP] if manifest else ""
        return CellRun(Attempt(seconds, 200, problem, shown))
    variables = manifest.get("variables") or {}
    pid, warm = (_preview_int(variables, name) for name in ("pid", "warm"))
    if pid is None or warm is None:
        problem = f"pid/warm are not integers in the manifest: {sorted(variables)}"
        return CellRun(Attempt(seconds, 200, problem))
    return CellRun(Attempt(seconds, 200, None), pid, warm)


def _preview_int(variables: dict[str, Any], name: str) -> int | None:
    preview = (variables.get(name) or {}).get("preview")
    return preview if isinstance(preview, int) and not isinstance(preview, bool) else None


async def _retirements(target: HttpTarget) -> dict[str, int]:
    response = await target.client.get(target.url + "/health", timeout=10.0)
    counts = response.json()["pool"]["retirements"]
    return {str(reason): int(count) for reason, count in counts.items()}


def summarize_ours(
    runs: Sequence[CellRun], before: dict[str, int], after: dict[str, int], problem: str | None
) -> dict[str, Any]:
    """One library on our worker: retirements over its runs and its latencies."""
    grown = {reason: after.get(reason, 0) - count for reason, count in before.items()}
    grown.update({reason: count for reason, count in after.items() if reason not in before})
    retirements = {reason: count for reason, count in grown.items() if count}
    warm = summarize([run.attempt.seconds for run in runs[1:]])
    several = len(runs) >= 2
    return {
        "runs": len(runs),
        "first": runs[0].attempt.seconds if runs else None,
        "second": runs[1].attempt.seconds if several else None,
        "warm": warm.as_dict() if warm else None,
        "retirements": retirements,
        "retired": sum(retirements.values()),
        "same_kernel": len({run.pid for run in runs}) == 1 if several else None,
        "same_module": len({run.warm for run in runs}) == 1 if several else None,
        "problem": problem,
    }


async def measure_ours(
    library: Library, target: HttpTarget, plan: LibraryPlan, failures: list[Failure]
) -> dict[str, Any]:
    """The first run and ``plan.warm_runs`` more, each from an idle kernel."""
    case = library_case(library)
    request = await asyncio.to_thread(prepare_request, case, None)
    where = ("ours", case.name, request.description[:2000])
    before = await _retirements(target)
    runs: list[CellRun] = []
    problem = None
    stop = time.monotonic() + plan.budget_seconds
    for _ in range(1 + plan.warm_runs):
        if len(runs) >= 2 and time.monotonic() > stop:
            break
        await target.settle()  # untimed: the kernel is back (reset, or replaced) and idle
        run = await run_cell(target, case, request)
        if run.attempt.problem is not None:
            failures.append(failure(where, run.attempt))
            problem = run.attempt.problem[:300]
            break
        runs.append(run)
    await target.settle()  # a retirement after the last run's reply counts too
    return summarize_ours(runs, before, await _retirements(target), problem)


async def measure_reference(
    library: Library, target: HttpTarget, plan: LibraryPlan
) -> dict[str, Any]:
    """The same cell on the reference; a cell it cannot run gets its reason, not a failure."""
    case = library_case(library)
    request = await asyncio.to_thread(prepare_request, case, None)
    problems: list[Failure] = []
    result = await latency(
        http_runner(target, case, request), reps=plan.reference_runs, warmups=1, burst=0,
        budget_seconds=plan.budget_seconds, where=("reference", case.name, request.description),
        failures=problems,
    )  # fmt: skip
    await target.settle()
    result["problem"] = problems[0].response.splitlines()[0][:300] if problems else None
    return result


@contextlib.asynccontextmanager
async def one_kernel_worker(
    client: httpx.AsyncClient, workdir: Path, logs: Path, name: str
) -> AsyncIterator[HttpTarget]:
    """Our worker with one kernel (``--recycle reset``), stopped on exit."""
    port = free_port()
    run_dir = workdir / f"runs-library-{name}"
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = our_worker_argv(port, kernels=1, recycle="reset", run_dir=run_dir)
    server = ServerProcess(f"ours-{name}", argv, port, logs / "libraries" / f"{name}.log")
    try:
        await server.start(server_env(inline_matplotlib=True), ROOT)
        await server.wait_healthy(client, START_SECONDS)
        yield HttpTarget("ours", server.url, client, server)
    finally:
        await server.stop()


def library_ratios(ours: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any]:
    """first/warm on ours; the reference's medians over ours' (speed-up, higher is better)."""
    warm = _get(ours, "warm", "p50")
    return {
        "first_vs_warm": ratio(ours.get("first"), warm),
        "reference_vs_ours": ratio(result_p50(reference), warm),
        "reference_first_vs_ours_first": ratio(_get(reference, "first"), ours.get("first")),
    }


def _get(tree: Any, *path: str) -> Any:
    for key in path:
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def retirement_goal(libraries: dict[str, Any]) -> dict[str, Any]:
    """Zero retirements: summed over the libraries measured (a changed pid counts as one)."""
    measured = {name: e["ours"] for name, e in libraries.items() if "retired" in e.get("ours", {})}
    lost = {
        name: max(ours["retired"], 1 if ours["same_kernel"] is False else 0)
        for name, ours in measured.items()
    }
    total = sum(lost.values()) if measured else None
    return {
        "retirements": total,
        "libraries": len(measured),
        "runs": sum(ours["runs"] for ours in measured.values()),
        "retired_libraries": sorted(name for name, count in lost.items() if count),
        "modules_reimported": sorted(
            name for name, ours in measured.items() if ours["same_module"] is False
        ),
        "met": None if total is None else total == 0,
    }


async def run_libraries(
    plan: LibraryPlan, client: httpx.AsyncClient, workdir: Path, logs: Path,
    reference: HttpTarget | None, failures: list[Failure],
    libraries: Sequence[Library] = LIBRARIES,
) -> dict[str, Any]:  # fmt: skip
    """Every library in turn: ours on a worker of its own, then the reference."""
    results: dict[str, Any] = {}
    for library in libraries:
        entry: dict[str, Any] = {"module": library.module}
        results[library.name] = entry
        if not library.installed():
            entry["skipped"] = f"{library.module} is not installed"
            continue
        log.info("library %s", library.name)
        try:
            async with one_kernel_worker(client, workdir, logs, library.name) as ours:
                entry["ours"] = await measure_ours(library, ours, plan, failures)
        except (BenchError, TimeoutError, httpx.HTTPError) as exc:
            failures.append(Failure("worker", "setup", f"library_{library.name}", "-", None,
                                    repr(exc)))  # fmt: skip
            entry["ours"] = {"runs": 0, "problem": repr(exc)[:300]}
        if reference is not None:
            entry["reference"] = await measure_reference(library, reference, plan)
        entry["ratios"] = library_ratios(entry["ours"], entry.get("reference"))
    return {
        "worker": "python -m kernel_worker --pool-size 1 --recycle reset (one per library)",
        "warm_runs": plan.warm_runs,
        "reference_runs": plan.reference_runs,
        "libraries": results,
        "goal": retirement_goal(results),
    }
