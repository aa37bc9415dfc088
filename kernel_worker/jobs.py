"""Executions as jobs: each runs in the background and is answered inline or by polling.

Every admitted execution becomes a :class:`Job`. The request that submitted it waits a short
while (``--queue-wait``) for a kernel; if the job is still queued then, the request answers
``202`` with a ``job_url`` that Strata's client polls (queue time never counts against the
cell's own timeout). A job whose result was collected, or that nobody collected within the
TTL, is removed along with its run directory. Beyond ``--queue-depth`` queued jobs, new
requests get ``503``. A job's id starts with the worker's id (``--worker-id``), so that in a
fleet the worker a poll reaches can tell whose job it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from .cancellation import cancel_and_wait
from .errors import Cancelled, WorkerBusy, WorkerError
from .protocol.streaming import BundleStream
from .runs.directory import RunDir
from .runs.live import LiveConsole

log = logging.getLogger(__name__)


JobResult = bytes | BundleStream | dict[str, object]
"""A bundle (bytes when small, else a stream) or, for pull runs, the JSON answer."""


@dataclass(eq=False, slots=True)
class Execution:
    """One admitted execution: what the cancel route needs to stop it."""

    build_id: str | None
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    stoppable: bool = True
    """False once a cancel would stop nothing (a pull run delivering its finished bundle)."""
    admitted_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    """When it got its kernel (monotonic), once it has."""
    phase: str | None = None
    """What it waits on before its kernel, said to whoever polls (``building environment``)."""
    console: LiveConsole = field(default_factory=LiveConsole)
    """The tail of its console while it runs, for ``GET /v1/executions/{id}/console``."""


class JobState(enum.Enum):
    QUEUED = "queued"
    PROVISIONING = "provisioning"  # a pull run fetching its inputs, before it waits for a kernel
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(eq=False, slots=True)
class Job:
    """One execution, from submission until its result is collected or expires."""

    job_id: str
    execution: Execution
    run_dir: RunDir
    state: JobState = JobState.QUEUED
    result: JobResult | None = None
    error: WorkerError | None = None
    submitted_at: float = field(default_factory=time.monotonic)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    handed_off: bool = False
    """Answered ``202``: its result waits for a poll, its submitter is gone."""
    abandoned: bool = False
    """Its submitter stopped before answering: removed as soon as it ends (no poll comes)."""
    polled_at: float | None = None
    """When a client last polled it (monotonic), if ever."""
    _expiry: asyncio.TimerHandle | None = None
    _run_dir_removed: bool = False

    def mark_running(self) -> None:
        self.state = JobState.RUNNING
        self.execution.started_at = time.monotonic()
        self.started.set()

    def mark_provisioning(self, provisioning: bool) -> None:
        """A pull run fetching its inputs (True), or done with that and queued (False)."""
        if self.state in (JobState.QUEUED, JobState.PROVISIONING):
            self.state = JobState.PROVISIONING if provisioning else JobState.QUEUED


Runner = Callable[[Job], Awaitable[JobResult]]
POLLING_SECONDS = 5.0
"""A job polled this recently has a client still after it (Strata's client polls every 1 s)."""
_WAITING = (JobState.QUEUED, JobState.PROVISIONING)


class JobQueue:
    """The jobs of one worker, with a bound on how many may wait for a kernel."""

    def __init__(self, *, max_queued: int, ttl_seconds: float, worker_id: str = "") -> None:
        self._jobs: dict[str, Job] = {}
        # job ids are "<worker id>.<random>": any worker of a fleet can tell whose a job is
        self._id_prefix = f"{worker_id}." if worker_id else ""
        self._left = asyncio.Event()  # set whenever a job leaves (collected or expired)
        self._max_queued = max_queued
        self._ttl_seconds = ttl_seconds

    @property
    def queued(self) -> int:
        return sum(1 for job in self._jobs.values() if job.state is JobState.QUEUED)

    @property
    def uncollected(self) -> int:
        """Ended jobs answered ``202`` whose client is polling for the result: one polled
        within :data:`POLLING_SECONDS` (a job nobody polls any more was abandoned)."""
        recently = time.monotonic() - POLLING_SECONDS
        return sum(
            1
            for job in self._jobs.values()
            if job.handed_off
            and job.done.is_set()
            and job.polled_at is not None
            and job.polled_at >= recently
        )

    async def collected(self) -> None:
        """Wait until no ended job answered ``202`` is being polled for any more."""
        while self.uncollected:
            self._left.clear()
            with contextlib.suppress(TimeoutError):  # its poller may also just stop
                await asyncio.wait_for(self._left.wait(), POLLING_SECONDS / 5)

    def position(self, job: Job) -> int | None:
        """1-based place in line of a queued job (None once it runs)."""
        if job.state is not JobState.QUEUED:
            return None
        waiting = [j for j in self._jobs.values() if j.state is JobState.QUEUED]
        waiting.sort(key=lambda j: j.submitted_at)
        return waiting.index(job) + 1

    def is_own(self, job_id: str) -> bool:
        """Whether ``job_id`` is, or was, one of this worker's (it starts with its id)."""
        return bool(self._id_prefix) and job_id.startswith(self._id_prefix)

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def submit(self, execution: Execution, run_dir: RunDir, runner: Runner) -> Job:
        """Start ``runner(job)`` in the background, or raise :class:`WorkerBusy` if full."""
        # a pull run fetching its inputs will wait for a kernel next: it counts here
        waiting = sum(1 for job in self._jobs.values() if job.state in _WAITING)
        if waiting >= self._max_queued:
            raise WorkerBusy(f"Worker queue is full ({self._max_queued} executions waiting)")
        job = Job(self._id_prefix + secrets.token_urlsafe(16), execution, run_dir)
        self._jobs[job.job_id] = job
        job.task = asyncio.ensure_future(self._run(job, runner))
        return job

    async def _run(self, job: Job, runner: Runner) -> None:
        try:
            job.result = await runner(job)
            job.state = JobState.FINISHED
        except WorkerError as exc:
            job.error, job.state = exc, JobState.FAILED
        except asyncio.CancelledError:  # recorded for a poller, and raised: ends the task
            job.error, job.state = Cancelled("execution was cancelled"), JobState.FAILED
            raise
        except Exception:
            log.exception("job %s failed unexpectedly", job.job_id)
            job.error, job.state = WorkerError("internal error"), JobState.FAILED
        finally:
            job.started.set()
            job.done.set()
            job._expiry = asyncio.get_running_loop().call_later(
                self._ttl_seconds, self.release, job
            )  # uncollected results expire
            if job.abandoned:
                self.release(job)
            elif job.handed_off:
                self._remove_unneeded_run_dir(job)

    def hand_off(self, job: Job) -> None:
        """``job`` was answered ``202``: a poll collects its result, maybe never.

        Its run directory (inputs of up to gigabytes, on a memory filesystem by default) is
        removed as soon as the job ends, unless the result is still to be written from it;
        the result itself (a small bundle, a pull run's answer, an error) waits for the poll.
        """
        job.handed_off = True
        # the 202 counts as a poll: its client polls within a second, and a drain must wait
        # for it even when the job ends before that first poll
        job.polled_at = time.monotonic()
        if job.done.is_set():
            self._remove_unneeded_run_dir(job)

    @contextlib.contextmanager
    def awaited(self, job: Job) -> Iterator[None]:
        """The submitter of ``job`` waits for it (then answers inline, or hands it off).

        Should the submitter stop first (its task cancelled, an error), nobody will collect
        the result: the job is cancelled and, as soon as it has ended, forgotten and its run
        directory removed, instead of both waiting for the TTL.
        """
        try:
            yield
        except BaseException:
            self.abandon(job)
            raise

    def abandon(self, job: Job) -> None:
        """Nobody will collect ``job``: cancel it and remove it once it has ended (a job
        answered ``202``, or already being delivered, is left as it is)."""
        if job.handed_off or job.job_id not in self._jobs:
            return
        job.abandoned = True
        job.execution.cancel.set()
        if job.done.is_set():
            self.release(job)

    def _remove_unneeded_run_dir(self, job: Job) -> None:
        if not isinstance(job.result, BundleStream):  # else it is written from there
            _remove_run_dir(job)

    def claim(self, job: Job) -> bool:
        """Take ``job`` out of the registry (its result is being delivered); False if gone.

        The caller deletes the run directory once the delivery is done.
        """
        if self._jobs.pop(job.job_id, None) is None:
            return False
        self._left.set()
        if job._expiry is not None:
            job._expiry.cancel()
        return True

    def release(self, job: Job) -> None:
        """Forget ``job`` and delete its run directory (after delivery, or at expiry).

        Call it on the event loop's thread; the directory is removed in the background.
        """
        if self._jobs.pop(job.job_id, None) is None:
            return
        self._left.set()
        if job._expiry is not None:
            job._expiry.cancel()
        _remove_run_dir(job)

    async def aclose(self) -> None:
        """Cancel every job and remove what they left."""
        jobs = list(self._jobs.values())
        for job in jobs:
            job.execution.cancel.set()
        try:
            await cancel_and_wait(*[job.task for job in jobs if job.task is not None])
        finally:
            for job in jobs:
                self.release(job)


def _remove_run_dir(job: Job) -> None:
    """Remove ``job``'s run directory once, in the background (it may be large)."""
    if not job._run_dir_removed:
        job._run_dir_removed = True
        asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, job.run_dir.root, True)
