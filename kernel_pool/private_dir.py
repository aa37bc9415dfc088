"""A pool's private folder: the kernels' connection files and their own folders.

Made when the pool starts, in ``PoolConfig.runtime_dir`` (else the temporary folder): mode
0700, or 0711 where kernels run as other users (they may traverse it to reach their own
folder, never list it), with a file naming the pool's process. Removed when the pool
closes; the folders of pools whose process died without removing them (SIGKILL) are
removed by the next pool that starts there.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import psutil

_PRIVATE_PREFIX = "kernel-pool-"
_OWNER_FILE = "owner.pid"


def _remove_abandoned_private_dirs(parent: Path) -> None:
    """Remove the private directories of pools whose process died without removing them
    (SIGKILL): this user's, whose owner process no longer exists."""
    for path in parent.glob(f"{_PRIVATE_PREFIX}*"):
        try:
            owner = int((path / _OWNER_FILE).read_text(encoding="utf-8"))
            mine = path.lstat().st_uid == os.getuid()
        except (OSError, ValueError):  # not a pool's, or another user's: not ours to judge
            continue
        if mine and owner != os.getpid() and not psutil.pid_exists(owner):
            shutil.rmtree(path, ignore_errors=True)


class PrivateDir:
    """One pool's private folder (``path``: ``None`` until :meth:`create` made it)."""

    def __init__(self) -> None:
        self.path: Path | None = None

    async def create(self, parent: Path, *, other_users: bool) -> Path:
        """Make the folder in ``parent`` (after removing abandoned ones there);
        ``other_users``: kernels run as other users than the pool's."""
        await asyncio.to_thread(_remove_abandoned_private_dirs, parent)
        return self._make(parent, other_users)

    def _make(self, parent: Path, other_users: bool) -> Path:
        # here, not in a thread: once made, the folder is known (a close removes it)
        self.path = path = Path(tempfile.mkdtemp(prefix=_PRIVATE_PREFIX, dir=parent))
        (path / _OWNER_FILE).write_text(str(os.getpid()), encoding="utf-8")
        path.chmod(0o711 if other_users else 0o700)
        return path

    async def remove(self) -> None:
        """Remove the folder and all it holds, if it was made."""
        if self.path is not None:
            await asyncio.to_thread(shutil.rmtree, self.path, True)
