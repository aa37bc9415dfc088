"""One kernel's lifecycle: start, execute, interrupt, kill.

The process itself is started by :mod:`kernel_pool.launch` (forked by the fork server, or
spawned by jupyter_client). A :class:`Kernel` runs one execution at a time; the pool
guarantees that.

Messages are read from the shell and IOPub sockets into one event queue per kernel; the
kernel's death (observed through a pidfd) arrives on the same queue, event-driven, so an
execution waits on exactly one thing.

The start-up steps and what their failures are live in :mod:`kernel_pool.startup`; the
kernel's process tree (its baseline, the strays a cell left, its memory) in
:mod:`kernel_pool.process_tree`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import itertools
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .channels import UNREADABLE, KernelChannels
from .config import PoolConfig
from .errors import ExecutionTimeout, KernelDied
from .forkserver import ForkServer
from .helper_source import HELPER, KERNEL_ARGS, kernel_cwd, kernel_environment, shipped_packages
from .inbox import Inbox
from .kinds import LanguageCode
from .launch import ForkedKernel, KernelProcess, SpawnedKernel
from .leftovers import release_uid
from .messages import RESET_MSG_TYPE, ExecuteResult, InlineReset, Output, library_pids
from .process_tree import Baseline, signal_tree, tree_memory
from .processes import KernelIdentity, kernel_identity
from .replies import OutputCallback, answered_with_iopub, collect, literal, next_event
from .startup import run_startup_code

log = logging.getLogger(__name__)

_ids = itertools.count(1)


class KernelState(enum.Enum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    RESETTING = "resetting"
    RETIRING = "retiring"
    STOPPED = "stopped"


class Kernel:
    """A single kernel process and its client channels."""

    def __init__(
        self,
        config: PoolConfig,
        private_dir: Path,
        kernel_dirs: Sequence[Path],
        slot: str | None,
        on_death: Callable[[Kernel], None] | None = None,
        fork_server: ForkServer | None = None,
        identity: KernelIdentity | None = None,
    ) -> None:
        self.kernel_id = f"k{next(_ids)}"
        self.slot = slot
        self.state = KernelState.STARTING
        self.uses = 0
        self.started_at = time.monotonic()
        self.start_seconds: float | None = None
        # the preload ran once in the fork server's template, not in this kernel
        self.preloaded_in_template = False
        self._config = config
        self._private_dir = private_dir
        self._kernel_dirs = list(kernel_dirs)
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._channels: KernelChannels | None = None
        self._reset_verdicts: dict[str, InlineReset] = {}
        self._inbox = Inbox(self._events, self._reset_verdicts)  # what nobody awaits is dropped
        self._fork_server = fork_server
        self._process: KernelProcess | None = None
        self._exit_code: int | None = None
        self._baseline = Baseline()  # its own processes and threads, after start-up
        # its own uid (kernel_uids), the pool's one kernel user, or none
        self._identity = identity if identity is not None else kernel_identity(config)
        self._own_uid = identity is not None
        self._kernel_dir = private_dir / self.kernel_id
        self._kernel_dir.mkdir(mode=0o700)
        self._tmp_dir = self._kernel_dir / "tmp"  # TMPDIR: emptied by every reset
        self._tmp_dir.mkdir(mode=0o700)
        self.died = asyncio.Event()
        self._on_death = on_death
        self._oversized = False  # it sent more than max_iopub_message in one message
        self._uid_released = False  # its uid's processes and leftovers are gone (once)
        self._kept: set[str] = set()  # folders handed to its uid that outlive it

    # -- start -------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def start(self) -> None:
        """Start the process, run setup code and preload, and capture the baseline."""
        started = time.monotonic()
        try:
            deadline = started + self._config.start_timeout_seconds
            await self._launch(deadline)
            await self._run_startup_code(deadline)
        except BaseException:
            # shielded: a second cancellation of the start must not leave the process running
            await asyncio.shield(self.kill())
            raise
        self.start_seconds = time.monotonic() - started
        self.state = KernelState.IDLE
        log.info(
            "kernel %s ready in %.2fs (slot %s)", self.kernel_id, self.start_seconds, self.slot
        )

    async def _launch(self, deadline: float) -> None:
        if self._identity is not None:
            os.chown(self._kernel_dir, *self._identity)
            os.chown(self._tmp_dir, *self._identity)
        ipykernel = KERNEL_ARGS if self._config.kind.code is None else ()
        arguments = [*ipykernel, *self._config.extra_arguments]
        own_user = self._identity is not None
        env = kernel_environment(
            self._config, self.slot, self._kernel_dir, self._tmp_dir, own_user=own_user
        )
        cwd = kernel_cwd(self._config, self._kernel_dir, own_user=own_user)
        kind = self._config.kind
        if kind.forks and self._fork_server is not None:
            forked = ForkedKernel(self._kernel_dir / "ipc")
            self._process = forked
            self.preloaded_in_template = kind.preload is not None
            await forked.start(
                self._fork_server, arguments, env, cwd, self._identity,
                shipped_packages(self._config), deadline, kind.preload,
                self._config.start_timeout_seconds, kind.entered,
            )  # fmt: skip
        else:
            own_spec = kind.kernel_name is None
            spawned = SpawnedKernel(
                kind.spec_name, self._kernel_dirs if own_spec else None, self._kernel_dir
            )
            self._process = spawned
            await spawned.start(
                arguments, env, cwd, self._identity, self._config.shutdown_timeout_seconds
            )
        self._process.watch(self._on_exit)
        self._channels = KernelChannels(
            self._process.connection_info,
            self._process.session,
            self._deliver,
            max_message=self._config.max_iopub_message,
        )
        await self._wait_ready(deadline)
        if self._identity is not None:  # no file may give a cell another kernel's key
            self._process.forget_connection_file()

    async def _wait_ready(self, deadline: float) -> None:
        """Wait until the kernel answers ``kernel_info`` and its IOPub messages reach us,
        by the start's ``deadline`` (:class:`KernelStartError` then).

        The IOPub subscription may connect after the kernel's first messages (ZMQ's slow
        joiner): a reply whose idle status does not follow soon is asked again. Unlike
        jupyter_client's ``wait_for_ready``, no fixed 0.2 s IOPub flush is waited out
        afterwards (messages of other requests are ignored by ``_collect`` anyway).
        """
        while True:
            msg_id = self._shell().send("kernel_info_request", {})
            self._inbox.sent(msg_id, reply=True)
            with self._inbox.reading():
                if await answered_with_iopub(self._events, msg_id, deadline, self.kernel_id):
                    return

    async def _run_startup_code(self, deadline: float) -> None:
        # a forked kernel has the shipped packages loaded already (see the fork server)
        loaded = self._process is not None and self._process.has_agent
        await run_startup_code(self, self._config, deadline, loaded=loaded)
        self._baseline.capture(self.pid)

    # -- process watching ------------------------------------------------------------------------

    def _on_exit(self, exit_code: int | None) -> None:
        self._exit_code = exit_code
        if not self.died.is_set():
            self.died.set()
            self._events.put_nowait(("died", exit_code))
            if self._on_death is not None and self.state is not KernelState.STOPPED:
                self._on_death(self)

    def _deliver(self, channel: str, msg: dict[str, Any]) -> None:
        if channel == UNREADABLE and msg.get("oversized"):
            self._oversized = True
        self._inbox.deliver(channel, msg)

    def _shell(self) -> KernelChannels:
        if self._channels is None:
            raise KernelDied(self._exit_code)
        return self._channels

    def memory_bytes(self) -> int:
        """Resident memory of the kernel and every process it started."""
        return tree_memory(self.pid)

    @property
    def identity(self) -> KernelIdentity | None:
        return self._identity

    @property
    def own_uid(self) -> int | None:
        """The uid only this kernel runs as (``kernel_uids``), if any."""
        return self._identity[0] if self._own_uid and self._identity is not None else None

    def keep(self, path: str) -> None:
        """A folder handed to this kernel's uid that its owner removes itself (a run
        directory): what the uid left elsewhere is removed when the kernel ends."""
        self._kept.add(os.path.abspath(path))

    def keep_library_processes(self, pids: Iterable[int]) -> None:
        """Count these children (a library's helpers, named by the kernel's reset) as part
        of the baseline: they live as long as the kernel, as in any long-lived interpreter."""
        self._baseline.keep(self.pid, pids)

    def stray_problems(self) -> list[str]:
        """What the kernel cannot see from inside: processes a cell left running."""
        stray = self.stray_children()
        problems = [f"{len(stray)} child process(es) still running"] if stray else []
        if self._oversized:  # what it published was lost: its state is not known
            problems.append("it sent a message over the pool's limit")
        return problems

    def stray_children(self) -> list[int]:
        """Processes started since the baseline that are still alive (see
        :meth:`~kernel_pool.process_tree.Baseline.strays`)."""
        return self._baseline.strays(self.pid, self.own_uid)

    # -- execution ---------------------------------------------------------------------------------

    async def execute(
        self,
        code: str,
        *,
        deadline: float,
        silent: bool = False,
        store_history: bool = True,
        user_expressions: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        buffers: Sequence[bytes | memoryview] = (),
        on_output: OutputCallback | None = None,
        reset_after: bool = False,
        stream_cap: int | None = None,
    ) -> ExecuteResult:
        """Run ``code`` and wait for its reply and idle status, or raise at the deadline.

        ``reset_after``: the kernel resets itself right after replying; wait for its verdict
        with :meth:`reset_verdict`. ``stream_cap``: characters of stdout and of stderr the
        kernel publishes at most; what it drops past them is reported as one
        :data:`~kernel_pool.messages.STREAM_DROPPED_MSG_TYPE` output.
        """
        if self.died.is_set():
            raise KernelDied(self._exit_code)
        started = time.monotonic()
        content = {
            "code": code,
            "silent": silent,
            "store_history": store_history,
            "user_expressions": dict(user_expressions or {}),
            "allow_stdin": False,
            "stop_on_error": False,
        }
        request_metadata = dict(metadata or {})
        asked: dict[str, Any] = {}
        if reset_after:
            asked["reset"] = True
        if stream_cap is not None:
            asked["stream_cap"] = stream_cap
        if self._config.max_iopub_message is not None:  # cut in the kernel, not dropped here
            asked["message_cap"] = self._config.max_iopub_message
        if asked:
            request_metadata["kernel_pool"] = asked
        msg_id = self._shell().send(
            "execute_request", content, metadata=request_metadata, buffers=buffers
        )
        self._inbox.sent(msg_id, reply=True)
        outputs: list[Output] = []
        sink = on_output if on_output is not None else outputs.append
        try:
            with self._inbox.reading():
                reply = await self._collect(msg_id, deadline, sink)
        except TimeoutError:
            with self._inbox.reading():
                await self._timeout_ladder(msg_id, sink)
            raise ExecutionTimeout(max(0.0, deadline - started)) from None
        return ExecuteResult(reply, tuple(outputs), time.monotonic() - started, msg_id)

    async def send(
        self,
        msg_type: str,
        content: Mapping[str, Any],
        *,
        deadline: float,
        buffers: Sequence[bytes | memoryview] = (),
    ) -> tuple[Output, ...]:
        """Send a shell message without a reply (e.g. ``comm_open``/``comm_msg``).

        Returns the IOPub messages the kernel published in response (e.g. the in-kernel
        side's ``comm_msg`` answers) once the kernel is idle again.
        """
        if self.died.is_set():
            raise KernelDied(self._exit_code)
        msg_id = self._shell().send(msg_type, content, buffers=buffers)
        self._inbox.sent(msg_id, reply=False)
        outputs: list[Output] = []
        try:
            with self._inbox.reading():
                await self._collect(msg_id, deadline, outputs.append, reply=False)
        except TimeoutError:
            with self._inbox.reading():
                await self._timeout_ladder(msg_id, outputs.append)
            raise ExecutionTimeout(0.0) from None
        return tuple(outputs)

    async def _collect(
        self, msg_id: str, deadline: float, sink: OutputCallback, *, reply: bool = True
    ) -> Mapping[str, Any]:
        return await collect(
            self._events, msg_id, deadline, sink, self._reset_verdicts, reply=reply
        )

    async def _timeout_ladder(self, msg_id: str, sink: OutputCallback) -> None:
        """Interrupt, give the cell a grace period, then kill the whole process group."""
        self.state = KernelState.RETIRING
        with contextlib.suppress(Exception):
            await self.interrupt()
        grace_deadline = time.monotonic() + self._config.interrupt_grace_seconds
        with contextlib.suppress(TimeoutError, KernelDied):
            await self._collect(msg_id, grace_deadline, sink)
        await self.kill()

    async def interrupt(self) -> None:
        """Send SIGINT to the kernel's process group."""
        if self._process is not None and not self.died.is_set():
            await self._process.interrupt()

    # -- reset and shutdown ----------------------------------------------------------------

    async def reset(self, deadline: float) -> list[str]:
        """Reset to the baseline; return the problems that make this kernel unfit for reuse."""
        code = self._config.kind.code
        if code is not None:
            return await self._reset_language(code, deadline)
        result = await self.execute(
            "", deadline=deadline, silent=True, store_history=False,
            user_expressions={"r": f"{HELPER}.reset()"},
        )  # fmt: skip
        try:
            report = literal(result, "r")
        except (RuntimeError, ValueError, SyntaxError, KeyError) as exc:
            return [f"reset failed: {exc}"]
        self.keep_library_processes(library_pids(report))
        return [str(p) for p in report.get("problems", [])] + self.stray_problems()

    async def _reset_language(self, code: LanguageCode, deadline: float) -> list[str]:
        """The kind's own reset: an error reply names what it could not put back."""
        result = await self.execute(code.reset, deadline=deadline, store_history=False)
        problems = [] if result.ok else [f"reset: {result.reply.get('evalue', '')}".strip()]
        return problems + self.stray_problems()

    async def reset_verdict(self, msg_id: str, deadline: float) -> InlineReset | None:
        """The verdict of the reset the kernel ran after request ``msg_id`` (``reset_after``).

        None if the kernel died or sent none by ``deadline``, or resets only when asked (a
        kind with :attr:`~KernelKind.code` of its own).
        """
        if self._config.kind.code is not None:
            return None
        verdict = self._reset_verdicts.pop(msg_id, None)
        while verdict is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                with self._inbox.reading():
                    channel, msg = await next_event(self._events, remaining)
            except TimeoutError:
                return None
            if channel in ("died", UNREADABLE):  # the full reset decides (and finds it too)
                self._events.put_nowait((channel, msg))
                return None
            parent = msg.get("parent_header", {}).get("msg_id")
            if parent == msg_id and msg["header"]["msg_type"] == RESET_MSG_TYPE:
                verdict = InlineReset.from_content(msg["content"])
        self._reset_verdicts.clear()  # verdicts of requests nobody waits for any more
        return verdict

    async def kill(self) -> None:
        """Kill the kernel, its process group and every descendant; release its resources."""
        self.state = KernelState.STOPPED
        pid = self.pid
        if pid is not None:
            signal_tree(pid, signal.SIGKILL)
        await self._teardown(now=True)

    async def shutdown(self) -> None:
        """Ask the kernel to exit, kill it if it does not within the configured time."""
        self.state = KernelState.STOPPED
        pid = self.pid
        if pid is not None and self.died.is_set():
            signal_tree(pid, signal.SIGKILL)
        try:
            await asyncio.wait_for(
                self._teardown(now=False), self._config.shutdown_timeout_seconds + 1
            )
        except TimeoutError:
            await self.kill()
        if pid is not None:
            signal_tree(pid, signal.SIGKILL)  # children the kernel left behind

    async def _teardown(self, *, now: bool) -> None:
        channels = self._channels
        if self._process is not None:
            # a kernel never reached (no channels) is not asked: it is killed at once
            ask = None
            if channels is not None:
                ask = functools.partial(channels.send, "shutdown_request", {"restart": False})
            await self._process.stop(now=now, grace=self._config.shutdown_timeout_seconds, ask=ask)
            if not self.died.is_set():
                self._on_exit(None)
        if channels is not None:
            channels.close()
            self._channels = None
        uid = self.own_uid
        # all of the kernel, wherever it went, and what its uid left: then the uid is free.
        # Once, while the pool still counts the uid as this kernel's: a second kill (the
        # retirement after a timeout's) must not reach the next kernel of that uid
        if uid is not None and not self._uid_released:
            self._uid_released = True
            await asyncio.to_thread(release_uid, uid, frozenset(self._kept))
        await asyncio.to_thread(shutil.rmtree, self._kernel_dir, True)
