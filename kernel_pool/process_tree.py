"""One kernel's process tree, as seen from outside the kernel.

The baseline is captured once start-up has ended: the kernel's children then, and the
threads of its own machinery (ZMQ I/O, heartbeat, IOPub, control), which never run cell
code; children a library keeps for the kernel's life join it later. Processes beyond the
baseline are strays, which a cell left running and the kernel's own reset cannot see. Here
too: the tree's resident memory, and a signal sent to all of it.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterable

import psutil

from .forkserver import killed_with_kernel
from .processes import descendants, processes_of_uid, signal_group, threads_of


class Baseline:
    """What a kernel runs of its own, not left by a cell (empty until :meth:`capture`)."""

    def __init__(self) -> None:
        self._children: frozenset[int] = frozenset()
        self._infrastructure_threads: frozenset[int] = frozenset()

    def capture(self, pid: int | None) -> None:
        """Take the kernel's children and threads now as its own (its start-up is over)."""
        self._children = frozenset(_children(pid))
        if pid is not None:
            # the kernel's own machinery never runs cell code: after each cell only the main
            # thread and newer threads are looked at
            self._infrastructure_threads = threads_of(pid) - {pid}

    def keep(self, pid: int | None, pids: Iterable[int]) -> None:
        """Count these children (a library's helpers) as the kernel's own: they live as long
        as the kernel, as in any long-lived interpreter."""
        children = set(_children(pid))
        self._children |= {p for p in pids if p in children}

    def strays(self, pid: int | None, own_uid: int | None) -> list[int]:
        """Processes started since the baseline that are still alive.

        Children of the kernel's infrastructure threads are not looked for: cells run in
        the main thread (a thread a cell started is a new thread, and when it ends its
        children pass to the main thread). With a uid of its own (``own_uid``), what
        escaped the tree runs as it too.
        """
        if pid is None:
            return []
        found = descendants(pid, skip_threads=self._infrastructure_threads)
        if own_uid is not None:  # e.g. a process whose subreaper flag was cleared
            found = sorted({*found, *processes_of_uid(own_uid)} - {pid})
        return [p for p in found if p not in self._children]


def _children(pid: int | None) -> list[int]:
    return descendants(pid) if pid is not None else []


def tree_memory(pid: int | None) -> int:
    """Resident memory of the kernel ``pid`` and every process it started."""
    if pid is None:
        return 0
    total = 0
    for member in (pid, *descendants(pid)):
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(member).memory_info().rss
    return int(total)


def signal_tree(pid: int, sig: int) -> None:
    """Send ``sig`` to the kernel ``pid``'s process group and to every descendant (one that
    left the group too); with SIGKILL, the fork server's side is told of them first."""
    try:
        members = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        members = []
    signal_group(pid, sig)  # the kernel leads its own session/process group
    if sig == signal.SIGKILL:
        killed_with_kernel(proc.pid for proc in members)
    for proc in members:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
