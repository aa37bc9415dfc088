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

A bundle is written from one :class:`BundlePlan`, computed once (:func:`plan_bundle`): the
run-directory files it takes and their sizes, the manifest, the gzip level and, for a stored
bundle, its exact length. Writing it then reads each member once. The manifest and member
names are ``manifest``'s.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from zlib_ng import zlib_ng

from ..runs import console
from ..runs import files as run_files
from ..runs.display_files import MimeDisplay
from .manifest import (
    CONSOLE_MEMBER,
    DISPLAY_DIR,
    ERROR_MEMBER,
    EXECUTOR_REF,
    FILES_DIR,
    MANIFEST_MEMBER,
    SCHEMA_VERSION,
    STDERR_MEMBER,
    STDOUT_MEMBER,
    CellOutcome,
    build_manifest,
    wanted_members,
)
from .stored_gzip import GZIP_WBITS, DeflatingGzipWriter, StoredGzipWriter, stored_length
from .tarwriter import TarWriter

__all__ = [
    "ALWAYS_COMPRESS_BYTES",
    "COMPRESS_UP_TO_BYTES",
    "DEFLATE_LEVEL",
    "EXECUTOR_REF",
    "SCHEMA_VERSION",
    "BundlePlan",
    "CellOutcome",
    "FoundFile",
    "MimeDisplay",
    "PlannedMember",
    "build_manifest",
    "bundle_bytes",
    "choose_level",
    "plan_bundle",
    "stored_bundle_length",
    "write_bundle",
]

ALWAYS_COMPRESS_BYTES = 64 * 1024
COMPRESS_UP_TO_BYTES = 8 * 1024 * 1024
DEFLATE_LEVEL = 2  # see choose_level
SAMPLE_BYTES = 16 * 1024  # deflating it costs well under 0.5 ms
_WORTH_COMPRESSING = 0.8  # a sample must shrink below this fraction of its size


@dataclass(frozen=True, slots=True)
class FoundFile:
    """A run-directory file the bundle takes, as found when it was planned."""

    size: int
    identity: tuple[int, int]
    """``(st_dev, st_ino)``: two members that are one file (a hard link) share it."""


@dataclass(frozen=True, slots=True)
class PlannedMember:
    """One run-directory file in the bundle."""

    name: str  # the member's name, e.g. "files/x.arrow", "display/0.png"
    size: int
    stored_in: str | None = None
    """The ``files/`` member that holds this ``display/`` file's bytes (the same file):
    the manifest names that one, and these bytes are not stored again."""


def planned_members(outcome: CellOutcome, found: Mapping[str, FoundFile]) -> list[PlannedMember]:
    """The members the bundle takes, in member order: each file ``outcome`` refers to that
    ``found`` holds (pure). A ``display/`` file that is a ``files/`` member's file is
    stored once."""
    first: dict[tuple[int, int], str] = {}
    members: list[PlannedMember] = []
    for name in wanted_members(outcome):
        facts = found.get(name)
        if facts is None:
            continue
        stored_in = None
        if name.startswith(f"{FILES_DIR}/"):
            first.setdefault(facts.identity, name)
        elif name.startswith(f"{DISPLAY_DIR}/"):
            stored_in = first.get(facts.identity)
        members.append(PlannedMember(name, facts.size, stored_in))
    return members


def choose_level(payload: int, sample: Callable[[], bytes]) -> int:
    """The gzip level for a bundle of ``payload`` bytes, chosen by measurement (pure, but
    for ``sample``, called only when the size does not decide: the middle of the largest
    file).

    Deflating is zlib-ng's, whose level 2 both shrinks more than zlib's level 1 and runs
    1.6-2x faster (JSON: ratio 0.126 at ~500 MB/s, zlib 0.130 at ~240; Arrow of random
    floats: 0.474 at ~100 MB/s, zlib 0.481 at ~60); its level 1 is faster again but shrinks
    JSON 40 % less. Small bundles (manifest, console, a few values) always get it. Past
    that, binary outputs (Arrow, pickles, PNG) barely shrink: a sample of the largest file
    decides, and bundles over ``COMPRESS_UP_TO_BYTES`` are always stored (level 0) so they
    stream at memory speed.
    """
    if payload <= ALWAYS_COMPRESS_BYTES:
        return DEFLATE_LEVEL
    if payload > COMPRESS_UP_TO_BYTES:
        return 0
    data = sample()
    if not data:
        return DEFLATE_LEVEL
    compressed = len(zlib_ng.compress(data, DEFLATE_LEVEL))
    return DEFLATE_LEVEL if compressed <= len(data) * _WORTH_COMPRESSING else 0


