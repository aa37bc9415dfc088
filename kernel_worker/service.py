"""One execution from admission to bundle, shared by every execute route.

Admission (a job, waiting for a kernel as long as it is queued), the cell, cancellation
(the cancel route or a disconnected client set the execution's event; a running kernel is
then retired), and writing the bundle from the run directory.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path

from zlib_ng import zlib_ng

from kernel_pool import PoolClosed

from .cancellation import unless_cancelled
from .errors import CellTimedOut, KernelCrashed, WorkerBusy, storage_checked
from .execution import ConsoleListener, run_cell
from .jobs import Execution, Job, JobResult
from .mounts.materialize import materialize, sync_back
from .protocol.bundle import CellOutcome, bundle_bytes, stored_bundle_length, write_bundle
from .protocol.envelopes import CellRequest
from .protocol.streaming import BundleStream
from .runs import files as run_files
from .runs.directory import SMALL_IO_BYTES, RunDir, offload
from .runs.reuse import ReusableFiles, new_file
from .state import WorkerState

log = logging.getLogger(__name__)


def _type_name(name: str | None) -> str:
    """An exception's class name for the log, when it looks like one (it is the cell's)."""
    if name and len(name) <= 80 and all(part.isidentifier() for part in name.split(".")):
        return name
    return "an error"


CANCELLED_DETAIL = "execution was cancelled"
AfterCell = Callable[[CellOutcome], Awaitable[CellOutcome]]
"""Adjusts a finished cell's outcome before it is bundled (e.g. files sent elsewhere)."""
IN_MEMORY_BUNDLE_BYTES = 1024 * 1024
COMPRESS_UP_TO_BYTES = 8 * 1024 * 1024
ALWAYS_COMPRESS_BYTES = 64 * 1024
DEFLATE_LEVEL = 2  # see _auto_level
_SAMPLE_BYTES = 16 * 1024  # deflating it costs well under 0.5 ms
_WORTH_COMPRESSING = 0.8  # a sample must shrink below this fraction of its size


def submit(state: WorkerState, cell: CellRequest, run_dir: RunDir) -> Job:
    """Admit a push-model ``cell`` as a job whose result is its bundle."""

    async def work(execution: Execution, job: Job) -> JobResult:
        bundle = await execute_to_bundle(
            state,
            cell,
            run_dir,
            execution,
            on_start=job.mark_running,
            in_memory_limit=IN_MEMORY_BUNDLE_BYTES,
            stream=True,
        )
        assert not isinstance(bundle, Path)  # streamed: never a file
        return bundle

    return submit_work(state, cell.build_id, run_dir, work)


def submit_work(
    state: WorkerState,
    build_id: str | None,
    run_dir: RunDir,
    work: Callable[[Execution, Job], Awaitable[JobResult]],
) -> Job:
    """Admit ``work`` as a job (raises :class:`WorkerBusy` when the queue is full).

    The execution counts as active, and can be cancelled by ``build_id``, until it ends.
    """
    execution = state.admit(build_id)

    async def runner(job: Job) -> JobResult:
        try:
            return await work(execution, job)
        finally:
            state.discharge(execution)

    try:
        return state.jobs.submit(execution, run_dir, runner)
    except BaseException:
        state.discharge(execution)
        raise


async def execute_to_bundle(
    state: WorkerState,
    cell: CellRequest,
    run_dir: RunDir,
    execution: Execution,
    *,
    console: ConsoleListener | None = None,
    on_start: Callable[[], None] | None = None,
    in_memory_limit: int = 0,
    stream: bool = False,
    after_cell: AfterCell | None = None,
) -> Path | bytes | BundleStream:
    """Lease a kernel (waiting as long as needed), run the cell, write the bundle.

    A bundle whose contents are under ``in_memory_limit`` bytes is returned as bytes (no
    file to write, stat and stream back); a larger one as the path of its file or, with
    ``stream``, as a :class:`BundleStream` that writes it while it is sent.
    """

    async def body() -> Path | bytes | BundleStream:
        # remote data is fetched before a kernel is held, and synced back after it is free
        mounted = await materialize(cell.mounts, run_dir.root, state.mount_cache)
        try:
            async with state.pool.lease() as lease:
                if on_start is not None:
                    on_start()
                with _observed(state) as observe:
                    outcome = await run_cell(
                        lease, cell, run_dir, state.context, console=console, mounts=mounted.paths
                    )
                    observe("success" if outcome.success else "cell_error")
                if not outcome.success:  # the exception's type only: its message may hold data
                    log.info("the cell raised %s", _type_name(outcome.error_type))
        except PoolClosed:
            raise WorkerBusy("Worker is shutting down") from None
        if outcome.success:
            writes = await sync_back(cell.mounts, mounted) if cell.mounts else []
            outcome = replace(outcome, mount_bytes=dict(mounted.mount_bytes), mount_writes=writes)
        if after_cell is not None:
            outcome = await after_cell(outcome)
        # a few small files on a memory-backed run dir: cheaper to bundle than to hand over
        payload = None
        if state.context.inline_io and not outcome.output_dirs:
            payload = _payload_bytes(run_dir, outcome)
        with storage_checked("the cell's bundle"):
            bundle = await offload(
                payload is not None and payload <= SMALL_IO_BYTES,
                _write, run_dir, outcome, state.settings.bundle_compresslevel, in_memory_limit,
                payload, state.metrics.bytes_out.inc if stream else None, state.context.reuse,
            )  # fmt: skip
        if not isinstance(bundle, BundleStream):  # a stream counts its bytes as they go
            size = len(bundle) if isinstance(bundle, bytes) else bundle.stat().st_size
            state.metrics.bytes_out.inc(size)
        return bundle

    # the cancel route or a client gone: the lease is cancelled, its kernel retired
    return await unless_cancelled(body(), execution.cancel, CANCELLED_DETAIL)


