"""Binding a cell's inputs: each staged file loaded into the namespace before the cell
runs, with the paths, tables and environment its plan names.

An input that cannot be loaded fails the cell: ``FailCell`` replaces the cell's code by
``raise_pending``, which raises the error as the cell's own. Stdlib only at import time.
"""

import ast
import os
import pathlib

from . import arrow_codec, codecs
from .run_state import current


def given_names(plan):
    names = {spec["name"] for spec in plan.get("inputs", ())}
    names.update(plan.get("paths") or ())
    for table in plan.get("tables") or ():
        names.update((table, f"{table}_snapshot"))
    return names


def bind(shell, run):
    plan = run.plan
    arrow_codec.offer_spares(plan.get("spares"))
    for key, value in (plan.get("env") or {}).items():
        os.environ[str(key)] = str(value)
    work_dir = plan.get("work_dir")
    if work_dir:
        os.chdir(work_dir)
    ns = shell.user_ns
    for name in ("_", "__", "___"):  # IPython's output placeholders: no such names here
        if ns.get(name, None) == "":
            del ns[name]
    for spec in plan.get("inputs", ()):
        name = spec["name"]
        try:
            injected = {
                sub["name"]: codecs.load_input(sub["path"], sub["content_type"])
                for sub in spec.get("injected", ())
            }
            value = codecs.load_input(
                spec["path"],
                spec["content_type"],
                injected=injected or None,
                work_dir=work_dir,
                limits=plan.get("limits"),
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
    for name, path in (plan.get("paths") or {}).items():
        ns[name] = pathlib.Path(path)
    for name, table in (plan.get("tables") or {}).items():
        ns[name] = table.get("uri", "")
        ns[f"{name}_snapshot"] = table.get("snapshot_id")


class InputError(Exception):
    """An input could not be loaded; the cell does not run."""


InputError.__module__ = "builtins"  # a traceback names it InputError, not this agent's module


def raise_pending():
    """Called in place of the cell when preparing it failed."""
    run = current()
    if run is not None and run.error is not None:
        error, run.error = run.error, None
        raise error


class FailCell(ast.NodeTransformer):
    """Replace the cell by :func:`raise_pending` when its inputs could not be prepared."""

    def visit_Module(self, node):
        run = current()
        if run is None or run.error is None:
            return node
        call = ast.parse("__import__('strata_kernel_agent').inputs.raise_pending()")
        return ast.fix_missing_locations(call)