@dataclass(frozen=True, slots=True)
class BundlePlan:
    """One bundle, decided: what it holds, how it is compressed and (stored) how long it is.

    Built by :func:`plan_bundle` (or :meth:`of`, from what was found); written by
    :meth:`write` or :meth:`to_bytes`, any number of times, with the same bytes while the
    run directory is unchanged.
    """

    root: Path
    outcome: CellOutcome
    members: tuple[PlannedMember, ...]
    manifest: bytes
    compresslevel: int
    payload: int
    """Bytes of content: the console's characters and every member's file."""
    length: int | None
    """The exact bytes :meth:`write` writes, when known up front (a stored bundle)."""

    @classmethod
    def of(
        cls,
        root: Path,
        outcome: CellOutcome,
        found: Mapping[str, FoundFile],
        compresslevel: int | None = None,
        sample: Callable[[PlannedMember], bytes] = lambda _member: b"",
    ) -> BundlePlan:
        """The plan for ``outcome`` given the files ``found`` (pure, but for ``sample``,
        which reads the middle of a member; see :func:`choose_level`). ``compresslevel``
        None: chosen by :func:`choose_level`."""
        members = tuple(planned_members(outcome, found))
        sizes = {member.name: member.size for member in members}
        aliases = {m.name: m.stored_in for m in members if m.stored_in is not None}
        manifest = _json(build_manifest(outcome, sizes, aliases))
        payload = len(outcome.stdout) + len(outcome.stderr) + sum(sizes.values())
        if compresslevel is None:
            largest = max(members, key=lambda member: member.size, default=None)
            compresslevel = choose_level(
                payload, lambda: sample(largest) if largest is not None else b""
            )
        plan = cls(root, outcome, members, manifest, compresslevel, payload, None)
        if compresslevel != 0:
            return plan
        return cls(root, outcome, members, manifest, 0, payload, _stored_length(plan))

    def write(self, fileobj: BinaryIO) -> int:
        """Write the gzipped bundle to ``fileobj`` (left open); return the bytes written.

        Blocking (tar, gzip, file reads): run it in a worker thread.
        """
        counter = _CountingWriter(fileobj)
        gz: DeflatingGzipWriter | StoredGzipWriter
        if self.compresslevel == 0:  # stored: framed directly, at memory speed
            gz = StoredGzipWriter(counter)
        else:
            gz = DeflatingGzipWriter(counter, self.compresslevel)
        with gz:
            tar = TarWriter(gz, copy_bytes=_COPY_BUFFER_BYTES)  # type: ignore[arg-type]
            _write_members(tar, self)
            tar.close()
        return counter.written

    def to_bytes(self) -> bytes:
        """The gzipped bundle, built in memory (for small bundles, blocking).

        The tar is assembled uncompressed and deflated in one call: a small bundle is
        mostly headers and padding, and feeding them through a gzip writer piece by piece
        cost more than the compression itself.
        """
        if self.compresslevel == 0:  # stored, framed like the large bundles (XFL 0)
            out = io.BytesIO()
            with StoredGzipWriter(out) as gz:
                tar = TarWriter(gz)  # type: ignore[arg-type]  # write() is all it uses
                _write_members(tar, self)
                tar.close()
            return out.getvalue()
        raw = io.BytesIO()
        tar = TarWriter(raw)
        _write_members(tar, self)
        tar.close()
        return zlib_ng.compress(raw.getbuffer(), self.compresslevel, wbits=GZIP_WBITS)


