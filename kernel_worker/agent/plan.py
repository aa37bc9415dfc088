"""The run plan: everything the worker tells the agent about one run, as one typed value.

The worker builds a :class:`RunPlan` once per cell, complete (``execution.build_plan``), and
never changes it; it travels as plain data in the ``execute_request``'s metadata
(``metadata["strata"]``, :meth:`RunPlan.to_dict`) and the agent reads it back with
:meth:`RunPlan.from_dict`, so both sides hold the same type. Data only (paths, names,
formats, env): nothing of the request becomes kernel source.

This module runs inside kernels (shipped as ``strata_kernel_agent.plan``): standard library
only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

__all__ = ["DisplayLimits", "KernelLimits", "PlannedInput", "RunPlan", "TableRef"]


class DisplayLimits(TypedDict):
    """The display caps: bytes of one display, and of all the displays a run keeps."""

    display_bytes: int
    run_display_bytes: int


class KernelLimits(DisplayLimits):
    """The caps the agent applies (see the worker's ``runs.limits``)."""

    folder_input_bytes: int
    folder_input_entries: int


class TableRef(TypedDict):
    """A table input: bound as its URI, and ``<name>_snapshot`` as its snapshot id."""

    uri: str
    snapshot_id: int | None


@dataclass(frozen=True, slots=True)
class PlannedInput:
    """One staged input: the variable it binds, its format and its file."""

    name: str
    content_type: str
    path: str
    injected: tuple[PlannedInput, ...] = ()
    """Values a ``module/cell`` input's source refers to, loaded first."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "content_type": self.content_type,
            "path": self.path,
            "injected": [sub.to_dict() for sub in self.injected],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlannedInput:
        return cls(
            name=str(data["name"]),
            content_type=str(data["content_type"]),
            path=str(data["path"]),
            injected=tuple(cls.from_dict(sub) for sub in data.get("injected", ())),
        )


@dataclass(frozen=True, slots=True)
class RunPlan:
    """What one run binds, where it writes, and the caps it keeps to."""

    inputs: tuple[PlannedInput, ...]
    paths: Mapping[str, str]
    """Names bound to a folder as a ``Path``: mounts and ``# @output_dir`` folders."""
    env: Mapping[str, str]
    """Environment variables set before the cell runs."""
    work_dir: str
    """The cell's working directory."""
    files_dir: str
    """Where the outputs' files go."""
    display_dir: str
    """Where large display formats are written as files."""
    report_path: str
    """Where the agent writes what it collected (JSON)."""
    mutation_defines: tuple[str, ...]
    """Names that are outputs even when the cell only mutated them."""
    tables: Mapping[str, TableRef]
    limits: KernelLimits
    spares: tuple[tuple[str, int], ...] = ()
    """``(path, size)`` of kept files the outputs may take over (see the worker's reuse)."""

    def given_names(self) -> set[str]:
        """The names the request binds (inputs, folders, tables and their snapshots)."""
        names = {spec.name for spec in self.inputs}
        names.update(self.paths)
        for table in self.tables:
            names.update((table, f"{table}_snapshot"))
        return names

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (``spares`` only when there are any)."""
        data: dict[str, Any] = {
            "inputs": [spec.to_dict() for spec in self.inputs],
            "paths": dict(self.paths),
            "env": dict(self.env),
            "work_dir": self.work_dir,
            "files_dir": self.files_dir,
            "display_dir": self.display_dir,
            "report_path": self.report_path,
            "mutation_defines": list(self.mutation_defines),
            "tables": {name: dict(table) for name, table in self.tables.items()},
            "limits": dict(self.limits),
        }
        if self.spares:
            data["spares"] = [[path, size] for path, size in self.spares]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunPlan:
        """The plan :meth:`to_dict` wrote (a missing or malformed field raises)."""
        limits = data["limits"]
        return cls(
            inputs=tuple(PlannedInput.from_dict(spec) for spec in data["inputs"]),
            paths={str(name): str(path) for name, path in data["paths"].items()},
            env={str(key): str(value) for key, value in data["env"].items()},
            work_dir=str(data["work_dir"]),
            files_dir=str(data["files_dir"]),
            display_dir=str(data["display_dir"]),
            report_path=str(data["report_path"]),
            mutation_defines=tuple(str(name) for name in data["mutation_defines"]),
            tables={
                str(name): TableRef(uri=str(table["uri"]), snapshot_id=table.get("snapshot_id"))
                for name, table in data["tables"].items()
            },
            limits=KernelLimits(
                folder_input_bytes=int(limits["folder_input_bytes"]),
                folder_input_entries=int(limits["folder_input_entries"]),
                display_bytes=int(limits["display_bytes"]),
                run_display_bytes=int(limits["run_display_bytes"]),
            ),
            spares=tuple((str(path), int(size)) for path, size in data.get("spares", ())),
        )
