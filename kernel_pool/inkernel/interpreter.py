"""Interpreter state every request runs through: core modules, ``sys`` hooks, the import
system, and the kernel's own machinery and event loop.

The reset puts back the attributes of the core modules (also right after each execution,
before the reply), the ``sys`` hooks, ``sys.meta_path`` and ``sys.path_hooks``, the importer
cache, async generator hooks and ``gc`` callbacks; what it cannot put back (the shell's
transformers and handlers, a cell's timers and tasks on the loop, a closed ``sys.stdout``)
makes the kernel unfit for reuse."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
from collections.abc import Iterator
from typing import Any

from .baseline import BASELINE, MISSING
from .imports import restore_module_table
from .messaging import drain_fd_output
from .patches import restore_module_patches, restore_touched
from .process import fd_identity, restore_std_fds

# code of these packages is the kernel's own (its message handling runs as loop tasks)
_KERNEL_PACKAGES = ("ipykernel", "tornado", "zmq", "jupyter_client", "IPython", "anyio")


def _restore_core_modules() -> None:
    """Undo monkeypatches of the core modules (the kernel's own messaging uses them)."""
    for name, snapshot in BASELINE["module_dicts"].items():
        snapshot.restore(
            BASELINE["modules"][name].__dict__,
            exact=name == "builtins",
        )


def restore_interpreter(problems: list[str]) -> None:
    """Undo monkeypatches of core modules, sys hooks, sys.modules and fds 0-2."""
    _restore_core_modules()
    restore_touched(problems)
    restore_module_patches()
    for name, value in BASELINE["sys_hooks"].items():
        if value is not MISSING and getattr(sys, name, MISSING) is not value:
            setattr(sys, name, value)
    sys.meta_path[:] = BASELINE["meta_path"]
    sys.path_hooks[:] = BASELINE["path_hooks"]
    # hooks that call a cell's function: once its names are gone, they fail in later requests
    if tuple(sys.get_asyncgen_hooks()) != BASELINE["asyncgen_hooks"]:
        firstiter, finalizer = BASELINE["asyncgen_hooks"]
        sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=finalizer)
    if gc.callbacks != BASELINE["gc_callbacks"]:
        # a library's own (added as a cell imported it) stays, as its warning filters do
        baseline = BASELINE["gc_callbacks"]
        kept = [c for c in list(gc.callbacks) if c not in baseline and not _cells(c)]
        gc.callbacks[:] = BASELINE["gc_callbacks"] + kept
    # a finder a cell put there would run later requests' imports; any other is rebuilt
    BASELINE["importer_cache"].restore(sys.path_importer_cache, exact=True)
    restore_module_table()
    restore_std_fds(problems)


def restore_after_execute() -> None:
    """Undo core monkeypatches right after each execution, before the kernel replies.

    The kernel's own messaging uses ``json``; a cell that patched it would otherwise make
    the reply itself unreadable. Output the cell's subprocesses wrote is passed on first.
    """
    drain_fd_output()
    if BASELINE:
        # a std fd the cell closed is put back now, before anything can take its number
        for fd, (copy, _) in BASELINE["fds"].items():
            if fd_identity(fd) is None:
                with contextlib.suppress(OSError):
                    os.dup2(copy, fd)
        _restore_core_modules()
        # the kernel flushes and writes its reply through these: a stand-in the cell left
        # (without write or flush, say) would keep the reply from going out
        for name in ("stdout", "stderr"):
            stream = BASELINE["sys_hooks"].get(name, MISSING)
            if stream is not MISSING and getattr(sys, name, None) is not stream:
                setattr(sys, name, stream)


def _cells(function: Any) -> Any:
    """Whether a callable was defined by a cell (its names are gone after the reset)."""
    return getattr(function, "__module__", None) == "__main__"


def retire_default_executor() -> Any:
    """Shut down the event loop's default executor (``asyncio.to_thread``), if it has one,
    and return its threads: idle ones end, one still at work does not. Its idle threads
    never end otherwise, so threads it started for a cell would look left running (and
    retire the kernel every time). Done before the baseline too, for one a preload made."""
    loop = running_loop()
    executor = getattr(loop, "_default_executor", None)
    if executor is None or not hasattr(executor, "shutdown"):
        return []
    threads = list(getattr(executor, "_threads", ()))
    executor.shutdown(wait=False)
    loop._default_executor = None
    return threads


def running_loop() -> Any:
    """The kernel's event loop, when this runs on it (cells and their hooks do)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def loop_tasks(loop: Any) -> Any:
    return asyncio.all_tasks(loop) if loop is not None else set()


def _kernel_code(filename: str) -> Any:
    """Whether code in ``filename`` belongs to the kernel's own machinery."""
    return any(f"{os.sep}{package}{os.sep}" in filename for package in _KERNEL_PACKAGES)


def pending_loop_work() -> Any:
    """Timers and tasks a cell left on the kernel's event loop: they would run later, in
    another request's time (the kernel's own loop is otherwise quiet between requests)."""
    loop = running_loop()
    if loop is None:
        return []
    problems = []
    for handle in list(getattr(loop, "_scheduled", ())):
        callback = getattr(handle, "_callback", None)
        code = getattr(callback, "__code__", None)
        if handle.cancelled() or (code is not None and _kernel_code(code.co_filename)):
            continue
        problems.append(f"a timer is still scheduled on the kernel's event loop ({callback!r:.80})")
        break
    for task in loop_tasks(loop):
        if task.done() or id(task) in BASELINE["tasks"]:
            continue
        code = getattr(task.get_coro(), "cr_code", None)
        if code is not None and _kernel_code(code.co_filename):
            continue
        problems.append(f"a task is still running on the kernel's event loop ({task.get_name()})")
        break
    return problems


def kernel_machinery(shell: Any) -> Any:
    """What the kernel runs every request through and a cell could replace or extend: the
    shell's input and AST transformers, methods patched on the shell, the kernel's message
    handlers. Compared by identity; a change makes the kernel unfit for reuse."""
    manager = getattr(shell, "input_transformer_manager", None)
    kernel = getattr(shell, "kernel", None)
    return {
        "input transformers": (
            tuple(getattr(shell, "input_transformers_cleanup", ())),
            tuple(getattr(shell, "input_transformers_post", ())),
            tuple(getattr(manager, "cleanup_transforms", ())),
            tuple(getattr(manager, "line_transforms", ())),
            tuple(getattr(manager, "token_transformers", ())),
        ),
        "AST transformers": tuple(getattr(shell, "ast_transformers", ())),
        "shell methods": {
            name: value for name, value in list(vars(shell).items()) if _is_function(value)
        },
        "message handlers": dict(getattr(kernel, "shell_handlers", None) or {}),
    }


def _is_function(value: Any) -> Any:
    return callable(value) and not isinstance(value, type)


def closed_streams() -> Iterator[Any]:
    for name in ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__"):
        if getattr(getattr(sys, name, None), "closed", False) is True:
            yield name
