"""The bundle's manifest (``manifest.json``) and the names of its members: pure functions of
a cell's :class:`CellOutcome` and of the members found in its run directory.

See ``bundle`` for the format both readers take; this module holds what the manifest says
and which run-directory files the bundle takes (:func:`wanted_members`), nothing that reads
or writes a file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from ..runs import console
from ..runs.display_files import MimeDisplay

__all__ = [
    "EXECUTOR_REF",
    "SCHEMA_VERSION",
    "CellOutcome",
    "build_manifest",
    "wanted_members",
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
    # the locked environment it ran in: {key (its directory key), installed (by this run)}
    environment: Mapping[str, object] | None = None


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
    if outcome.environment is not None:
        manifest["environment"] = dict(outcome.environment)
    return manifest


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


def _dirs_member(folder: str, rel: str) -> str | None:
    parts = PurePosixPath(rel).parts
    if not parts or rel.startswith("/") or any(_plain(part) is None for part in parts):
        return None
    return f"{DIRS_DIR}/{folder}/{'/'.join(parts)}"


def wanted_members(outcome: CellOutcome) -> list[str]:
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
