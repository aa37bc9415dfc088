"""``# @output_dir <name>`` folders: declared in the cell's leading comments, returned in ``dirs/``.

The cell gets an empty writable folder bound to ``<name>`` (a ``Path``); whatever regular
files it holds when the cell ends travel in the bundle as ``dirs/<name>/<relative path>``
with ``output_dirs`` in the manifest. Links are never followed.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

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


def listing(root: Path, names: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """``{name: {posix relative path: size}}`` of the regular files each folder holds."""
    result: dict[str, dict[str, int]] = {}
    for name in names:
        folder = root / name
        files: dict[str, int] = {}
        for dirpath, _dirnames, filenames in os.walk(folder, followlinks=False):
            for filename in filenames:
                path = Path(dirpath) / filename
                info = path.lstat()
                if stat.S_ISREG(info.st_mode):
                    files[path.relative_to(folder).as_posix()] = info.st_size
        result[name] = dict(sorted(files.items()))
    return result
