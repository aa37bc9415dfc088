"""A kernel the fork server forked, as the pool's process sees it: its pid and its exit.

The kernel is adopted by the pool's process where it can be (see ``server.py``); its exit
is seen through a pidfd, or, without one, by looking at it every so often on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

from ..processes import signal_group

ExitCallback = Callable[[int | None], None]

_LOOK_SECONDS = (0.01, 0.5)  # without pidfd: first and largest wait between looks at a kernel


def unwatch_and_close(fd: int | None) -> None:
    """Stop watching ``fd`` on the running loop (if it was) and close it."""
    if fd is None:
        return
    with contextlib.suppress(ValueError, OSError, RuntimeError):
        asyncio.get_running_loop().remove_reader(fd)
    with contextlib.suppress(OSError):
        os.close(fd)


class ForkedKernelProcess:
    """A kernel forked by the fork server and adopted by this process: its pid, its exit."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd: int | None = None
        self._on_exit: ExitCallback | None = None
        self._exited = asyncio.Event()
        self._look: asyncio.TimerHandle | None = None

    def watch(self, on_exit: ExitCallback) -> None:
        """Call ``on_exit(returncode)`` once, when the process has exited (it is reaped).

        Without pidfd (Linux before 5.3, some sandboxes) the process is looked at every so
        often (from 10 ms, doubling, up to 0.5 s), on the loop: reaped if it is this
        process's child, else found gone from ``/proc`` (a zombie counts as gone). A
        waiting thread would hold one of the loop's few worker threads per kernel, and
        told a kernel that is not this process's child (not adopted) dead at once."""
        self._on_exit = on_exit
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfd: look every so often
            started = _stat_and_state(self.pid)
            self._look_again(started[0] if started else None, _LOOK_SECONDS[0])
            return
        asyncio.get_running_loop().add_reader(self._pidfd, self._reap)

    def _look_again(self, started: int | None, seconds: float) -> None:
        self._look = None
        if self._exited.is_set():
            return
        if self._gone(started):
            self._exit_seen()
            return
        later = min(seconds * 2, _LOOK_SECONDS[1])
        loop = asyncio.get_running_loop()
        self._look = loop.call_later(seconds, self._look_again, started, later)

    def _gone(self, started: int | None) -> bool:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # not this process's child: is it still the one running?
            now = _stat_and_state(self.pid)
            return now is None or now[0] != started or now[1] in (b"Z", b"X")
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)
        return bool(pid)

    def _reap(self) -> None:
        self.close()
        self._collect(os.WNOHANG)
        self._exit_seen()

    def _collect(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # never adopted (see _zygote): its status is not ours
            return
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)

    def _exit_seen(self) -> None:
        if not self._exited.is_set():
            self._exited.set()
            if self._on_exit is not None:
                self._on_exit(self.returncode)

    def close(self) -> None:
        fd, self._pidfd = self._pidfd, None
        unwatch_and_close(fd)
        if self._look is not None:
            self._look.cancel()
            self._look = None

    async def wait(self, seconds: float) -> bool:
        """Whether the process exited within ``seconds``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._exited.wait(), seconds)
        return self._exited.is_set()

    def signal_group(self, sig: int) -> None:
        signal_group(self.pid, sig)


def _stat_and_state(pid: int) -> tuple[int, bytes] | None:
    """(start time, state) of ``pid`` from ``/proc/<pid>/stat``; None if it is gone.
    Where there is no ``/proc``, (0, b"R") while a signal can reach it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0, b"R"
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19]), fields[0]
    except (IndexError, ValueError):
        return None