@contextlib.contextmanager
def _observed(state: WorkerState) -> Iterator[Callable[[str], None]]:
    """Time one execution into the histogram, labelled by how it ended."""
    started = time.monotonic()
    outcome = "cancelled"

    def observe(label: str) -> None:
        nonlocal outcome
        outcome = label

    try:
        yield observe
    except CellTimedOut:
        outcome = "timeout"
        raise
    except KernelCrashed:
        outcome = "kernel_died"
        raise
    finally:
        state.metrics.executions.labels(outcome).observe(time.monotonic() - started)


async def execute_to_bundle_file(
    state: WorkerState,
    cell: CellRequest,
    run_dir: RunDir,
    execution: Execution,
    *,
    console: ConsoleListener | None = None,
    after_cell: AfterCell | None = None,
    on_start: Callable[[], None] | None = None,
) -> Path:
    """:func:`execute_to_bundle`, always as a file (for uploads that stream from disk)."""
    bundle = await execute_to_bundle(
        state, cell, run_dir, execution, console=console, after_cell=after_cell,
        on_start=on_start,
    )  # fmt: skip
    assert isinstance(bundle, Path)
    return bundle


def _write(
    run_dir: RunDir,
    outcome: CellOutcome,
    compresslevel: int | None,
    in_memory_limit: int,
    payload: int | None = None,
    stream_counting: Callable[[int], object] | None = None,
    reuse: ReusableFiles | None = None,
) -> Path | bytes | BundleStream:
    """Write the bundle (blocking): in memory when small, else to ``bundle.tar.gz``, or
    (given ``stream_counting``, told each chunk's size) not yet: a stream that writes it.

    ``payload``: the bytes it will hold, when already counted (see _payload_bytes).
    """
    if payload is None:
        payload = _payload_bytes(run_dir, outcome)
    level = compresslevel if compresslevel is not None else _auto_level(run_dir, payload)
    if payload < in_memory_limit:
        return bundle_bytes(run_dir.root, outcome, compresslevel=level)
    if stream_counting is not None:
        write = functools.partial(write_bundle, run_dir.root, outcome, compresslevel=level)
        # a stored bundle's length is known up front: sent with it, not chunked
        length = stored_bundle_length(run_dir.root, outcome) if level == 0 else None
        return BundleStream(write, length=length, on_bytes=stream_counting)
    path = run_dir.bundle_file
    # a stored bundle's length is known: a kept file that fits it can take it
    expected = stored_bundle_length(run_dir.root, outcome) if level == 0 and reuse else None
    with new_file(path, reuse, expected) as fh:
        write_bundle(run_dir.root, outcome, fh, compresslevel=level)
        fh.truncate()  # over a kept file: cut at what was written
    return path


def _payload_bytes(run_dir: RunDir, outcome: CellOutcome) -> int:
    files = _run_files(run_dir)
    return len(outcome.stdout) + len(outcome.stderr) + sum(size for _path, size in files)


def _run_files(run_dir: RunDir) -> list[tuple[list[str], int]]:
    """(path parts, size) of every regular file the bundle may take from the run directory
    (reached through no link: see run_files)."""
    found: list[tuple[list[str], int]] = []
    for folder in (run_dir.files, run_dir.display, run_dir.dirs):
        with contextlib.suppress(OSError):
            for rel, (size, _mtime) in run_files.regular_files(run_dir.root, [folder.name]).items():
                found.append(([folder.name, *rel.split("/")], size))
    return found


def _auto_level(run_dir: RunDir, payload: int) -> int:
    """The gzip level, chosen by measurement.

    Deflating is zlib-ng's, whose level 2 both shrinks more than zlib's level 1 and runs
    1.6-2x faster (JSON: ratio 0.126 at ~500 MB/s, zlib 0.130 at ~240; Arrow of random
    floats: 0.474 at ~100 MB/s, zlib 0.481 at ~60); its level 1 is faster again but shrinks
    JSON 40 % less. Small bundles (manifest, console, a few values) always get it. Past
    that, binary outputs (Arrow, pickles, PNG) barely shrink: a sample of the largest file
    decides, and bundles over ``COMPRESS_UP_TO_BYTES`` are always stored (level 0) so they
    stream at memory speed.
    """
    if payload <= ALWAYS_COMPRESS_BYTES:
        return DEFLATE_LEVEL
    if payload > COMPRESS_UP_TO_BYTES:
        return 0
    sample = _sample_of_largest(run_dir)
    if not sample:
        return DEFLATE_LEVEL
    compressed = len(zlib_ng.compress(sample, DEFLATE_LEVEL))
    return DEFLATE_LEVEL if compressed <= len(sample) * _WORTH_COMPRESSING else 0


def _sample_of_largest(run_dir: RunDir) -> bytes:
    files = _run_files(run_dir)
    if not files:
        return b""
    largest, size = max(files, key=lambda entry: entry[1])
    try:
        with run_files.open_regular(run_dir.root, largest) as fh:
            fh.seek(max(0, size // 2 - _SAMPLE_BYTES // 2))  # past any header
            return fh.read(_SAMPLE_BYTES)
    except OSError:
        return b""
