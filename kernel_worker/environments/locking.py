"""The cross-process lock on one environment: ``fcntl.flock`` on ``<root>/<dir key>.lock``.

The same lock Strata's reference worker takes (its ``filelock`` locks with ``flock`` on the
same file and leaves the file in place), so this worker, its siblings and a reference worker
sharing one root never build one environment at the same time. Lock files are never
removed: a waiter holding the old inode of a removed file would think it held the lock.

Blocking: call these from a thread.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import EnvironmentBuildError

__all__ = ["held", "release", "shared", "try_held"]

_FIRST_WAIT_SECONDS = 0.05
_LONGEST_WAIT_SECONDS = 1.0


@contextmanager
def held(path: Path, *, timeout_seconds: float) -> Iterator[None]:
    """Hold the lock at *path*, waiting at most *timeout_seconds* for another holder."""
    fd = _open(path)
    try:
        deadline = time.monotonic() + timeout_seconds
        wait = _FIRST_WAIT_SECONDS
        while not _locked(fd):
            if time.monotonic() >= deadline:
                raise EnvironmentBuildError(
                    f"another cell is still building this environment after {timeout_seconds:g}s"
                )
            time.sleep(wait)  # in a thread: flock cannot wait with a timeout
            wait = min(wait * 2, _LONGEST_WAIT_SECONDS)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextmanager
def try_held(path: Path) -> Iterator[bool]:
    """Hold the lock at *path* if nobody does; yields whether it is held."""
    fd = _open(path)
    try:
        locked = _locked(fd)
        try:
            yield locked
        finally:
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def shared(path: Path) -> int:
    """Lock *path* shared (never waits long: only eviction takes it exclusively, for an
    instant); the descriptor to :func:`release` it with. A user's mark, not a build lock."""
    fd = _open(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


def release(fd: int) -> None:
    """Release a lock taken by :func:`shared`."""
    os.close(fd)  # closing the only descriptor of the open file releases its flock


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def _locked(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
