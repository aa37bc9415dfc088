"""What a cell broke in its run directory: the worker's own entries there, checked after it.

The cell runs in ``work/`` of its run directory and may change anything below the run
directory's root. The worker made some folders there before the cell ran (``inputs/``,
``work/``, ``files/``, ``display/``, ``dirs/<name>/`` for ``# @output_dir`` folders, the
mount folders) and writes files at some names after it (the agent's report, a pull run's
bundle file, the displays' and the outputs' files). A folder the cell replaced (with a
link, a file, a FIFO) or removed, and anything at the report's or the bundle's name, is
found here, before the worker reads anything; what the cell left at a display's or an
output's name is set aside by whoever writes there (run_files, agent/rundir), which says
so. Nothing is ever read or written through what the cell left (see run_files):

* where the cell's results were to be collected (its variables, displays, output folders, a
  read-write mount's changes), they are lost: a cell that otherwise succeeded fails with an
  error that says what it broke (:func:`failure`);
* elsewhere nothing is lost; a line in the cell's stderr says what was found
  (:func:`stderr_lines`), as it does for results lost by a cell that failed anyway.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import output_dirs

__all__ = [
    "BUNDLE_FILE",
    "DISPLAYS_LOST",
    "FAILURE_TYPE",
    "REPORT_FILE",
    "RESERVED_AFTER_FAILURE",
    "Damage",
    "Folder",
    "check",
    "damage_to",
    "failure",
    "folders_of",
    "found_kind",
    "owned_folders",
    "set_aside",
    "stderr_lines",
]

REPORT_FILE = "agent-report.json"
"""Where the in-kernel agent writes what it collected (as a new file: see agent/rundir)."""
BUNDLE_FILE = "bundle.tar.gz"
"""Where a bundle written to a file goes (a pull run's, before its upload)."""
RESERVED_AFTER_FAILURE = (REPORT_FILE, BUNDLE_FILE)
"""The names checked after a cell that failed (after one that succeeded the agent has
written its report, setting aside what held the name: it says so in the report)."""
FAILURE_TYPE = "RunDirectoryError"
"""The error type of a cell that broke where its results were to be collected."""
_PREFIX = "[strata-kernel-worker] "
_LINK = "a symbolic link"


@dataclass(frozen=True, slots=True)
class Folder:
    """A folder the worker made in the run directory before the cell ran."""

    parts: tuple[str, ...]
    lost: str | None
    """What the cell loses when it breaks the folder (a clause), or None: nothing."""


@dataclass(frozen=True, slots=True)
class Damage:
    """One entry of the worker's that the cell broke."""

    where: str  # as the run directory shows it: "display/", "agent-report.json"
    found: str | None  # "a symbolic link", "a FIFO"…; None: the folder was removed
    lost: str | None  # see Folder.lost
    reserved: bool = False  # a name for a file of the worker's, not a folder it made

    def sentence(self) -> str:
        if self.reserved:
            what = (
                f"The cell put {self.found} at {self.where} in its run directory, a name the "
                "worker keeps for its own file"
            )
        elif self.found is None:
            what = f"The cell removed {self.where} from its run directory"
        else:
            what = f"The cell replaced {self.where} in its run directory with {self.found}"
        if self.lost is not None:
            followed = " (the worker follows no link there)" if self.found == _LINK else ""
            return f"{what}, so {self.lost}{followed}"
        if self.reserved:
            return f"{what}; it was left unread"
        return f"{what}; nothing of the cell's results was there"


DISPLAYS_LOST = "its displays could not be collected"


def owned_folders(
    root: Path,
    output_folders: Sequence[str],
    mounts: Iterable[tuple[str, str, bool]],
    *,
    displays: bool,
) -> list[Folder]:
    """Every folder the worker made for this run, parents before children.

    ``mounts``: ``(name, local path, read-write)`` of the request's mounts; ``displays``:
    whether the cell showed any (its display folder holds nothing of its results otherwise).
    """
    owned = [
        Folder(("inputs",), None),
        Folder(("work",), None),
        Folder(("files",), "its variables could not be collected"),
        Folder(("display",), DISPLAYS_LOST if displays else None),
    ]
    if output_folders:
        lost = "could not be collected"
        owned.append(Folder((output_dirs.FOLDER,), f"the files of its output folders {lost}"))
        owned.extend(
            Folder((output_dirs.FOLDER, name), f"the files of its output folder '{name}' {lost}")
            for name in output_folders
        )
    for name, path, writable in mounts:
        rel = os.path.relpath(path, root)
        if rel.startswith(os.pardir):
            continue  # not in the run directory
        lost = f"what it wrote to read-write mount '{name}' could not be synced back"
        owned.append(Folder(tuple(Path(rel).parts), lost if writable else None))
    return owned


def check(
    root: Path, owned: Sequence[Folder], reserved: Sequence[str] = (BUNDLE_FILE,)
) -> list[Damage]:
    """What the cell broke among ``owned`` folders and ``reserved`` file names (blocking:
    a few ``lstat`` calls). A folder below a broken one is not named again."""
    damages: list[Damage] = []
    broken: set[tuple[str, ...]] = set()
    for folder in owned:
        if any(folder.parts[:depth] in broken for depth in range(1, len(folder.parts))):
            continue
        damage = damage_to(root, folder.parts, folder.lost)
        if damage is not None:
            broken.add(tuple(damage.where.rstrip("/").split("/")))
            damages.append(damage)
    for name in reserved:
        try:
            mode = os.lstat(root / name).st_mode
        except OSError:
            continue
        damages.append(Damage(name, found_kind(mode), None, reserved=True))
    return damages


def damage_to(root: Path, parts: Sequence[str], lost: str | None) -> Damage | None:
    """How the folder ``root/<parts…>`` (or a folder on the way to it) is not the real
    folder it was, or None when it is."""
    for depth in range(1, len(parts) + 1):
        where = "/".join(parts[:depth]) + "/"
        try:
            mode = os.lstat(root.joinpath(*parts[:depth])).st_mode
        except FileNotFoundError:
            return Damage(where, None, lost)
        except OSError:
            return Damage(where, "something the worker cannot look at", lost)
        if not stat.S_ISDIR(mode):
            return Damage(where, found_kind(mode), lost)
    return None


def found_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, for a sentence."""
    kinds = (
        (stat.S_ISLNK, _LINK),
        (stat.S_ISREG, "a file"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "a device file")


def failure(damages: Iterable[Damage]) -> str | None:
    """The error of a cell that lost results to what it broke, or None when it lost none."""
    sentences = [damage.sentence() for damage in damages if damage.lost is not None]
    return "; ".join(sentences) if sentences else None


def stderr_lines(damages: Iterable[Damage], *, in_error: bool) -> str:
    """The lines for the cell's stderr: every damage, but those the cell's error already
    names (``in_error``: :func:`failure`'s text became the error)."""
    return "".join(
        f"{_PREFIX}{damage.sentence()}\n"
        for damage in damages
        if not (in_error and damage.lost is not None)
    )


def set_aside(displaced: object) -> list[Damage]:
    """What the worker (or its agent) found at names it writes and set aside, unread:
    ``{where: st_mode}`` (the agent's report says it as JSON)."""
    if not isinstance(displaced, Mapping):
        return []
    return [
        Damage(str(where), found_kind(mode), None, reserved=True)
        for where, mode in displaced.items()
        if isinstance(mode, int) and not isinstance(mode, bool)
    ]


def folders_of(mounts: Mapping[str, str], writable: Iterable[str]) -> list[tuple[str, str, bool]]:
    """``(name, path, read-write)`` for :func:`owned_folders`, from the mounts' local paths."""
    rw = set(writable)
    return [(name, path, name in rw) for name, path in mounts.items()]
