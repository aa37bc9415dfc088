"""Processes: kernelspec for this interpreter, the identity kernels run as, process trees.

No jupyter_client here; plain OS facts the kernel and the pool need.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd

import psutil

from .config import PoolConfig
from .errors import KernelStartError

_PROC_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


KernelIdentity = tuple[int, int]


def kernel_identity(config: PoolConfig) -> KernelIdentity | None:
    """(uid, gid) kernels run as, when the pool runs them as another user."""
    if config.kernel_user is None:
        return None
    try:
        user = pwd.getpwnam(config.kernel_user)
        gid = grp.getgrnam(config.kernel_group).gr_gid if config.kernel_group else user.pw_gid
    except KeyError as exc:
        raise KernelStartError(f"unknown kernel user or group: {exc.args[0]}") from None
    return user.pw_uid, gid


def processes_of_uid(uid: int) -> list[int]:
    """Every process whose real or effective uid is ``uid`` (from ``/proc/*/status``: a
    non-dumpable process's ``/proc`` files belong to root, its status does not lie)."""
    found = []
    wanted = str(uid)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Uid:"):
                        real, effective = line.split()[1:3]
                        if wanted in (real.decode(), effective.decode()):
                            found.append(int(entry.name))
                        break
        except (OSError, ValueError):
            continue
    return found


def kill_uid(uid: int, rounds: int = 20) -> bool:
    """SIGKILL every process of ``uid`` until none is left (a fork racing the kill gets
    another round); whether none is left."""
    for _ in range(rounds):
        pids = processes_of_uid(uid)
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, 9)
    return not processes_of_uid(uid)


def descendants(pid: int, *, skip_threads: frozenset[int] = frozenset()) -> list[int]:
    """Every process below ``pid`` (empty if it is gone).

    Walks ``/proc/<pid>/task/<tid>/children``, whose cost follows the size of the tree, not
    the number of processes on the machine; psutil's scan is the fallback where that file
    does not exist. Children started by the threads ``skip_threads`` of ``pid`` itself are
    not looked for (one ``/proc`` read saved per thread).
    """
    if not _PROC_CHILDREN:
        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        skip = skip_threads if parent == pid else frozenset()
        with contextlib.suppress(OSError):  # a process that exits mid-walk has no children
            for task in os.scandir(f"/proc/{parent}/task"):
                if skip and int(task.name) in skip:
                    continue
                with contextlib.suppress(OSError), open(f"{task.path}/children") as fh:
                    children = [int(child) for child in fh.read().split()]
                    found.extend(children)
                    pending.extend(children)
    return found


def signal_group(pid: int, sig: int) -> None:
    """Signal the process group ``pid`` leads, or ``pid`` alone if it leads none yet.

    A forked kernel takes its own session a moment after the fork; until then only the
    process itself can be reached (by then it has started nothing).
    """
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    except PermissionError:
        pass


def threads_of(pid: int) -> frozenset[int]:
    """The thread ids of ``pid`` (empty where ``/proc`` cannot tell)."""
    try:
        return frozenset(int(task.name) for task in os.scandir(f"/proc/{pid}/task"))
    except OSError:
        return frozenset()
