"""The pool's side of the fork server (``_zygote.py``, beside this module).

One fork server per pool, started on the first kernel start and again after it dies. It
forks kernels with ipykernel already imported: a kernel start costs a fork and ipykernel's
own initialisation instead of a new interpreter and every import (about 0.35 s of CPU on
these machines, which a 2-core box was spending while other cells waited).

Here: the fork server's process (started, stopped, replaced after it dies), the requests
sent to it, and the adoption of what it forks (this process a child subreaper while a fork
is in flight, and the strays that come with it). A forked kernel's exit is watched by
``forked.py``; the datagrams' framing is ``wire.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import KernelStartError, PreloadError
from ..processes import signal_group
from .forked import ForkedKernelProcess, unwatch_and_close
from .wire import ForkServerLost, encode_request, readable_reply, receive, send_with_fd

log = logging.getLogger(__name__)

_ZYGOTE = Path(__file__).with_name("_zygote.py")
FORK_SERVER_SCRIPT = "kernel_pool/forkserver/_zygote.py"
"""In the command line of a fork server (its kernels show ``python -m ipykernel_launcher …``)."""
_TITLE_ROOM = 2048  # bytes of command line a forked kernel may show
_PATH_VARIABLE = "KERNEL_POOL_TEMPLATE_PATH"  # read (and removed) by _zygote.py

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
_adopting = 0  # forks in flight, over every pool of this process
_subreaper_before = False  # already a subreaper (set by someone else): left as it is
# Sessions of the kernels this process forked (each kernel leads its own), newest last.
_kernel_sessions: dict[int, None] = {}
_PIDS_KEPT = 65536  # of each kind below, oldest forgotten first
_strays: dict[int, int] = {}  # adopted processes still running: pid -> pidfd
# Processes of a kernel's tree killed with it (the ones that escaped its session too), by
# pid and start time: a pid used again later names another process.
_killed_with_kernels: dict[int, int] = {}


@contextlib.contextmanager
def _adopting_orphans() -> Iterator[None]:
    """Be a child subreaper while a fork is in flight: the kernel, orphaned by its
    go-between, becomes this process's child. Only then, so that processes a cell leaves
    behind are not adopted later."""
    global _adopting, _subreaper_before
    _adopting += 1
    if _adopting == 1:
        _subreaper_before = _is_subreaper()
        if not _subreaper_before:
            _set_subreaper(True)
    try:
        yield
    finally:
        _adopting -= 1
        if _adopting == 0:
            if not _subreaper_before:
                _set_subreaper(False)
            _reap_strays()


def _remember_session(kernel_pid: int) -> None:
    _remember(_kernel_sessions, kernel_pid, None)


def killed_with_kernel(pids: Iterable[int]) -> None:
    """Note processes of a kernel's tree that are about to be killed with it: should this
    process adopt them, they are reaped (see :func:`_reap_strays`)."""
    for pid in pids:
        started = _stat(str(pid))
        if started is not None:
            _remember(_killed_with_kernels, pid, started[3])


def _remember(kept: dict[int, Any], pid: int, value: Any) -> None:
    kept[pid] = value
    if len(kept) > _PIDS_KEPT:
        del kept[next(iter(kept))]


def _reap_strays() -> None:
    """Reap what the last adoption window took in besides kernels.

    A kernel that dies while this process is a subreaper (a replacement being forked, as
    after a retirement) leaves its children to this process: a cell's subprocess, killed
    with the kernel's process group or still running. Nothing else waits for them, so each
    would stay a zombie for the worker's life. They are found by their session, a kernel's,
    or, for one that started a session of its own, by having been killed with its kernel.
    """
    me = os.getpid()
    for pid, parent, session, started in _processes():
        if parent != me or pid in _strays:
            continue
        # a kernel leads its session (as the fork server leads its own): never one of them
        in_kernel_session = session in _kernel_sessions and pid != session
        # the same pid and start time: that process, not a later one given its pid
        killed = _killed_with_kernels.get(pid, -1) == started
        if not in_kernel_session and not killed:
            continue
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if not done:
            _watch_stray(pid)


def _watch_stray(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return  # no pidfd: it is reaped by the scan after a later fork, if any
    _strays[pid] = fd
    asyncio.get_running_loop().add_reader(fd, _reap_stray, pid)


def _reap_stray(pid: int) -> None:
    unwatch_and_close(_strays.pop(pid, None))
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _processes() -> Iterator[tuple[int, int, int, int]]:
    """(pid, parent pid, session id, start time) of this process's children (zombies
    included), from /proc: the threads' ``children`` lists, else every process (a few ms)."""
    try:
        pids: set[int] = set()
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children", "rb") as fh:
                pids.update(int(pid) for pid in fh.read().split())
        names: list[str] = [str(pid) for pid in pids]
    except (OSError, ValueError):
        try:
            names = [name for name in os.listdir("/proc") if name.isdigit()]
        except OSError:
            return
    for name in names:
        found = _stat(name)
        if found is not None:
            yield found


