"""The in-kernel side of one cell run: bind inputs before the cell, collect outputs after.

Shipped into every kernel as ``strata_kernel_agent.runtime`` (stdlib only at import time).
The worker sends ONE ``execute_request`` per cell: its ``metadata["strata"]`` holds the run
plan (data only: paths, names, formats, env), which the ``pre_run_cell`` hook applies; the
``post_run_cell`` hook writes the outputs and a report into the run directory before the
kernel replies, so a cell costs one round trip. Nothing of the request becomes kernel source.

This module installs the hooks and ends each run; ``inputs`` binds the inputs, ``outputs``
collects the outputs, ``displays`` records what the cell shows, ``plain_process`` makes the
cell behave as in a plain Python process, and ``run_state`` holds the run they share.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from . import (
    arrow_codec,
    display_files,
    display_forms,
    displays,
    figures,
    inputs,
    outputs,
    plain_process,
    rebinding,
    tracebacks,
)
from .plan import RunPlan
from .run_state import Run, current, current_plan, state


def _parent_plan(shell: Any) -> Any:
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return None
    parent = kernel.get_parent("shell") or {}
    metadata = parent.get("metadata") or {}
    plan = metadata.get("strata")
    return None if plan is None else RunPlan.from_dict(plan)


def _pre_run_cell(info: Any = None) -> None:
    shell = state["shell"]
    plan = _parent_plan(shell)
    if plan is None:
        return
    run = Run(plan, getattr(info, "raw_cell", None))
    state["run"] = run
    try:
        inputs.bind(shell, run)
    except BaseException as exc:  # reported as the cell's own failure, never swallowed
        run.error = exc
    run.before = {name: id(value) for name, value in shell.user_ns.items()}
    # a name the cell binds to the object it held is an output all the same, except an
    # input's (the reference's rule: its namespace holds only what the request gave)
    given = plan.given_names()
    run.rebound = rebinding.start(
        name for name in run.before if name not in given and not name.startswith("_")
    )


def _post_run_cell(result: Any = None) -> None:
    """After a successful cell (and before the kernel replies), collect its outputs."""
    run = current()
    if run is None or run.collected or (result is not None and not result.success):
        return
    run.collected = True
    try:
        with outputs.silenced():
            outputs.collect(run)
    except BaseException as exc:  # reported to the worker, never lost in the kernel's log
        outputs.write_report(run.plan.report_path, {"error": f"{type(exc).__name__}: {exc}"})
    finally:
        arrow_codec.offer_spares(None)  # offered to this run's outputs only


def _end_run() -> None:
    run = state["run"]
    state["run"] = None
    rebinding.stop()
    arrow_codec.offer_spares(None)
    figures.forget_renders()
    display_forms.forget_forms()
    if run is not None:
        _forget_run_imports(run)


def _forget_run_imports(run: Any) -> None:
    """Forget modules imported from the run directory, and import caches of its folders.

    A module the cell wrote and imported (``helpers.py`` in its working directory) or found
    in a folder input would otherwise answer the next request's ``import`` with this
    request's code, from a deleted folder; a fresh interpreter imports that request's own
    file. The caches would also keep one finder per request whose cell imported anything.
    """
    work_dir = run.plan.work_dir
    if not work_dir:
        return
    root = os.path.join(os.path.dirname(work_dir), "")
    # only names added since the last run are looked at (in the background, not before a cell)
    names, before = list(sys.modules), state["modules"]
    if names != before:
        if names[: len(before)] == before:  # the usual change: names added at the end
            names = names[len(before) :]
        modules = sys.modules
        for name in [n for n in names if _imported_from(modules.get(n), root)]:
            del modules[name]
        state["modules"] = list(modules)
    # after the modules: reading a namespace package's __path__ may look in the run dir again
    cache = sys.path_importer_cache
    keys = list(cache)
    if keys != state["finders"]:
        for key in [k for k in keys if isinstance(k, str) and k.startswith(root)]:
            del cache[key]
        state["finders"] = list(cache)


def _imported_from(module: Any, root: Any) -> Any:
    """Whether ``module``'s file (or a namespace package's folder) is below ``root``."""
    try:
        attributes = vars(module)  # never a lazy module's __getattr__
        location = attributes.get("__file__")
        if isinstance(location, str):
            return location.startswith(root)
        return any(str(folder).startswith(root) for folder in attributes.get("__path__") or ())
    except Exception:  # not a module: nothing of the run's
        return False


def install(shell: Any, pool: Any) -> None:
    """Hook the agent into ``shell``; called once per kernel, before its baseline is taken,
    by the pool's in-kernel code, which hands over its hooks (``pool``, a
    :class:`~.host.PoolHooks`)."""
    state["shell"] = shell
    displays.patch_display()
    displays.quiet_formatting(shell)
    plain_process.no_loop_while_synchronous(shell)
    plain_process.plain_python_text(shell)
    # %store keeps values on disk for any later request (the reference has no such store)
    shell.magics_manager.magics["line"].pop("store", None)
    displays.patch_figure_show(pool)
    figures.install(shell)
    display_files.install(shell, current_plan)
    shell.events.register("pre_run_cell", _pre_run_cell)
    shell.events.register("post_execute", displays.stop_recording)
    shell.events.register("post_run_cell", _post_run_cell)
    shell.ast_transformers.append(inputs.FailCell())
    shell.ast_transformers.append(rebinding.MarkRebinds())
    shell.InteractiveTB.set_mode(mode="Plain")  # the fastest of IPython's layouts
    tracebacks.install(shell, plain_process.current_source, plain_process.cell_file_label)
    shell.colors = "nocolor"
    shell.user_ns["display"] = displays.display
    shell.user_ns["exit"] = shell.user_ns["quit"] = plain_process.Exit()
    plain_process.stdin_at_eof(shell)
    plain_process.cell_warning_format(shell)
    shell.user_ns["Markdown"] = displays.Markdown
    pool.register_reset_hook(_end_run)
