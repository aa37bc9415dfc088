"""``# @output_dir <name>`` folders: declared in the cell's leading comments, returned in ``dirs/``.

The cell gets an empty writable folder bound to ``<name>`` (a ``Path``); whatever regular
files it holds when the cell ends travel in the bundle as ``dirs/<name>/<relative path>``
with ``output_dirs`` in the manifest. Links are never followed (see run_files).
"""

from __future__ import annotations

import re
from pathlib import Path

from . import run_files

FOLDER = "dirs"
"""The run directory's folder that holds them."""

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


def listing(run_root: Path, names: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """``{name: {posix relative path: size}}`` of the regular files each folder of the run
    directory ``run_root`` holds (a folder replaced by a link holds none)."""
    return {
        name: {rel: size for rel, (size, _mtime) in sorted(versions.items())}
        for name, versions in versions_of(run_root, names).items()
    }


def versions_of(run_root: Path, names: tuple[str, ...]) -> dict[str, dict[str, tuple[int, int]]]:
    """``{name: {posix relative path: (size, mtime_ns)}}``, as :func:`listing`."""
    result: dict[str, dict[str, tuple[int, int]]] = {}
    for name in names:
        try:
            result[name] = run_files.regular_files(run_root, [FOLDER, name])
        except OSError:
            result[name] = {}
    return result
