"""Worker level: our worker over real HTTP, side by side with its baselines in one run.

Targets, measured case by case in this order so drift hits them alike:

* ``raw``: the same cell on bare kernels (jupyter_client only; see :mod:`bench.cases`);
* ``http``: the same request to a server that only moves the bytes (:mod:`bench.http_floor`);
* ``ours``: ``strata-kernel-worker --recycle reset`` (the product, 2 warm kernels);
* ``fresh``: ``strata-kernel-worker --recycle fresh`` (a new kernel for every cell);
* ``reference``: ``strata-worker`` (started here, or already running at ``--compare-url``).

Then the cases on workers of their own: the preloaded model, churn, memory and the library
matrix (:mod:`bench.library_bench`). ``cases`` (``--cases``) runs a selection of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .cases import PRELOAD_FILE, Case, arrow_stream, prepare_request, raw_source, worker_cases
from .churn import run_churn
from .errors import BenchError, Failure
from .library_bench import run_libraries
from .measure import (
    CpuProbe,
    HttpTarget,
    RunOnce,
    floor_runner,
    http_runner,
    interleaved_latency,
    latency,
    raw_runner,
    throughput,
)
from .memory import run_memory
from .plan import BenchPlan, Reps
from .preloaded import run_preloaded_model
from .processes import (
    ServerProcess,
    free_port,
    our_worker_argv,
    process_cpu,
    reference_argv,
    server_env,
)
from .rawkernel import RawKernel
from .stats import LEAN_TARGETS, TRANSFER_MIN_BYTES, case_ratios, transfer_rates

log = logging.getLogger("bench.worker")

ROOT = Path(__file__).resolve().parent.parent
START_SECONDS = 180.0
_POOLED = ("raw", "http", "ours", *LEAN_TARGETS)  # fast, warm targets: measured interleaved
INTERLEAVE_BLOCK = 5
HTTP_TIMEOUT_SECONDS = 900.0
OWN_WORKER_CASES = ("preloaded_model", "throughput", "churn", "memory", "libraries")


def case_names(*, full: bool) -> tuple[str, ...]:
    """What ``--cases`` can select: the latency cases, then the others in the order they run."""
    return (*(case.name for case in worker_cases(full=full)), *OWN_WORKER_CASES)


@dataclass(frozen=True, slots=True)
class Reference:
    binary: Path | None  # start it ourselves
    url: str | None  # or use one that is already running


@dataclass(slots=True)
class Targets:
    raw: list[RawKernel]
    floor: HttpTarget
    http: list[HttpTarget]
    client: httpx.AsyncClient

    @property
    def by_name(self) -> dict[str, HttpTarget]:
        return {t.name: t for t in self.http}


def _reps(plan: BenchPlan, case: Case) -> Reps:
    return {
        "small": plan.reps_small,
        "medium": plan.reps_medium,
        "large": plan.reps_large,
        "huge": plan.reps_huge,
    }[case.size]


class WorkerBench:
    """Starts the targets, runs every case and the throughput levels, stops everything."""

    def __init__(
        self, plan: BenchPlan, reference: Reference, workdir: Path, logs: Path,
        failures: list[Failure], cases: frozenset[str] | None = None,
    ) -> None:  # fmt: skip
        self.plan = plan
        self.cases = cases  # None: every case
        self.reference = reference
        self.workdir = workdir
        self.logs = logs
        self.failures = failures
        self.described: dict[str, str] = {}

    def _wants(self, name: str) -> bool:
        return self.cases is None or name in self.cases

    async def run(self) -> dict[str, Any]:
        async with contextlib.AsyncExitStack() as stack:
            targets = await self._start(stack)
            cases: dict[str, Any] = {}
            for case in worker_cases(full=self.plan.full):
                if self._wants(case.name):
                    log.info("worker case %s", case.name)
                    cases[case.name] = await self._case(case, targets)
            if self._wants("preloaded_model"):
                log.info("worker case preloaded_model")
                preloaded = await self._guarded("preloaded_model", self._preloaded, targets)
                if preloaded is not None:
                    cases["preloaded_model"] = preloaded
            levels = await self._throughput(targets) if self._wants("throughput") else {}
            churn = memory = libraries = None
            if self._wants("churn"):
                log.info("worker churn: every %dth cell kills its kernel", self.plan.churn.every)
                churn = await self._guarded("churn", self._churn, targets)
            if self._wants("memory"):
                cells = self.plan.memory.cells
                log.info("worker memory: %d trivial cells, one large output", cells)
                memory = await self._guarded("memory", self._memory, targets)
            if self._wants("libraries"):
                log.info("worker libraries: each on a one-kernel worker of its own")
                libraries = await self._guarded("libraries", self._libraries, targets)
        return {
            "kernels": self.plan.kernels,
            "targets": self.described,
            "cases": cases,
            "throughput": levels,
            "transfer": transfer_rates(cases),
            "churn": churn,
            "memory": memory,
            "libraries": libraries,
        }

    # -- targets ---------------------------------------------------------------------------

    async def _start(self, stack: contextlib.AsyncExitStack) -> Targets:
        client = await stack.enter_async_context(
            httpx.AsyncClient(
                timeout=HTTP_TIMEOUT_SECONDS,
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
            )
        )
        port = free_port()
        floor_argv = [sys.executable, "-m", "bench.http_floor", "--port", str(port)]
        floor = ServerProcess("http", floor_argv, port, self.logs / "http.log")
        self.described["http"] = "loopback HTTP only (bench.http_floor): uvicorn + this client"
        servers = [self._our_server("ours", "reset"), self._our_server("fresh", "fresh")]
        if self.reference.binary is not None:
            port = free_port()
            argv = reference_argv(self.reference.binary, port)
            servers.append(ServerProcess("reference", argv, port, self.logs / "reference.log"))
            self.described["reference"] = " ".join(argv)
        for server in servers:
            stack.push_async_callback(server.stop)
            env = server_env(inline_matplotlib=server.name != "reference")
            await server.start(env, ROOT)
        stack.push_async_callback(floor.stop)
        await floor.start(server_env(inline_matplotlib=False), ROOT)
        raw = [RawKernel(self.workdir, f"raw-{i}") for i in range(self.plan.kernels)]
        for kernel in raw:
            stack.push_async_callback(kernel.stop)
        await asyncio.gather(*(k.start() for k in raw))
        await asyncio.gather(*(s.wait_healthy(client, START_SECONDS) for s in [floor, *servers]))
        http = [HttpTarget(s.name, s.url, client, s) for s in servers]
        if self.reference.url is not None:
            http.append(await self._external(client, self.reference.url))
        self.described["raw"] = f"{len(raw)} ipykernel(s) via jupyter_client, no HTTP"
        return Targets(raw, HttpTarget(floor.name, floor.url, client, floor), http, client)

    def _our_server(
        self, name: str, recycle: str, spares: int = 0, preload: Path | None = None
    ) -> ServerProcess:
        port = free_port()
        run_dir = self.workdir / f"runs-{name}"
        run_dir.mkdir()
        argv = our_worker_argv(port, kernels=self.plan.kernels, recycle=recycle, run_dir=run_dir,
                               spares=spares, preload=preload)  # fmt: skip
        self.described[name] = " ".join(argv[1:])
        return ServerProcess(name, argv, port, self.logs / f"{name}.log")

    @contextlib.asynccontextmanager
    async def _servers(
        self, targets: Targets, *specs: tuple[str, str, int, Path | None]
    ) -> AsyncIterator[list[HttpTarget]]:
        """Our workers for one case, ``(name, recycle, spares, preload)`` each; stopped after."""
        async with contextlib.AsyncExitStack() as stack:
            servers = [self._our_server(*spec) for spec in specs]
            for server in servers:
                stack.push_async_callback(server.stop)
                await server.start(server_env(inline_matplotlib=True), ROOT)
            await asyncio.gather(*(s.wait_healthy(targets.client, START_SECONDS) for s in servers))
            yield [HttpTarget(s.name, s.url, targets.client, s) for s in servers]

    # -- cases on workers of their own ------------------------------------------------------

    async def _guarded(
        self, name: str, run: Callable[[Targets], Awaitable[dict[str, Any]]], targets: Targets
    ) -> dict[str, Any] | None:
        """A case whose own workers could not start is reported, and the run goes on."""
        try:
            return await run(targets)
        except (BenchError, TimeoutError) as exc:
            self.failures.append(Failure("worker", "setup", name, "-", None, repr(exc)))
            return None

    async def _preloaded(self, targets: Targets) -> dict[str, Any]:
        specs = [
            ("ours-preload", "reset", 0, PRELOAD_FILE),
            ("fresh-preload", "fresh", 0, PRELOAD_FILE),
        ]
        async with self._servers(targets, *specs) as (ours, fresh):
            reference = targets.by_name.get("reference")
            return await run_preloaded_model(
                self.plan, targets.raw, ours, fresh, reference, self.failures
            )

    async def _churn(self, targets: Targets) -> dict[str, Any]:
        async with self._servers(targets, ("ours-spares1", "reset", 1, None)) as (spares,):
            ours, fresh = targets.by_name["ours"], targets.by_name["fresh"]
            reference = targets.by_name.get("reference")
            return await run_churn(self.plan, spares, ours, fresh, reference, self.failures)

    async def _memory(self, targets: Targets) -> dict[str, Any]:
        async with self._servers(targets, ("ours-memory", "reset", 0, None)) as (ours,):
            reference = targets.by_name.get("reference")
            return await run_memory(self.plan, ours, targets.raw, reference, self.failures)

    async def _libraries(self, targets: Targets) -> dict[str, Any]:
        reference = targets.by_name.get("reference")
        return await run_libraries(self.plan.libraries, targets.client, self.workdir, self.logs,
                                   reference, self.failures)  # fmt: skip

    async def _external(self, client: httpx.AsyncClient, url: str) -> HttpTarget:
        url = url.rstrip("/")
        try:
            health = await client.get(url + "/health", timeout=10.0)
        except httpx.HTTPError as exc:
            raise BenchError(f"--compare-url {url}: {exc!r}") from None
        if health.status_code != 200:
            raise BenchError(f"--compare-url {url}: /health answered {health.status_code}")
        self.described["reference"] = f"{url} (already running, version "
        self.described["reference"] += f"{health.json().get('version', '?')})"
        return HttpTarget("reference", url, client, None)

    # -- cases -------------------------------------------------------------------------------

    async def _runners(
        self, case: Case, targets: Targets, *, floor: bool = True
    ) -> dict[str, tuple[RunOnce, str]]:
        payload = None
        input_path = None
        if case.input_bytes:
            payload = await asyncio.to_thread(arrow_stream, case.input_bytes)
            input_path = self.workdir / f"{case.name}.arrow"
            await asyncio.to_thread(input_path.write_bytes, payload)
        request = await asyncio.to_thread(prepare_request, case, payload)
        del payload
        source = raw_source(case, input_path, self.workdir / f"{case.name}-out.arrow")
        runners = {"raw": (raw_runner(targets.raw, case, source), f"raw kernel: {source!r}")}
        if floor:
            runners["http"] = (floor_runner(targets.floor, case, request), request.description)
        for target in targets.http:
            runners[target.name] = (http_runner(target, case, request), request.description)
        if floor and case.input_bytes + case.output_bytes >= TRANSFER_MIN_BYTES:
            # the same request from the lean client: what the server side itself sustains
            lean = f"{request.description} (lean client)"
            runners["http_lean"] = (floor_runner(targets.floor, case, request, lean=True), lean)
            ours = targets.by_name["ours"]
            runners["ours_lean"] = (http_runner(ours, case, request, lean=True), lean)
        return runners

    async def _case(self, case: Case, targets: Targets) -> dict[str, Any]:
        reps = _reps(self.plan, case)
        runners = await self._runners(case, targets)
        by_target = targets.by_name
        where = {name: (name, case.name, request[:2000]) for name, (_, request) in runners.items()}
        # the fast targets take turns, a few requests at a time: their ratios are the targets'
        pooled = {name: run for name, (run, _) in runners.items() if name in _POOLED}
        results: dict[str, Any] = await interleaved_latency(
            pooled, reps=reps.ours, block=INTERLEAVE_BLOCK,
            # ≥ 100 MB: the smaller sizes already warmed every kernel's imports
            burst=0 if case.heavy else self.plan.kernels,
            budget_seconds=self.plan.case_budget_seconds, where=where, failures=self.failures,
        )  # fmt: skip
        if "ours" in by_target:
            await by_target["ours"].settle()
        for name, (run, _) in runners.items():
            if name in _POOLED:
                continue
            results[name] = await latency(
                run, reps=reps.for_target(name), warmups=0 if case.heavy else 1, burst=0,
                budget_seconds=self.plan.case_budget_seconds, where=where[name],
                failures=self.failures,
            )  # fmt: skip
            if name in by_target:
                await by_target[name].settle()
        return {
            "label": case.label,
            "bytes": case.input_bytes + case.output_bytes,
            "targets": results,
            "ratios": case_ratios(results),
        }

    async def _throughput(self, targets: Targets) -> dict[str, Any]:
        case = worker_cases(full=False)[0]
        runners = await self._runners(case, targets, floor=False)
        by_target = targets.by_name
        tp = self.plan.throughput
        levels: dict[str, Any] = {}
        for clients in tp.clients:
            log.info("worker throughput with %d client(s)", clients)
            level: dict[str, Any] = {}
            for name, (run, request) in runners.items():
                pooled = name in ("raw", "ours")
                level[name] = await throughput(
                    run, clients=clients,
                    max_requests=tp.ours_max if pooled else max(clients, tp.baseline_min),
                    seconds=tp.ours_seconds if pooled else self.plan.case_budget_seconds,
                    where=(name, f"throughput_{clients}", request[:2000]),
                    failures=self.failures, cpu=_cpu_probe(name, targets),
                )  # fmt: skip
                if name in by_target:
                    await by_target[name].settle()
            levels[str(clients)] = level
        return levels


def _cpu_probe(name: str, targets: Targets) -> CpuProbe:
    """Who burns the CPU: this process (the HTTP clients), the server, its kernels."""
    client_pid = os.getpid()
    server = next((t.server for t in targets.http if t.name == name), None)
    kernel_pids = [k.pid for k in targets.raw if k.pid is not None] if name == "raw" else []

    def probe() -> dict[str, float]:
        usage = {"client": process_cpu(client_pid)[0]}
        if server is not None and server.pid is not None:
            own, children = process_cpu(server.pid)
            usage.update(server=own, kernels=children)
        if kernel_pids:
            usage["kernels"] = sum(process_cpu(pid)[0] for pid in kernel_pids)
        return usage

    return probe
