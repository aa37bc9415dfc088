"""What the agent writes in the run directory, never through what the cell left there.

The cell can change its run directory: it may replace the outputs' folder with a link, put
links or FIFOs in it under the names outputs will have, or put one where the agent writes
its report. Outputs are written only into a real folder (:func:`real_folder`) that holds
nothing the cell left (:func:`set_aside_contents`), and the report only as a new file,
whatever held its name moved aside first (:func:`create_new`), so nothing is written
through a link and no FIFO blocks the kernel. The worker is told what was set aside, to say
so. Stdlib only, shipped into kernels with the runtime.
"""

from __future__ import annotations

import os
import stat

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_ATTEMPTS = 3
_NAMED = 20  # entries set aside that the worker is told of, at most


def real_folder(path: str) -> bool:
    """Whether ``path`` is a folder itself, not a link to one (nor anything else)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def create_new(path: str) -> tuple[int, int | None]:
    """``(descriptor, st_mode or None)``: ``path`` created as a new file for writing, and the
    mode of what held the name before (moved aside to a hidden name beside it), if anything.

    Raises:
        OSError: The folder cannot be written, or the name keeps being taken.
    """
    displaced: int | None = None
    folder, name = os.path.split(path)
    for _ in range(_ATTEMPTS):
        try:
            return os.open(path, _CREATE_FLAGS, 0o666), displaced
        except FileExistsError:
            try:
                mode = os.lstat(path).st_mode
                os.rename(path, os.path.join(folder, f".{name}.displaced-{os.urandom(4).hex()}"))
            except FileNotFoundError:
                continue
            displaced = mode if displaced is None else displaced
    raise FileExistsError(f"{name} kept being created by someone else")


def set_aside_contents(folder: str) -> dict[str, int]:
    """``{name: st_mode}`` of what the cell left in the real folder ``folder`` (at most
    ``_NAMED`` of them); if anything, the folder is moved aside to a hidden name beside it,
    all it holds with it, and made again, empty.

    Raises:
        OSError: The folder cannot be read, moved or made.
    """
    found: dict[str, int] = {}
    with os.scandir(folder) as entries:
        for entry in entries:
            try:
                found[entry.name] = entry.stat(follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue
            if len(found) >= _NAMED:
                break
    if found:
        parent, name = os.path.split(folder)
        os.rename(folder, os.path.join(parent, f".{name}.displaced-{os.urandom(4).hex()}"))
        os.mkdir(folder)
    return found
