"""``# @output_dir <name>`` folders: declared in the cell's leading comments, returned in ``dirs/``.

The cell gets an empty writable folder bound to ``<name>`` (a ``Path``); whatever regular
files it holds when the cell ends travel in the bundle as ``dirs/<name>/<relative path>``
with ``output_dirs`` in the manifest. Links are never followed (see run_files).

A run returns at most ``--max-output-dir-files`` files, all its folders together: each file
costs a tar member and a manifest entry (50,000 made a 0.8 MB manifest), and the walk
stops at the first file past the cap, so a folder of a million files is never listed
whole. What is left out is said in the answer (:class:`Listing`: a line in stderr, and
``output_dirs_truncated`` in the manifest).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import files as run_files

FOLDER = "dirs"
"""The run directory's folder that holds them."""
FILES_FLAG = "--max-output-dir-files"
_PREFIX = "[strata-kernel-worker] "
Versions = dict[str, dict[str, tuple[int, int]]]
"""``{name: {posix relative path: (size, mtime_ns)}}``"""

_DIRECTIVE = re.compile(r"^#\s*@(\w+)\s*(.*?)\s*$")


def declared(source: str) -> tuple[str, ...]:
    """Folder names declared by ``# @output_dir`` in the leading comment block, in order."""
    names: list[str] = []
    for line in source.splitlines():
        text = line.strip()
        if not text:
            continue
        if not text.startswith("#"):
            break
        match = _DIRECTIVE.match(text)
        if match and match.group(1).lower() == "output_dir":
            name = match.group(2)
            if name.isidentifier() and name not in names:
                names.append(name)
    return tuple(names)


def prepare(root: Path, names: tuple[str, ...]) -> dict[str, str]:
    """Create each folder under ``root``; return ``{name: path}`` for the agent to bind."""
    folders = {}
    for name in names:
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        folders[name] = str(folder)
    return folders


@dataclass(frozen=True, slots=True)
class Listing:
    """What a run's output folders return: ``files`` (``{name: {posix relative path:
    size}}``), and the folders that held more when ``max_files`` was reached."""

    files: dict[str, dict[str, int]]
    truncated: tuple[str, ...] = ()
    max_files: int | None = None

    @property
    def marker(self) -> dict[str, object] | None:
        """The manifest's ``output_dirs_truncated``: None when nothing was left out."""
        if not self.truncated:
            return None
        return {"folders": list(self.truncated), "max_files": self.max_files, "limit": FILES_FLAG}

    @property
    def note(self) -> str:
        """A line for the cell's stderr when files were left out, else ``""``."""
        if not self.truncated:
            return ""
        where = ", ".join(self.truncated)
        return (
            f"{_PREFIX}The cell's output folders hold more than {self.max_files} files in "
            f"all: the first {self.max_files} found are returned, the rest (in {where}) are "
            f"left out (the cap on a run's output-folder files, {FILES_FLAG})\n"
        )


def listing(run_root: Path, names: tuple[str, ...], max_files: int | None = None) -> Listing:
    """The regular files each folder of the run directory ``run_root`` holds (a folder
    replaced by a link holds none), at most ``max_files`` in all."""
    versions, truncated = _versions(run_root, names, max_files)
    files = {
        name: {rel: size for rel, (size, _mtime) in sorted(found.items())}
        for name, found in versions.items()
    }
    return Listing(files, truncated, max_files)


def versions_of(run_root: Path, names: tuple[str, ...], max_files: int | None = None) -> Versions:
    """``{name: {posix relative path: (size, mtime_ns)}}``, as :func:`listing`."""
    return _versions(run_root, names, max_files)[0]


def _versions(
    run_root: Path, names: tuple[str, ...], max_files: int | None
) -> tuple[Versions, tuple[str, ...]]:
    result: Versions = {}
    truncated: list[str] = []
    room = max_files
    for name in names:
        try:
            found, more = run_files.first_regular_files(run_root, [FOLDER, name], room)
        except OSError:
            found, more = {}, False
        result[name] = found
        if room is not None:
            room -= len(found)
        if more:
            truncated.append(name)
    return result, tuple(truncated)
