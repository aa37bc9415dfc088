"""The user namespace and what IPython keeps of the cells run in it.

The reset drops the names cells bound and puts back the baseline's (a preloaded name a cell
deleted or replaced is reported), and empties the output cache, the input history, the
last error and its traceback, and the source lines kept for each cell.
"""

from __future__ import annotations

import builtins
import contextlib
import linecache
import sys
from typing import Any

from .baseline import BASELINE, MISSING, PRELOADED

_LAST_ERROR_ATTRS = ("last_type", "last_value", "last_traceback", "last_exc")


def restore_names(ns: dict[str, Any], problems: list[str]) -> None:
    names = BASELINE["names"]
    for name in [n for n in list(ns) if n not in names]:
        del ns[name]
    for name, obj in names.items():
        current = ns.get(name, MISSING)
        if current is obj:
            continue
        if name in PRELOADED:
            what = "deleted" if current is MISSING else "replaced"
            problems.append(f"preloaded name {name!r} was {what}")
        ns[name] = obj


def clear_caches(shell: Any) -> Any:
    try:
        _flush_output_cache(shell)
    except Exception as exc:  # a cell may have broken the display hook
        return [f"output cache flush failed: {type(exc).__name__}"]
    hm = shell.history_manager
    parsed, raw = BASELINE["history"]
    del hm.input_hist_parsed[parsed:]
    del hm.input_hist_raw[raw:]
    for attr in _LAST_ERROR_ATTRS:
        if hasattr(sys, attr):
            delattr(sys, attr)
    _drop_tracebacks(shell)
    shell.last_execution_result = None
    shell._last_traceback = None
    _forget_cell_sources(shell)
    return []


def _drop_tracebacks(shell: Any) -> None:
    """Let go of the last failed cell's traceback, and of everything its frames hold.

    The reset runs while the request's handler is still finishing: the failed cell's
    exception (in the execution result), its traceback (also kept by IPython's traceback
    formatter for ``%debug``) and the frames it holds are alive when the reset's collection
    runs, and would be frozen with the baseline, where no later collection looks (they form
    a cycle through the result): about 12 objects, 3.8 KB, plus whatever the cell's frames
    hold, lost for good with every failed cell.
    """
    formatters: tuple[Any, ...] = (
        getattr(shell, "InteractiveTB", None),
        getattr(shell, "SyntaxTB", None),
    )
    for formatter in formatters:
        if getattr(formatter, "tb", None) is not None:
            formatter.tb = None
    result = shell.last_execution_result
    pending = [getattr(result, "error_in_exec", None), getattr(result, "error_before_exec", None)]
    seen = set()
    while pending:
        exc = pending.pop()
        if not isinstance(exc, BaseException) or id(exc) in seen:
            continue
        seen.add(id(exc))
        tb, exc.__traceback__ = exc.__traceback__, None
        while tb is not None:  # should anything else still hold the traceback
            with contextlib.suppress(Exception):  # a frame still running, a generator's
                tb.tb_frame.clear()
                _ = tb.tb_frame.f_locals  # a copy of the locals made earlier is emptied too
            tb = tb.tb_next
        pending += [exc.__cause__, exc.__context__, *getattr(exc, "exceptions", ())]


def _forget_cell_sources(shell: Any) -> None:
    """Drop the source lines IPython keeps of each cell run since the baseline.

    Every cell's text stays in ``linecache`` (for tracebacks) under a name of its own, one
    per distinct text, for the life of the kernel: a kernel serving a notebook whose cells
    change would grow by about 3 KB per 1 KB cell run, and never give it back.
    """
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    kept = BASELINE.get("cell_names", ())
    if not isinstance(names, dict) or len(names) <= len(kept):
        return
    extra = getattr(linecache, "_ipython_cache", None)
    for name in [n for n in list(names) if n not in kept]:
        del names[name]
        linecache.cache.pop(name, None)
        if isinstance(extra, dict):
            extra.pop(name, None)


def _flush_output_cache(shell: Any) -> None:
    """What IPython's ``DisplayHook.flush`` does, in time proportional to what is cached.

    IPython's walks every execution count so far (``_1`` … ``_<count>``), so with stored
    history a reset got slower with every cell the kernel had run; its ``gc.collect`` is
    :func:`reset`'s own. ``_<n>`` names come from the output cache ``_oh``. The hidden
    names also hold ``_i<n>`` (stored inputs) and any ``_<n>`` a cell left without an
    ``_oh`` entry: they are dropped too, or the hidden names would grow with every cell.
    """
    hook = shell.displayhook
    ns, hidden = shell.user_ns, shell.user_ns_hidden
    cache = ns.get("_oh")
    numbered = {f"_{n}" for n in list(cache)} if isinstance(cache, dict) else set()
    numbered.update(k for k in list(hidden) if k[:1] == "_" and k.lstrip("_i").isdigit())
    numbered.difference_update(BASELINE.get("names", ()))  # a preload's `_1` stays
    for key in numbered:
        ns.pop(key, None)
        hidden.pop(key, None)
    if isinstance(cache, dict):
        cache.clear()
    hook._, hook.__, hook.___ = "", "", ""  # the display hook's own references to outputs
    if "_" not in vars(builtins):
        ns.update({"_": "", "__": "", "___": ""})
