"""The R case: a trivial R cell on our warm R kernels beside the reference's Rscript per cell.

One worker of each kind, started alone, each sent the same request: ``params.language =
"r"`` and ``result <- 1L``. Ours answers from a warm IRkernel kernel of its R pool (the pool
starts on the first R cell: that request is timed apart, as ``first``); the reference runs
a fresh ``Rscript`` harness per cell. Every answer must be a bundle whose manifest says
``success`` with ``result`` previewed ``1``. Needs R with IRkernel here (skipped, with its
reason, without); the reference needs ``--with-reference``.

Goals (the issue's): the reference's p50 over ours at least 5x, and ours under 100 ms.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx

from kernel_worker.languages.r.support import probe_r

from .cases import Case, manifest_problem, prepare_request, read_manifest
from .errors import Failure
from .measure import RESPONSE_CAP, Attempt, HttpTarget, RunOnce, latency
from .processes import ServerProcess, free_port, our_worker_argv, reference_argv, server_env
from .report import fmt_ratio, fmt_seconds
from .stats import ratio

log = logging.getLogger("bench.r_cells")

ROOT = Path(__file__).resolve().parent.parent
CASE = "r"
CELL = Case(f"{CASE}_trivial", "trivial R cell", "result <- 1L\n", "small")
PREVIEW = "1"
GOAL_RATIO = 5.0
GOAL_P50_SECONDS = 0.1
VERDICTS = {True: "met", False: "MISSED", None: "not run"}


def _runner(target: HttpTarget, body: bytes, content_type: str) -> RunOnce:
    async def run() -> Attempt:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            response = await target.client.post(
                target.url + "/v1/execute", content=body, headers={"content-type": content_type}
            )
        except httpx.HTTPError as exc:
            return Attempt(loop.time() - started, None, f"transport: {exc!r}")
        seconds = loop.time() - started
        if response.status_code != 200:
            text = response.content[:RESPONSE_CAP].decode("utf-8", "replace")
            return Attempt(seconds, response.status_code, f"HTTP {response.status_code}", text)
        manifest, problem = await asyncio.to_thread(read_manifest, response.content)
        if manifest is not None:
            problem = manifest_problem(CELL, manifest)
            preview = manifest["variables"].get("result", {}).get("preview")
            if problem is None and preview != PREVIEW:
                problem = f"result previewed {preview!r}, expected {PREVIEW!r}"
        return Attempt(seconds, 200, problem, "" if problem is None else repr(manifest)[:400])

    return run


async def _series(
    name: str, argv: list[str], port: int, reps: int, logs: Path, failures: list[Failure]
) -> dict[str, Any]:
    request = await asyncio.to_thread(prepare_request, CELL, None, None, "r")
    server = ServerProcess(name, argv, port, logs / CASE / f"{name}.log")
    async with httpx.AsyncClient(timeout=120) as client:
        try:
            await server.start(server_env(inline_matplotlib=False), ROOT)
            await server.wait_healthy(client, 180.0)
            target = HttpTarget(name, server.url, client, server)
            run = _runner(target, request.body, request.content_type)
            return await latency(
                run, reps=reps, warmups=1, burst=0, budget_seconds=240.0,
                where=(name, CELL.name, CELL.source), failures=failures,
            )  # fmt: skip
        finally:
            await server.stop()


async def run_r_cells(
    quick: bool, reference: Path | None, workdir: Path, logs: Path, failures: list[Failure]
) -> dict[str, Any]:
    """The case, or why it was skipped (no R with IRkernel here)."""
    missing = await asyncio.to_thread(probe_r)
    if missing is not None:
        return {"skipped": f"R cells cannot run here: {missing}"}
    run_dir = workdir / "r-runs"
    run_dir.mkdir()
    port = free_port()
    argv = [
        *our_worker_argv(port, kernels=1, recycle="reset", run_dir=run_dir),
        "--r-pool-size",
        "1",
    ]
    results: dict[str, Any] = {"cell": CELL.source.strip()}
    log.info("R case: ours")
    results["ours"] = await _series("ours", argv, port, 40 if quick else 200, logs, failures)
    if reference is None:
        results["reference"] = "not run (needs --with-reference)"
    else:
        log.info("R case: the reference")
        port = free_port()
        reps = 5 if quick else 20
        results["reference"] = await _series(
            "reference", reference_argv(reference, port), port, reps, logs, failures
        )
    results["ratios"] = r_ratios(results)
    return results


def _p50(results: dict[str, Any], name: str) -> float | None:
    series = results.get(name)
    if not isinstance(series, dict):
        return None
    value: float | None = (series.get("latency") or {}).get("p50")
    return value


def r_ratios(results: dict[str, Any]) -> dict[str, float | None]:
    return {"reference_vs_ours": ratio(_p50(results, "reference"), _p50(results, "ours"))}


def r_targets(results: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The issue's goals for R cells, judged on this run (``met: None``: not run)."""
    results = results or {}
    found = (results.get("ratios") or {}).get("reference_vs_ours")
    ours = _p50(results, "ours")
    return [
        {"target": "r: warm trivial R cell, reference vs ours", "goal": ">= 5x",
         "measured": found, "met": None if found is None else found >= GOAL_RATIO},
        {"target": "r: warm trivial R cell on ours, p50", "goal": "< 100 ms",
         "measured": ours, "met": None if ours is None else ours < GOAL_P50_SECONDS},
    ]  # fmt: skip


def r_lines(results: dict[str, Any] | None) -> list[str]:
    """The case's section of the printed table: ours and the reference side by side."""
    if not results:
        return []
    if results.get("skipped"):
        return [f"R CELLS: skipped ({results['skipped']})"]

    def row(label: str, *cells: str) -> str:
        return (f"{label:<46}" + "".join(f"{cell:>14}" for cell in cells)).rstrip()

    def cell(name: str) -> str:
        series = results.get(name)
        summary = (series.get("latency") or {}) if isinstance(series, dict) else {}
        return f"{fmt_seconds(summary.get('p50'))} n={summary.get('count', 0)}"

    def first(name: str) -> str:
        series = results.get(name)
        return fmt_seconds(series.get("first")) if isinstance(series, dict) else "-"

    found = (results.get("ratios") or {}).get("reference_vs_ours")
    ours = _p50(results, "ours")
    met_ratio = None if found is None else found >= GOAL_RATIO
    met_p50 = None if ours is None else ours < GOAL_P50_SECONDS
    lines = [
        row(f"R CELLS: {results.get('cell')}", "ours", "reference", "ratio", "goal"),
        row("first R cell (ours: the R pool starts)", first("ours"), first("reference")),
        row("warm R cell, p50", cell("ours"), cell("reference"), f"{fmt_ratio(found)} r/o",
            f">= 5x {VERDICTS[met_ratio]}"),
        row("  ours under 100 ms", "", "", "", VERDICTS[met_p50]),
    ]  # fmt: skip
    if isinstance(results.get("reference"), str):
        lines.append(f"  reference: {results['reference']}")
    return lines
