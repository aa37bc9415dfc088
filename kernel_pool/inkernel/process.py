"""The kernel's process: its lifeline to the pool, the processes and environment its cells
leave behind, and its standard file descriptors.

The lifeline and the subreaper start with the kernel; the reset puts back ``os.environ``
(and what ``os.putenv`` changed under it), the working directory, ``sys.path`` and fds 0-2,
closes the figures left open, and collects children that have exited."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import threading
from typing import Any

from .baseline import BASELINE

_ADOPTION_SECONDS = 2.0


def start_lifeline() -> None:
    """If the pool's process dies (even by SIGKILL), take this kernel's whole process group
    down with it within about half a second: no orphaned cell processes holding GPUs.

    The pool's process is the one ``JPY_PARENT_PID`` names (the pool and jupyter_client set
    it to the process that starts the kernel, which is its parent): a kernel whose pool dies
    while it starts (its preload running) is adopted by another process before this runs,
    and watching that one it would outlive its pool for good.
    """
    if any(t.name == "kernel-pool-lifeline" for t in threading.enumerate()):
        return
    try:
        pool = int(os.environ.get("JPY_PARENT_PID") or 0)
    except ValueError:
        pool = 0

    def watch() -> None:
        import signal
        import time

        parent = os.getppid()
        if pool > 1 and parent != pool:
            # the fork server's go-between may still be exiting: give it a moment
            settle_by = time.monotonic() + _ADOPTION_SECONDS
            while os.getppid() != pool and time.monotonic() < settle_by:
                time.sleep(0.05)
            parent = pool
        while os.getppid() == parent:
            time.sleep(0.5)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="kernel-pool-lifeline", daemon=True).start()


def adopt_orphans() -> None:
    """Make this kernel the reaper of the processes its cells start (PR_SET_CHILD_SUBREAPER).

    A process whose parent exits is adopted by the nearest such ancestor instead of init: a
    shell's background job (``os.system('job &')``), or a daemon that forks twice, becomes
    the kernel's child, which the pool's check after each request sees. Otherwise the job
    would run on unseen, in the kernel's process group, writing into later requests' output.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:
        pass


def forbid_tracing_when_unprivileged() -> None:
    """Kernels sharing an unprivileged user must not read each other: no ptrace, and
    /proc/<pid>/mem, environ and fd become root's only (PR_SET_DUMPABLE = 0)."""
    if os.getuid() == 0 or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception:
        pass


def reap_exited_children() -> None:
    """Collect children that have exited and nobody waited for (an adopted orphan, a
    ``Popen`` never waited on): as zombies they would look like processes left running."""
    try:
        with open(f"/proc/self/task/{os.getpid()}/children", "rb") as fh:
            children = fh.read().split()
    except OSError:
        return
    for child in children:
        pid = int(child)
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == b"Z":
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


_put_names: set[Any] = set()  # names passed to os.putenv / os.unsetenv since the last reset


def watch_putenv() -> None:
    """Note the names ``os.putenv`` and ``os.unsetenv`` set, which ``os.environ`` does not see
    (a cell's ``os.putenv('HTTP_PROXY', ...)`` would reach every later request's processes).
    ``os.environ`` calls them too, so its own changes are noted as well."""
    for name in ("putenv", "unsetenv"):
        original = getattr(os, name, None)
        if original is None or getattr(original, "_kernel_pool_noted", False):
            continue

        def noting(key: str, *args: Any, _original: Any = original) -> Any:
            _put_names.add(key)
            return _original(key, *args)

        vars(noting)["_kernel_pool_noted"] = True
        noting.__name__ = noting.__qualname__ = name
        noting.__doc__ = original.__doc__
        setattr(os, name, noting)


def environ_data() -> Any:
    """The environment as the OS sees it (bytes, no decoding), where ``os`` exposes it."""
    data = getattr(os.environ, "_data", None)
    return data if isinstance(data, dict) else {}


def environ_unchanged() -> Any:
    data = environ_data()
    if data:
        return data == BASELINE["environ_data"]  # bytes: nothing to fake
    return dict(os.environ) == BASELINE["environ"]


def restore_process_state(problems: list[str]) -> None:
    if not environ_unchanged():
        os.environ.clear()
        os.environ.update(BASELINE["environ"])
    if _put_names:  # os.putenv/unsetenv change the environment under os.environ
        environ = BASELINE["environ_data"] or {}
        for name in list(_put_names):
            value = environ.get(os.fsencode(name) if isinstance(name, str) else name)
            with contextlib.suppress(OSError, ValueError):
                os.putenv(name, value) if value is not None else os.unsetenv(name)
        _put_names.clear()
    try:
        os.chdir(BASELINE["cwd"])  # getcwd() would fail if a cell's directory is gone
    except OSError as exc:
        problems.append(f"cannot restore cwd: {exc.strerror}")
    sys.path[:] = BASELINE["path"]
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        try:
            pyplot.close("all")
        except Exception as exc:
            problems.append(f"closing figures failed: {type(exc).__name__}")


def fd_identity(fd: int) -> Any:
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def save_fds() -> Any:
    """Duplicates of fds 0-2, so a cell that closes or redirects them can be undone."""
    saved = {}
    for fd in (0, 1, 2):
        identity = fd_identity(fd)
        if identity is not None:
            saved[fd] = (os.dup(fd), identity)
    return saved


def restore_std_fds(problems: list[str]) -> None:
    """Put fds 0-2 back; never over a number the kernel's own machinery has taken since."""
    for fd, (copy, identity) in BASELINE["fds"].items():
        current = fd_identity(fd)
        if current == identity:
            continue
        if current is not None and _machinery_fd(fd):
            # the cell closed it and a socket or an eventfd got the number: a dup2 would
            # close that under its owner (zmq aborts the kernel on it)
            problems.append(f"file descriptor {fd} was closed and taken over by the kernel")
            continue
        try:
            os.dup2(copy, fd)
        except OSError as exc:
            problems.append(f"cannot restore file descriptor {fd}: {exc.strerror}")


def _machinery_fd(fd: int) -> Any:
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            return True
        return os.readlink(f"/proc/self/fd/{fd}").startswith("anon_inode:")
    except OSError:
        return False


def open_fd_count() -> Any:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0
