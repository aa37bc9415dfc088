"""Binding a cell's inputs: each staged file loaded into the namespace before the cell
runs, with the paths, tables and environment its plan names.

An input that cannot be loaded fails the cell: ``FailCell`` replaces the cell's code by
``raise_pending``, which raises the error as the cell's own. Stdlib only at import time.
"""

from __future__ import annotations

import ast
import os
import pathlib
from typing import Any

from . import arrow_codec, codecs
from .run_state import current


def bind(shell: Any, run: Any) -> None:
    plan = run.plan  # a RunPlan (see plan)
    arrow_codec.offer_spares(list(plan.spares))
    for key, value in plan.env.items():
        os.environ[key] = value
    work_dir = plan.work_dir
    if work_dir:
        os.chdir(work_dir)
    ns = shell.user_ns
    for name in ("_", "__", "___"):  # IPython's output placeholders: no such names here
        if ns.get(name, None) == "":
            del ns[name]
    for spec in plan.inputs:
        name = spec.name
        try:
            injected = {
                sub.name: codecs.load_input(sub.path, sub.content_type) for sub in spec.injected
            }
            value = codecs.load_input(
                spec.path,
                spec.content_type,
                injected=injected or None,
                work_dir=work_dir,
                limits=plan.limits,
            )
        except codecs.RArtifactError as exc:  # the two errors that name their input
            raise codecs.RArtifactError(exc.file_path, variable_name=name) from None
        except codecs.PrecisionError as exc:
            raise codecs.PrecisionError(
                exc.stored_dtype, exc.reconstructed_dtype, variable_name=name
            ) from None
        except Exception as exc:
            raise InputError(f"Error deserializing {name}: {exc}") from exc
        ns[name] = value
        run.inputs[name] = value
        run.fingerprints[name] = codecs.fingerprint(value)
    for name, path in plan.paths.items():
        ns[name] = pathlib.Path(path)
    for name, table in plan.tables.items():
        ns[name] = table["uri"]
        ns[f"{name}_snapshot"] = table["snapshot_id"]


class InputError(Exception):
    """An input could not be loaded; the cell does not run."""


InputError.__module__ = "builtins"  # a traceback names it InputError, not this agent's module


def raise_pending() -> None:
    """Called in place of the cell when preparing it failed."""
    run = current()
    if run is not None and run.error is not None:
        error, run.error = run.error, None
        raise error


class FailCell(ast.NodeTransformer):
    """Replace the cell by :func:`raise_pending` when its inputs could not be prepared."""

    def visit_Module(self, node: Any) -> Any:
        run = current()
        if run is None or run.error is None:
            return node
        call = ast.parse("__import__('strata_kernel_agent').inputs.raise_pending()")
        return ast.fix_missing_locations(call)
