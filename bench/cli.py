"""``python -m bench``: run the pool-level and worker-level benchmarks in one process tree."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernel_worker.settings import default_run_root

from .chart import write_chart
from .environments import EnvironmentsPlan, run_environments
from .environments_report import environments_lines, environments_targets
from .errors import BenchError, Failure
from .plan import BenchPlan
from .pool_bench import run_pool_bench
from .processes import build_reference, find_reference_bin
from .r_cells import r_lines, r_targets, run_r_cells
from .report import evaluate_targets, render_table
from .template import TemplatePlan, run_template
from .template_report import template_lines, template_targets
from .worker_bench import Reference, WorkerBench, case_names

log = logging.getLogger("bench")

RESULTS = Path(__file__).resolve().parent / "results"
TEMPLATE = "template"  # a case with workers of its own, run after the worker level
ENVIRONMENTS = "environments"  # the same: its workers each need a fresh environment root
R_CELLS = "r"  # the same: R cells, ours and the reference each started alone
OWN_CASES = frozenset({TEMPLATE, ENVIRONMENTS, R_CELLS})
UNCHARTED_CASES = frozenset({"libraries", *OWN_CASES})  # the chart has no panel for these


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Pool-level and worker-level latency/throughput, side by side with the "
        "raw kernel, fresh-kernel mode and (optionally) the reference worker.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a few minutes)")
    parser.add_argument("--full", action="store_true", help="also the 1 GB input/output cases")
    ref = parser.add_mutually_exclusive_group()
    ref.add_argument("--compare-url", metavar="URL", help="a reference worker already running")
    ref.add_argument("--with-reference", action="store_true",
                     help="start strata-worker (see --reference-bin) and stop it afterwards")  # fmt: skip
    parser.add_argument("--reference-bin", metavar="PATH",
                        help="strata-worker executable (default: PATH, then the interop venv)")  # fmt: skip
    parser.add_argument("--only", choices=("pool", "worker"), help="run one level only")
    parser.add_argument("--cases", nargs="+", metavar="NAME",
                        help="only these worker-level cases (e.g. libraries, trivial, churn); "
                        "results go to cases-<names>.json")  # fmt: skip
    parser.add_argument("--results-dir", type=Path, default=RESULTS, metavar="DIR",
                        help="where latest.json and latest.png go (default bench/results)")  # fmt: skip
    return parser


def _reference(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Reference:
    if args.compare_url:
        return Reference(None, args.compare_url)
    if not args.with_reference:
        if args.reference_bin:
            parser.error("--reference-bin needs --with-reference")
        return Reference(None, None)
    binary = find_reference_bin(args.reference_bin)
    if binary is None and not args.reference_bin:  # the interop environment has one
        binary = build_reference()
    if binary is None:
        parser.error(
            "--with-reference: no strata-worker found (it comes with strata-notebook: "
            "scripts/interop-env.sh installs it in .venv-interop/, or give --reference-bin PATH)"
        )
    return Reference(binary, None)


def _cases(args: argparse.Namespace, parser: argparse.ArgumentParser) -> frozenset[str] | None:
    """``--cases`` (names may also be comma-separated), checked against the known names."""
    if not args.cases:
        return None
    if args.only == "pool":
        parser.error("--cases selects worker-level cases: not with --only pool")
    names = frozenset(n for item in args.cases for n in item.split(",") if n)
    known = (*case_names(full=args.full), TEMPLATE, ENVIRONMENTS, R_CELLS)
    unknown = sorted(names - set(known))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(known)}"
                     + ("" if args.full else " (the 1 GB cases need --full)"))  # fmt: skip
    return names


def results_stem(cases: frozenset[str] | None) -> str:
    """``latest`` for a whole run; a selection is kept apart, so it never replaces that."""
    return "latest" if cases is None else "cases-" + "-".join(sorted(cases))


async def _run(
    plan: BenchPlan, reference: Reference, only: str | None, results_dir: Path,
    cases: frozenset[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    failures: list[Failure] = []
    results: dict[str, Any] = {}
    # where the worker puts run directories by default (a tmpfs when there is one): the
    # product as configured, and the same place for the raw baseline's files
    workdir = Path(
        await asyncio.to_thread(tempfile.mkdtemp, "", "kernel-bench-", default_run_root())
    )
    try:
        if only in (None, "pool") and cases is None:
            log.info("pool level")
            results["pool"] = await run_pool_bench(plan.pool, workdir, failures)
        if only in (None, "worker") and (cases is None or cases - OWN_CASES):
            log.info("worker level")
            selected = None if cases is None else cases - OWN_CASES
            bench = WorkerBench(plan, reference, workdir, results_dir / "logs", failures, selected)
            try:
                results["worker"] = await bench.run()
            except BenchError as exc:
                failures.append(Failure("worker", "setup", "-", "-", None, str(exc)))
        if only in (None, "worker") and (cases is None or TEMPLATE in cases):
            log.info("template case: the preload in every kernel, then once for forks of it")
            template = TemplatePlan.make(quick=plan.quick)
            results[TEMPLATE] = await run_template(
                template, workdir, results_dir / "logs", failures
            )
        if only in (None, "worker") and (cases is None or ENVIRONMENTS in cases):
            log.info("environments case: a locked environment, first request and warm cells")
            results[ENVIRONMENTS] = await run_environments(
                EnvironmentsPlan.make(quick=plan.quick), reference.binary, workdir,
                results_dir / "logs", failures,
            )  # fmt: skip
        if only in (None, "worker") and (cases is None or R_CELLS in cases):
            log.info("R case: a trivial R cell, ours beside the reference")
            results[R_CELLS] = await run_r_cells(
                plan.quick, reference.binary, workdir, results_dir / "logs", failures
            )
    finally:
        await asyncio.to_thread(shutil.rmtree, workdir, True)
    results["failures"] = [f.as_dict() for f in failures]
    return results


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _meta(
    args: argparse.Namespace, plan: BenchPlan, cases: frozenset[str] | None, seconds: float,
    load_before: list[float],
) -> dict[str, Any]:  # fmt: skip
    return {
        "mode": ("quick" if plan.quick else "standard") + (" + 1 GB" if plan.full else ""),
        "argv": sys.argv[1:],
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_seconds": round(seconds, 1),
        "reference": bool(args.compare_url or args.with_reference),
        "cases": None if cases is None else sorted(cases),
        "load_before": load_before,
        "load_after": _load(),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    reference = _reference(args, parser)
    cases = _cases(args, parser)
    plan = BenchPlan.make(quick=args.quick, full=args.full)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s bench %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)  # fmt: skip
    logging.getLogger("kernel_pool").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    started = time.monotonic()
    load_before = _load()
    results = asyncio.run(_run(plan, reference, args.only, args.results_dir, cases))
    meta = _meta(args, plan, cases, time.monotonic() - started, load_before)
    results = {"meta": meta, **results}
    results["targets"] = (evaluate_targets(results) + template_targets(results.get(TEMPLATE))
                          + environments_targets(results.get(ENVIRONMENTS))
                          + r_targets(results.get(R_CELLS)))  # fmt: skip
    args.results_dir.mkdir(parents=True, exist_ok=True)
    stem = results_stem(cases)
    json_path, chart_path = (args.results_dir / f"{stem}{ext}" for ext in (".json", ".png"))
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    charted = cases is None or bool(cases - UNCHARTED_CASES)
    if charted:
        with contextlib.suppress(ImportError):
            write_chart(results, chart_path)
    if results.get(TEMPLATE):
        print("\n".join(template_lines(results[TEMPLATE])) + "\n")
    if results.get(ENVIRONMENTS):
        print("\n".join(environments_lines(results[ENVIRONMENTS])) + "\n")
    if results.get(R_CELLS):
        print("\n".join(r_lines(results[R_CELLS])) + "\n")
    print(render_table(results))
    print(f"\nresults: {json_path}" + (f", chart: {chart_path}" if charted else ""))
    if results["failures"]:
        sys.exit(1)
