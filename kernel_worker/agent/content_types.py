"""The content types of stored values, the file names they are stored under, and the
metadata every writer returns.

Shared by the writers and readers of each family of formats (``codecs``, ``objects``), so
both sides of the wire agree on names. Stdlib only; shipped into kernels with the codecs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

ARROW = "arrow/ipc"
JSON = "json/object"
PICKLE = "pickle/object"
PNG = "image/png"
MARKDOWN = "text/markdown"
MODULE_IMPORT = "module/import"
MODULE_CELL = "module/cell"
CELL_INSTANCE = "module/cell-instance"
FILE_PATH = "file/path"
DIR_TAR = "dir/tar"
DIR_MANIFEST = "dir/manifest"
R_OBJECT = "application/x-r-rds"

_EXTENSIONS = {
    ARROW: ".arrow",
    JSON: ".json",
    PICKLE: ".pickle",
    MODULE_IMPORT: ".module.json",
    MODULE_CELL: ".cell_module.json",
    CELL_INSTANCE: ".cell_instance.pickle",
    DIR_TAR: ".dir.tar",
    MARKDOWN: ".md",
    PNG: ".png",
}

Metadata = dict[str, object]


def file_stem(name: str) -> str:
    """*name* itself when it is all lower case, else ``name-<8 hex of its sha256>``.

    The suffix keeps ``df`` and ``DF`` apart on case-insensitive file systems.
    """
    if name == name.lower():
        return name
    return f"{name}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def extension_for(content_type: str) -> str:
    """The file extension a value of *content_type* is stored under (``.bin`` if none)."""
    return _EXTENSIONS.get(content_type, ".bin")


def target(stem: Path, content_type: str) -> Path:
    """The file a value of *content_type* named by *stem* is written to."""
    return stem.with_name(stem.name + extension_for(content_type))


def written(content_type: str, path: Path, **extra: object) -> Metadata:
    """Metadata in the reference's key order: type, file, size, then the extras."""
    head: Metadata = {"content_type": content_type, "file": path.name}
    return {**head, "bytes": os.path.getsize(path), **extra}