def _stat(pid: str) -> tuple[int, int, int, int] | None:
    """(pid, parent pid, session id, start time in clock ticks) from ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session ... starttime": comm may hold spaces and ")"
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(pid), int(fields[1]), int(fields[3]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _prctl(*args: Any) -> int:
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(*args))
    except (OSError, AttributeError):  # not Linux: kernels go to init (no exit status)
        return -1


def _is_subreaper() -> bool:
    flag = ctypes.c_int(0)
    return _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and bool(flag.value)


def _set_subreaper(on: bool) -> None:
    _prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


_ABANDON_WAIT_SECONDS = 5.0


def _kill_orphan(reply: Mapping[str, Any]) -> None:
    """Kill the kernel of a reply nobody waits for any more (with its process group)."""
    pid = reply.get("pid")
    if isinstance(pid, int):
        log.warning("killing kernel %s: its start was abandoned", pid)
        signal_group(pid, signal.SIGKILL)
        ForkedKernelProcess(pid).watch(lambda _: None)  # reaped if this process adopted it


async def _kill_when_forked(asking: asyncio.Future[dict[str, Any]]) -> None:
    """A start cancelled while the fork server forks: its kernel may exist already, and no
    one would own it (a pool closing while a replacement starts left it running for good,
    before its lifeline had begun). It is killed when the reply names it; the cancelled
    start waits a moment for that, so what follows (the pool's close) comes after."""
    asking.add_done_callback(_kill_forked)
    with contextlib.suppress(BaseException):  # (cancelled again: the callback still acts)
        await asyncio.wait({asking}, timeout=_ABANDON_WAIT_SECONDS)


def _kill_forked(asking: asyncio.Future[dict[str, Any]]) -> None:
    if not asking.cancelled() and asking.exception() is None:
        _kill_orphan(asking.result())


class ForkServer:
    """Starts the fork server when first needed; forks kernels from it."""

    def __init__(
        self, env: Mapping[str, str], template: tuple[Path, tuple[Path, ...]] | None = None
    ) -> None:
        """``template``: run another interpreter (without its site-packages) with these
        folders at the end of its ``sys.path``; its kernels are told which environment to
        enter (``spawn``'s ``environment``). ``None``: this interpreter, as it runs here."""
        # ipykernel's debugger support (imported there) warns about frozen modules otherwise
        self._env = {**env, "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
        self._argv = [sys.executable]
        if template is not None:
            python, path = template
            self._argv = [str(python), "-S"]
            self._env[_PATH_VARIABLE] = os.pathsep.join(str(p) for p in path)
        # a preload run here that imports pyplot picks the backend the kernels would
        self._env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        self._templates: set[str] = set()  # preloads that made a template here
        self._prepared: set[str] = set()  # load code the fork server has run
        self._exit_code: int | None = None
        self._lock = asyncio.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._requests = itertools.count(1)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [*self._argv, str(_ZYGOTE), str(theirs.fileno()), " " * _TITLE_ROOM],
                pass_fds=(theirs.fileno(),),
                env=self._env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's ^C is for the worker, not for it
            )
        except OSError as exc:
            ours.close()
            raise KernelStartError(f"fork server could not be started: {exc}") from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        log.info("fork server started (pid %s)", self._process.pid)
        return ours

    async def spawn(
        self,
        argv: list[str],
        env: Mapping[str, str],
        cwd: str,
        identity: tuple[int, int] | None,
        helper: str,
        prepare: str,
        deadline: float,
        template: str | None = None,
        template_timeout: float | None = None,
        connection: Mapping[str, Any] | None = None,
        key_fd: int = -1,
        environment: Mapping[str, Any] | None = None,
    ) -> ForkedKernelProcess:
        """Fork a kernel running ``ipykernel`` with ``argv``; return it once it exists.

        ``prepare``: code the fork server runs once before forking: it loads the shipped
        packages (:func:`kernel_pool.shipping.load_code`), ``helper`` (the pool's in-kernel
        package) among them. Sent on its own the first time (a fork server that has run it
        is not sent it again), so that with the kernel's environment it never makes one
        datagram too large for the socket.
        ``template``: the preload, run once in the fork server; its namespace is every
        kernel's user namespace. :class:`PreloadError` if it fails, cannot be forked, or
        runs past ``template_timeout`` (the fork server is then stopped).
        ``connection``: the kernel's connection info without a key; the kernel writes the
        key it makes into ``key_fd`` (a pipe's write end, passed on to it).
        ``environment``: for a template of another interpreter, the environment the kernel
        enters (``site_packages``, ``prefix``, ``executable``).
        """
        request = {
            "argv": argv, "env": dict(env), "cwd": cwd, "helper": helper,
            "uid": identity[0] if identity else None, "gid": identity[1] if identity else None,
            "template": template or "", "connection": dict(connection or {}),
            "environment": dict(environment or {}),
        }  # fmt: skip
        new_template = bool(template) and template not in self._templates
        async with self._lock:
            with _adopting_orphans():
                asking = asyncio.ensure_future(
                    self._ask(request, prepare, deadline, new_template, key_fd)
                )
                try:
                    reply = await asyncio.shield(asking)
                except asyncio.CancelledError:
                    if new_template:  # the preload may run for minutes: stop it now
                        asking.cancel()
                        await self._stop(now=True)
                    else:
                        await _kill_when_forked(asking)
                    raise
                except ForkServerLost as exc:
                    if not new_template:
                        raise
                    raise PreloadError(self._preload_lost(exc, template_timeout)) from exc
                if isinstance(reply.get("pid"), int):
                    _remember_session(reply["pid"])
        if "preload_error" in reply:
            raise PreloadError(str(reply["preload_error"]))
        if template and "pid" in reply:
            self._templates.add(template)
        if "pid" not in reply:
            raise KernelStartError(f"fork server could not fork a kernel: {reply.get('error')}")
        return ForkedKernelProcess(int(reply["pid"]))

    async def warm(self, prepare: str, deadline: float) -> None:
        """Start the fork server and load the shipped packages, ahead of the first fork."""
        async with self._lock:
            sock = self._sock if self._alive() else None
            if sock is None:
                await self._stop()
                sock = self._start()
            if prepare in self._prepared:
                return
            try:
                reply = await self._exchange(sock, {"prepare": prepare}, deadline, -1)
            except TimeoutError:
                await self._stop(now=True)
                raise KernelStartError("fork server did not load the packages in time") from None
            except OSError as exc:
                await self._stop()
                raise KernelStartError(f"fork server could not be reached: {exc}") from exc
            if "error" in reply:
                raise KernelStartError(f"fork server could not load the packages: {reply['error']}")
            self._prepared.add(prepare)

    def _preload_lost(self, exc: ForkServerLost, timeout: float | None) -> str:
        if exc.timed_out:
            limit = f" ({timeout:g}s)" if timeout is not None else ""
            return f"it did not finish within the kernel start timeout{limit}"
        if exc.unreadable:
            return "the template's answer could not be read"
        return f"the template died running it (exit status {self._exit_code})"

    async def _ask(
        self,
        request: dict[str, Any],
        prepare: str,
        deadline: float,
        new_template: bool,
        key_fd: int,
    ) -> dict[str, Any]:
        """Send one request (after ``prepare``, if this fork server has not run it), wait
        for its reply (by id).

        A request abandoned while waiting (timed out, cancelled) leaves its reply behind: it
        is read by a later request, and the kernel it names, which nobody owns, is killed.
        """
        sock = self._sock if self._alive() else None
        if sock is None:
            await self._stop()
            sock = self._start()
        # this process adopts it: it watches this process, as a spawned kernel does
        request["env"]["JPY_PARENT_PID"] = str(os.getpid())
        try:
            if prepare not in self._prepared:
                reply = await self._exchange(sock, {"prepare": prepare}, deadline, -1)
                if "error" in reply:
                    return reply
                self._prepared.add(prepare)
            return await self._exchange(sock, request, deadline, key_fd)
        except TimeoutError:
            if new_template:  # still running the preload: it would answer nobody
                await self._stop(now=True)
            raise ForkServerLost("fork server did not answer in time", timed_out=True) from None
        except OSError as exc:  # the socket broke: start afresh next time
            await self._stop()
            raise KernelStartError(f"fork server could not be reached: {exc}") from exc

    async def _exchange(
        self, sock: socket.socket, request: dict[str, Any], deadline: float, fd: int
    ) -> dict[str, Any]:
        """Send ``request`` (with ``fd`` attached) and wait for the reply to it."""
        request_id = request["id"] = next(self._requests)
        loop = asyncio.get_running_loop()
        await send_with_fd(loop, sock, encode_request(request), fd)
        while True:
            data = await receive(loop, sock, deadline)
            if not data:
                await self._stop()
                raise ForkServerLost("fork server exited")
            reply = readable_reply(data)
            if reply is None:  # its state is not known any more: start afresh next time
                await self._stop(now=True)
                raise ForkServerLost("fork server sent an unreadable reply", unreadable=True)
            if reply.get("id") == request_id:
                return reply
            _kill_orphan(reply)

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    async def _stop(self, *, now: bool = False) -> None:
        if self._sock is not None:
            self._sock.close()  # the fork server exits when it sees the end of its socket
            self._sock = None
        process, self._process = self._process, None
        if process is None:
            return
        self._templates.clear()  # a new fork server runs the preload again
        self._prepared.clear()  # and loads the packages again
        if now:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
        try:
            self._exit_code = await asyncio.wait_for(asyncio.to_thread(process.wait), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            self._exit_code = await asyncio.to_thread(process.wait)

    async def aclose(self) -> None:
        """Stop the fork server (the kernels it forked are not its children: they live on)."""
        async with self._lock:
            await self._stop()
