"""What a kernel's uid leaves outside its folder, removed before the uid is free again.

With ``kernel_uids`` a uid runs one kernel at a time, then a later one: whatever the first
left where its uid could write would be the later kernel's to read (a mode-``0600`` file
is its owner's, and the owner is the same uid). Besides its own folder (removed with the
kernel), a uid can write in the folders every user may write, and make System V IPC
objects, which outlive every process:

- files and folders in ``/tmp``, ``/var/tmp``, ``/dev/shm`` (POSIX shared memory and
  named semaphores are files there: joblib's and torch's shared memory among them) and
  ``/dev/mqueue`` (POSIX message queues, where that filesystem is mounted), and in any
  folder below them that others may write in too;
- System V shared memory segments, semaphore sets and message queues it owns or created.

:func:`release_uid` kills every process of the uid, then removes all of that. It runs
once per kernel, while the pool still counts the uid as that kernel's, so it can never
reach a kernel started after it. Removing another user's System V object needs
``CAP_SYS_ADMIN``; without it, the objects are removed by a short process running as the
uid itself (their owner may remove them).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Collection, Iterator

from .processes import kill_uid

log = logging.getLogger(__name__)

SHARED_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue")
_IPC_RMID = 0
# /proc/sysvipc file, its id column, and how to remove one
_IPC_KINDS = {"shm": "shmid", "sem": "semid", "msg": "msqid"}
_REMOVE_AS_OWNER = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
for arg in sys.argv[1:]:
    kind, number = arg.split(":")
    number = int(number)
    if kind == "shm":
        libc.shmctl(number, 0, None)
    elif kind == "sem":
        libc.semctl(number, 0, 0)
    elif kind == "msg":
        libc.msgctl(number, 0, None)
"""


def release_uid(uid: int, keep: Collection[str] = ()) -> int:
    """Kill every process of ``uid``, then remove what it owns in the shared folders (but
    the paths in ``keep``) and its System V IPC objects; how many things were removed.
    Blocking: run it in a thread."""
    if not kill_uid(uid):
        log.warning("processes of uid %d survived being killed", uid)
    removed = sum(_remove_files(root, uid, keep) for root in SHARED_FOLDERS)
    removed += _remove_ipc(uid)
    if removed:
        log.info("removed %d things uid %d left in shared folders and IPC", removed, uid)
    return removed


def _remove_files(root: str, uid: int, keep: Collection[str]) -> int:
    """Remove what ``uid`` owns in ``root`` and the folders below it that others may write
    in (only there can it have made anything: nothing it owns is looked into)."""
    removed = 0
    folders = [root]
    while folders:
        try:
            entries = list(os.scandir(folders.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if entry.path in keep:
                continue
            directory = stat.S_ISDIR(info.st_mode)
            if info.st_uid == uid:
                if directory:
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
                removed += 1
            elif directory and info.st_mode & stat.S_IWOTH:
                folders.append(entry.path)
    return removed


def ipc_objects(uid: int) -> list[tuple[str, int]]:
    """(kind, id) of every System V IPC object ``uid`` owns or created ("shm", "sem",
    "msg")."""
    return list(_ipc_objects(uid))


def _ipc_objects(uid: int) -> Iterator[tuple[str, int]]:
    for kind, id_column in _IPC_KINDS.items():
        try:
            with open(f"/proc/sysvipc/{kind}") as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        if not lines:
            continue
        header = lines[0].split()
        try:
            ident, owner, creator = (header.index(c) for c in (id_column, "uid", "cuid"))
        except ValueError:
            continue
        for line in lines[1:]:
            fields = line.split()
            with contextlib.suppress(IndexError, ValueError):
                if uid in (int(fields[owner]), int(fields[creator])):
                    yield kind, int(fields[ident])


def _remove_ipc(uid: int) -> int:
    found = ipc_objects(uid)
    if not found:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    refused = []
    for kind, number in found:
        if kind == "shm":
            result = libc.shmctl(number, _IPC_RMID, None)
        elif kind == "sem":
            result = libc.semctl(number, 0, _IPC_RMID)
        else:
            result = libc.msgctl(number, _IPC_RMID, None)
        if result != 0 and ctypes.get_errno() == 1:  # EPERM: no CAP_SYS_ADMIN here
            refused.append(f"{kind}:{number}")
    if refused:  # their owner may remove them
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [sys.executable, "-I", "-S", "-c", _REMOVE_AS_OWNER, *refused],
                user=uid, group=uid, extra_groups=[], check=False, timeout=30,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
    return len(found) - len(ipc_objects(uid))
