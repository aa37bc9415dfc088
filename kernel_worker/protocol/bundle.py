"""The output bundle (``notebook-output-bundle@v1``): one gzipped tar per cell run.

One archive satisfies two readers (ARCHITECTURE §1):

* the real client (strata-notebook 0.11, spec §7), which reads ``manifest.json``
  (``schema_version``, ``success``, ``variables``, ``displays``, ``stdout_file``,
  ``stderr_file``, ``error``, ``traceback``, ``mutation_warnings``, ``build_env``,
  ``hardware``, ``output_dirs``), ``stdout.txt``, ``stderr.txt``, ``files/<name>`` and
  ``dirs/<folder>/<path>``;
* the seed page, which adds manifest keys ``protocol_version``, ``executor_ref``,
  ``duration_ms``, ``outputs[]``, ``display[]``, ``console`` and members ``console.json``,
  ``error.json`` (failures only) and ``display/<file>`` (the IPython mime files). Each
  ``outputs[]`` entry's ``file`` names the ``files/<name>`` member that holds the variable
  (the seed page's manifest is the index of the members, and Strata's client accepts
  variables only under ``files/``), so no byte is stored twice. Likewise a ``display[]``
  entry whose file is the same file (a hard link the agent made) as a ``files/`` member, a
  figure's PNG in both display views, names that member: its bytes are stored once. An
  entry that stands for a display dropped by the display caps says so (``dropped``).

Every member is a regular file holding its own bytes (no links), so a reader that takes
the archive as a stream (``tarfile``'s ``r|gz``, ``tar -xzf -`` from a pipe, Go's or
Node's tar readers) gets every member whole. Member order: ``stdout.txt``, ``stderr.txt``,
``console.json``, ``error.json``, ``dirs/``, ``files/``, ``display/``, and
``manifest.json`` last, so the manifest describes exactly what was written. Generated
members (and copied ones, whose stat is not carried) have mode 0644, uid/gid 0 and mtime 0;
the gzip header has mtime 0 and no name, so equal runs give equal bytes.

The run directory is writable by the cell, so every file is opened without following
links (a symlink or FIFO planted under ``files/`` is treated as missing) and streamed
into the tar. A variable whose file is missing becomes an error entry, never a bundle the
client rejects; a missing mime file or output-dir file is left out of the manifest.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from zlib_ng import zlib_ng

from ..runs import console
from ..runs import files as run_files
from ..runs.display_files import MimeDisplay
from .stored_gzip import GZIP_WBITS, DeflatingGzipWriter, StoredGzipWriter, stored_length
from .tarwriter import TarWriter

__all__ = [
    "EXECUTOR_REF",
    "SCHEMA_VERSION",
    "CellOutcome",
    "MimeDisplay",
    "build_manifest",
    "bundle_bytes",
    "stored_bundle_length",
    "write_bundle",
]

SCHEMA_VERSION = "notebook-output-bundle@v1"
EXECUTOR_REF = "notebook_cell@v1"
STDOUT_MEMBER = "stdout.txt"
STDERR_MEMBER = "stderr.txt"
CONSOLE_MEMBER = "console.json"
ERROR_MEMBER = "error.json"
MANIFEST_MEMBER = "manifest.json"
FILES_DIR = "files"
DISPLAY_DIR = "display"
DIRS_DIR = "dirs"


@dataclass(frozen=True, slots=True)
class CellOutcome:
    """Everything a finished cell left behind, ready to be bundled."""

    success: bool
    # Codec metadata per variable; "file" is a basename inside run_dir/files.
    variables: Mapping[str, Mapping[str, object]]
    displays: Sequence[Mapping[str, object]]  # reference displays, same convention
    mime_displays: Sequence[MimeDisplay]
    stdout: console.Text
    stderr: console.Text
    error: str | None
    error_type: str | None
    traceback: str | None
    mutation_warnings: Sequence[Mapping[str, str]]
    build_env: str
    hardware: Mapping[str, object]
    duration_ms: int
    # folder -> {relative path: size}, the files under run_dir/dirs/<folder>
    output_dirs: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # read-only mounts: bytes downloaded by this run (present, possibly {}, on success)
    mount_bytes: Mapping[str, int] | None = None
    # read-write mounts: what was synced back ([] when nothing)
    mount_writes: Sequence[Mapping[str, object]] = ()
    # pull runs: output-folder files the orchestrator already stored (omitted from dirs/)
    output_dirs_streamed: Mapping[str, Sequence[str]] | None = None
    # the output folders held more files than a run returns: {folders, max_files, limit}
    output_dirs_truncated: Mapping[str, object] | None = None


def build_manifest(
    outcome: CellOutcome,
    file_sizes: Mapping[str, int],
    stored_as: Mapping[str, str] | None = None,
) -> dict[str, object]:
    """The manifest for *outcome*, given the members actually present.

    Pure. *file_sizes* maps member names (``files/x.json``, ``display/0.png``,
    ``dirs/<folder>/<path>``) to their sizes; a referenced name absent from it counts as
    missing. Each ``file`` is rewritten to ``files/<basename>``. *stored_as* maps a
    ``display/`` file not stored itself to the ``files/`` member that holds its bytes.
    """
    variables = {
        name: _bundle_entry(meta, file_sizes, f"variable {name!r}", required=True)
        for name, meta in outcome.variables.items()
    }
    manifest: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,
        "success": outcome.success,
        "variables": variables,
        "displays": [
            _bundle_entry(meta, file_sizes, f"display {i}", required=False)
            for i, meta in enumerate(outcome.displays)
        ],
        "stdout_file": STDOUT_MEMBER,
        "stderr_file": STDERR_MEMBER,
        "error": outcome.error,
        "traceback": outcome.traceback,
        "mutation_warnings": [dict(warning) for warning in outcome.mutation_warnings],
        "build_env": outcome.build_env,
        "output_dirs": _output_dirs(outcome.output_dirs, file_sizes),
        # The seed page's keys, alongside.
        "protocol_version": SCHEMA_VERSION,
        "executor_ref": EXECUTOR_REF,
        "duration_ms": outcome.duration_ms,
        "outputs": _seed_outputs(variables, file_sizes),
        "display": _seed_display(outcome.mime_displays, file_sizes, stored_as or {}),
        "console": CONSOLE_MEMBER,
    }
    if outcome.hardware:  # as the reference: absent rather than an empty machine
        manifest["hardware"] = dict(outcome.hardware)
    if outcome.mount_bytes is not None:
        manifest["mount_bytes"] = dict(outcome.mount_bytes)
    if outcome.output_dirs_streamed is not None:
        manifest["output_dirs_streamed"] = {
            folder: list(paths) for folder, paths in outcome.output_dirs_streamed.items()
        }
    if outcome.mount_writes:
        manifest["mount_writes"] = [dict(entry) for entry in outcome.mount_writes]
    if outcome.output_dirs_truncated is not None:
        manifest["output_dirs_truncated"] = dict(outcome.output_dirs_truncated)
    return manifest


def bundle_bytes(run_dir: Path, outcome: CellOutcome, *, compresslevel: int = 1) -> bytes:
    """The gzipped bundle for *outcome*, built in memory (for small bundles, blocking).

    The tar is assembled uncompressed and deflated in one call: a small bundle is mostly
    headers and padding, and feeding them through ``GzipFile`` piece by piece cost more
    than the compression itself.
    """
    if compresslevel == 0:  # stored, framed like the large bundles (XFL 0) as it is written
        out = io.BytesIO()
        with StoredGzipWriter(out) as gz:
            tar = TarWriter(gz)  # type: ignore[arg-type]  # write() is all it uses
            _write_members(tar, run_dir, outcome)
            tar.close()
        return out.getvalue()
    raw = io.BytesIO()
    tar = TarWriter(raw)
    _write_members(tar, run_dir, outcome)
    tar.close()
    return zlib_ng.compress(raw.getbuffer(), compresslevel, wbits=GZIP_WBITS)


def write_bundle(
    run_dir: Path, outcome: CellOutcome, fileobj: BinaryIO, *, compresslevel: int = 1
) -> int:
    """Write the gzipped bundle for *outcome* to *fileobj*; return the bytes written.

    Synchronous and blocking (tar, gzip, file reads): run it in a worker thread.
    *fileobj* is written to and left open.
    """
    counter = _CountingWriter(fileobj)
    gz: DeflatingGzipWriter | StoredGzipWriter
    if compresslevel == 0:  # stored: framed directly, at memory speed
        gz = StoredGzipWriter(counter)
    else:
        gz = DeflatingGzipWriter(counter, compresslevel)
    with gz:
        tar = TarWriter(gz, copy_bytes=_COPY_BUFFER_BYTES)  # type: ignore[arg-type]
        _write_members(tar, run_dir, outcome)
        tar.close()
    return counter.written


_COPY_BUFFER_BYTES = 14 * 0xFFFF
"""Members are copied ~0.9 MiB at a time (tarfile's 16 KiB costs ~30 us of Python per step).

Just under 1 MiB on purpose: with the worker's malloc settings (cli.py), an allocation from
1 MiB up is a fresh mapping whose pages fault in on every copy, while a smaller one reuses
warm heap memory. 14 stored blocks read, framed into at most 15 (with the part block left
over from the last write), stay below it too."""


# ---- manifest pieces -----------------------------------------------------------------


def _bundle_entry(
    meta: Mapping[str, object], sizes: Mapping[str, int], what: str, *, required: bool
) -> dict[str, object]:
    """*meta* with ``file`` as ``files/<basename>``, or an error entry if it is missing."""
    entry = dict(meta)
    if "error" in entry or (not required and entry.get("file") is None):
        return entry
    member = _files_member(entry.get("file"))
    if member is None or member not in sizes:
        kind = entry.get("type")
        return {
            "error": f"The output file of {what} was not produced",
            "type": kind if isinstance(kind, str) and kind else "MissingOutputFile",
        }
    entry["file"] = member
    return entry


def _seed_outputs(
    variables: Mapping[str, Mapping[str, object]], sizes: Mapping[str, int]
) -> list[dict[str, object]]:
    outputs: list[dict[str, object]] = []
    for name in sorted(variables):
        member = variables[name].get("file")
        if "error" in variables[name] or not isinstance(member, str):
            continue
        outputs.append(
            {
                "name": name,
                "content_type": variables[name].get("content_type"),
                "file": member,
                "bytes": sizes[member],
            }
        )
    return outputs


def _seed_display(
    mime_displays: Sequence[MimeDisplay], sizes: Mapping[str, int], stored_as: Mapping[str, str]
) -> list[dict[str, object]]:
    entries: list[dict[str, object]] = []
    for mime in mime_displays:
        member = _display_member(mime.file)
        if member is None or member not in sizes:
            continue
        entry: dict[str, object] = {
            "file": stored_as.get(member, member),
            "content_type": mime.content_type,
            "bytes": sizes[member],
            "index": mime.index,
            "output_type": mime.output_type,
        }
        if mime.dropped is not None:
            entry["dropped"] = dict(mime.dropped)
        entries.append(entry)
    return entries


def _output_dirs(
    output_dirs: Mapping[str, Mapping[str, int]], sizes: Mapping[str, int]
) -> dict[str, dict[str, int]]:
    described: dict[str, dict[str, int]] = {}
    for folder in sorted(output_dirs):
        if not folder.isidentifier():
            continue
        described[folder] = {
            rel: sizes[member]
            for rel in sorted(output_dirs[folder])
            if (member := _dirs_member(folder, rel)) is not None and member in sizes
        }
    return described


# ---- member names (None: not a name we will ever write) ------------------------------


def _plain(name: object) -> str | None:
    if not isinstance(name, str) or name in ("", ".", ".."):
        return None
    return None if any(c in name for c in "/\\\x00") else name


def _files_member(file: object) -> str | None:
    """``files/<basename>`` (the reference keeps only the last path component)."""
    base = _plain(file.rsplit("/", 1)[-1]) if isinstance(file, str) else None
    return f"{FILES_DIR}/{base}" if base else None


def _display_member(file: str) -> str | None:
    base = _plain(file)
    return f"{DISPLAY_DIR}/{base}" if base else None


def stored_bundle_length(run_dir: Path, outcome: CellOutcome) -> int:
    """The exact length ``write_bundle(..., compresslevel=0)`` writes for the run directory
    as it is now (blocking: it opens and stats the files, reads none of them)."""
    tar = TarWriter(None)
    _write_members(tar, run_dir, outcome)
    tar.close()
    return stored_length(tar.size)


def _dirs_member(folder: str, rel: str) -> str | None:
    parts = PurePosixPath(rel).parts
    if not parts or rel.startswith("/") or any(_plain(part) is None for part in parts):
        return None
    return f"{DIRS_DIR}/{folder}/{'/'.join(parts)}"


# ---- writing -------------------------------------------------------------------------


def _write_members(tar: TarWriter, run_dir: Path, outcome: CellOutcome) -> None:
    _add_console(tar, outcome.stdout, outcome.stderr)
    if not outcome.success:
        tar.add_bytes(ERROR_MEMBER, _json(_error_document(outcome)))
    sizes: dict[str, int] = {}
    stored = _StoredOnce()
    for member in _wanted_members(outcome):
        size = _add_run_file(tar, run_dir, member, stored)
        if size is not None:
            sizes[member] = size
    tar.add_bytes(MANIFEST_MEMBER, _json(build_manifest(outcome, sizes, stored.aliases)))


def _wanted_members(outcome: CellOutcome) -> list[str]:
    """Every run-directory file the outcome refers to, once each, in member order."""
    dirs = [
        _dirs_member(folder, rel)
        for folder in sorted(outcome.output_dirs)
        if folder.isidentifier()
        for rel in sorted(outcome.output_dirs[folder])
    ]
    files = [
        _files_member(meta.get("file"))
        for meta in [*outcome.variables.values(), *outcome.displays]
        if "error" not in meta
    ]
    display = [_display_member(mime.file) for mime in outcome.mime_displays]
    return [name for name in dict.fromkeys([*dirs, *files, *display]) if name is not None]


def _add_console(tar: TarWriter, stdout: console.Text, stderr: console.Text) -> None:
    """``stdout.txt``, ``stderr.txt`` and ``console.json``. A large console is encoded a
    chunk at a time into the same bytes, never held again whole (see console)."""
    if len(stdout) + len(stderr) <= console.CHUNK:  # the usual console: encoded whole
        out, err = str(stdout), str(stderr)
        tar.add_bytes(STDOUT_MEMBER, out.encode("utf-8", "replace"))
        tar.add_bytes(STDERR_MEMBER, err.encode("utf-8", "replace"))
        tar.add_bytes(CONSOLE_MEMBER, _json({"stdout": out, "stderr": err}))
        return
    for name, text in ((STDOUT_MEMBER, stdout), (STDERR_MEMBER, stderr)):
        tar.add_chunks(name, console.utf8_size(text), console.utf8_chunks(text))
    # what _json writes for {"stdout": ..., "stderr": ...}: sorted keys, default separators
    head, middle, tail = b'{"stderr": ', b', "stdout": ', b"}"
    size = len(head) + console.json_size(stderr) + len(middle) + console.json_size(stdout) + 1
    chunks = itertools.chain(
        (head,), console.json_chunks(stderr), (middle,), console.json_chunks(stdout), (tail,)
    )
    tar.add_chunks(CONSOLE_MEMBER, size, chunks)


def _error_document(outcome: CellOutcome) -> dict[str, object]:
    return {
        "type": outcome.error_type or "Error",
        "message": outcome.error or "",
        "traceback": outcome.traceback or "",
        "exit_code": 1,
    }


def _add_run_file(tar: TarWriter, run_dir: Path, member: str, stored: _StoredOnce) -> int | None:
    """Stream ``run_dir/<member>`` into the tar, unless ``stored`` says its bytes are in
    already; None when it is not a regular file."""
    with _open_regular(run_dir, member.split("/")) as source:
        if source is None:
            return None
        st = os.fstat(source.fileno())
        if not stored.known(member, st):
            tar.add_file(member, source, st.st_size)
        return st.st_size


class _StoredOnce:
    """Which ``files/`` member holds each file stored so far (by device and inode), so a
    ``display/`` file that is the same file is not stored again (``aliases``)."""

    def __init__(self) -> None:
        self._files: dict[tuple[int, int], str] = {}
        self.aliases: dict[str, str] = {}

    def known(self, member: str, st: os.stat_result) -> bool:
        """Whether ``member`` (a display file) is stored already, as a ``files/`` member."""
        key = (st.st_dev, st.st_ino)
        if member.startswith(f"{FILES_DIR}/"):
            self._files.setdefault(key, member)
            return False
        first = self._files.get(key) if member.startswith(f"{DISPLAY_DIR}/") else None
        if first is None:
            return False
        self.aliases[member] = first
        return True


@contextmanager
def _open_regular(root: Path, parts: list[str]) -> Iterator[BinaryIO | None]:
    """Open ``root/<parts…>`` following no link on the way; None unless a regular file."""
    try:
        source = run_files.open_regular(root, parts)
    except OSError:
        yield None
        return
    with source:
        yield source


def _json(document: object) -> bytes:
    """Strict JSON on one line: a non-finite float (a NaN or infinite preview) is written
    as ``null``, as the reference's harness writes it; ``NaN`` is not JSON, and a browser's
    parser refuses the whole manifest over one."""
    # without ``indent`` the C encoder runs (the pure-Python one cost more than tarring a
    # small bundle); the second pass is only for documents that hold a non-finite float
    try:
        text = json.dumps(document, sort_keys=True, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(document), sort_keys=True, allow_nan=False)
    return text.encode("utf-8")


def _finite(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


class _CountingWriter:
    """A write-only file object that forwards to another and counts the bytes."""

    def __init__(self, target: BinaryIO) -> None:
        self._target = target
        self.written = 0

    def write(self, data: bytes) -> int:
        self._target.write(data)
        self.written += len(data)
        return len(data)

    def flush(self) -> None:
        self._target.flush()