def plan_bundle(root: Path, outcome: CellOutcome, compresslevel: int | None = None) -> BundlePlan:
    """The plan of ``outcome``'s bundle from the run directory ``root`` as it is now
    (blocking: it opens and stats each file the outcome refers to, following no link, and
    reads a sample of one only when the level is chosen by measurement)."""
    found: dict[str, FoundFile] = {}
    for name in wanted_members(outcome):
        try:
            with run_files.open_regular(root, name.split("/")) as source:
                st = os.fstat(source.fileno())
        except OSError:  # not a regular file (or gone): left out
            continue
        found[name] = FoundFile(st.st_size, (st.st_dev, st.st_ino))
    return BundlePlan.of(root, outcome, found, compresslevel, lambda m: _sample(root, m))


def _sample(root: Path, member: PlannedMember) -> bytes:
    """Up to ``SAMPLE_BYTES`` from the middle of ``member`` (past any header)."""
    try:
        with run_files.open_regular(root, member.name.split("/")) as fh:
            fh.seek(max(0, member.size // 2 - SAMPLE_BYTES // 2))
            return fh.read(SAMPLE_BYTES)
    except OSError:
        return b""


def bundle_bytes(run_dir: Path, outcome: CellOutcome, *, compresslevel: int = 1) -> bytes:
    """The gzipped bundle for *outcome*, built in memory (see :meth:`BundlePlan.to_bytes`)."""
    return plan_bundle(run_dir, outcome, compresslevel).to_bytes()


def write_bundle(
    run_dir: Path, outcome: CellOutcome, fileobj: BinaryIO, *, compresslevel: int = 1
) -> int:
    """Write the gzipped bundle for *outcome* to *fileobj*; return the bytes written
    (see :meth:`BundlePlan.write`)."""
    return plan_bundle(run_dir, outcome, compresslevel).write(fileobj)


def stored_bundle_length(run_dir: Path, outcome: CellOutcome) -> int:
    """The exact length ``write_bundle(..., compresslevel=0)`` writes for the run directory
    as it is now (blocking: it opens and stats the files, reads none of them)."""
    return _stored_length(plan_bundle(run_dir, outcome, 0))


def _stored_length(plan: BundlePlan) -> int:
    """What ``plan`` written stored (level 0) comes to: its headers as they will be written,
    its files as the sizes planned (none is read)."""
    tar = TarWriter(None)
    _write_members(tar, plan)
    tar.close()
    return stored_length(tar.size)


_COPY_BUFFER_BYTES = 14 * 0xFFFF
"""Members are copied ~0.9 MiB at a time (tarfile's 16 KiB costs ~30 us of Python per step).

Just under 1 MiB on purpose: with the worker's malloc settings (cli.py), an allocation from
1 MiB up is a fresh mapping whose pages fault in on every copy, while a smaller one reuses
warm heap memory. 14 stored blocks read, framed into at most 15 (with the part block left
over from the last write), stay below it too."""


# ---- writing -------------------------------------------------------------------------


def _write_members(tar: TarWriter, plan: BundlePlan) -> None:
    """Every member in order; run-directory files are read unless ``tar`` only measures."""
    outcome = plan.outcome
    _add_console(tar, outcome.stdout, outcome.stderr)
    if not outcome.success:
        tar.add_bytes(ERROR_MEMBER, _json(_error_document(outcome)))
    for member in plan.members:
        if member.stored_in is None:
            _add_run_file(tar, plan.root, member)
    tar.add_bytes(MANIFEST_MEMBER, plan.manifest)


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


def _add_run_file(tar: TarWriter, root: Path, member: PlannedMember) -> None:
    """Stream ``root/<member>`` into the tar, the size it was planned with: a file that
    stopped being a regular file, or that is shorter now, is an ``OSError``."""
    if tar.measuring:
        tar.add_file(member.name, io.BytesIO(), member.size)
        return
    with run_files.open_regular(root, member.name.split("/")) as source:
        tar.add_file(member.name, source, member.size)


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
