"""The entry points of the pool's in-kernel code: baseline capture, reset, verification.

:func:`capture` records the warm baseline (in ``baseline``), :func:`reset` returns the
kernel to it and verifies the result, and the report goes back to the pool. What a reset
restores lives in the other modules of this package (see its ``__init__``).

Code a kernel's setup installs (e.g. a worker's agent) may register a reset hook (through
``host.KernelHooks``) to have its own per-request state cleared by every reset.

An ``execute_request`` whose metadata carries ``{"kernel_pool": {"reset": true}}`` is the
last execution of its lease: the kernel resets itself right after replying (scheduled by the
last ``post_run_cell`` hook) and publishes the verdict on IOPub as a ``kernel_pool_reset``
message, so a lease costs one round trip instead of two and the reset is off its path.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .baseline import BASELINE, MISSING, PRELOADED, Snapshot, get_shell
from .imports import capture_module_table, watch_imports
from .interpreter import (
    closed_streams,
    kernel_machinery,
    loop_tasks,
    pending_loop_work,
    restore_after_execute,
    restore_interpreter,
    retire_default_executor,
    running_loop,
)
from .messaging import lean_messaging, reset_after_idle
from .modules import restore_context_settings
from .namespace import clear_caches, restore_names
from .patches import capture_module_patches, watch_attribute_stores
from .process import (
    adopt_orphans,
    environ_data,
    environ_unchanged,
    forbid_tracing_when_unprivileged,
    open_fd_count,
    reap_exited_children,
    restore_process_state,
    save_fds,
    start_lifeline,
    watch_putenv,
)
from .settings import capture_settings, restore_settings
from .threads import library_processes, threads_left, watch_thread_starts

# modules whose attributes a cell might monkeypatch and that everything else relies on
_GUARDED_MODULES = ("builtins", "json", "pickle", "copyreg", "os", "os.path", "io", "pathlib")
_SYS_HOOKS = (
    "stdin",
    "stdout",
    "stderr",
    "displayhook",
    "excepthook",
    "breakpointhook",
    "unraisablehook",
)
RESET_MSG_TYPE = "kernel_pool_reset"
_CELL_HOOK_EVENTS = ("pre_run_cell", "post_run_cell")
# descriptors a kernel may gain over its life (libraries imported later keep a few open)
_MAX_FDS_LEFT_OPEN = 64
RESET_TOPIC = b"kernel_pool.reset"

_before_preload: frozenset[str] = frozenset()
_template_names: frozenset[str] = frozenset()  # the preload's names, when it ran in the fork server
_reset_hooks: list[Callable[[], object]] = []


def use_template_names(names: Any) -> None:
    """Note the names the fork server's template (the preload) gave this kernel: they count
    as preloaded (called in a forked kernel before ipykernel starts)."""
    global _template_names
    _template_names = frozenset(names)


def register_reset_hook(hook: Callable[..., Any]) -> None:
    """Call ``hook()`` at the start of every reset (exceptions make the reset unclean)."""
    _reset_hooks.append(hook)


def mark_before_preload() -> Any:
    """Remember which names exist before the preload, to tell preloaded names apart.

    The lifeline starts here, before the preload, so that a pool killed while a model loads
    (for minutes) takes its kernels down at once rather than when the preload ends.
    """
    global _before_preload
    # a forked kernel starts with the template's names (set by the fork server): preloaded
    _before_preload = frozenset(get_shell().user_ns) - _template_names
    start_lifeline()
    adopt_orphans()
    return len(_before_preload)


def _start_lazy_infrastructure_threads() -> None:
    """Start threads the kernel itself would start later, so the baseline includes them.

    pyzmq starts a garbage-collector thread the first time it sends a large (zero-copy)
    frame; without this, the first big output would look like a thread a cell left behind.
    """
    try:
        from zmq.utils.garbage import gc as zmq_gc

        zmq_gc.start()
    except Exception:
        pass
    # (the lifeline began before the preload)
    forbid_tracing_when_unprivileged()
    lean_messaging()


def capture() -> Any:
    """Record the warm baseline that every reset returns to; returns a small summary."""
    _start_lazy_infrastructure_threads()
    watch_thread_starts(get_shell())
    watch_imports()
    capture_settings()
    shell = get_shell()
    ns = shell.user_ns
    hm = shell.history_manager
    watch_putenv()
    deadline = time.monotonic() + 1.0
    # (one still busy stays, in the baseline)
    for thread in retire_default_executor():
        thread.join(max(0.0, deadline - time.monotonic()))
    BASELINE.clear()
    BASELINE.update(
        names=dict(ns),
        environ=dict(os.environ),
        environ_data=dict(environ_data()),
        cwd=os.getcwd(),
        path=list(sys.path),
        # the objects, not their idents: an ident is reused once its thread ends
        threads=frozenset(threading.enumerate()),
        tasks=frozenset(id(t) for t in loop_tasks(running_loop())),
        history=(len(hm.input_hist_parsed), len(hm.input_hist_raw)),
        cell_names=frozenset(getattr(getattr(shell, "compile", None), "_filename_map", ())),
        modules=dict(sys.modules),
        module_dicts={
            name: Snapshot(sys.modules[name].__dict__)
            for name in _GUARDED_MODULES
            if name in sys.modules
        },
        sys_hooks={name: getattr(sys, name, MISSING) for name in _SYS_HOOKS},
        closed_streams=frozenset(closed_streams()),
        importer_cache=Snapshot(sys.path_importer_cache),
        open_fds=open_fd_count(),
        meta_path=list(sys.meta_path),
        path_hooks=list(sys.path_hooks),
        fds=save_fds(),
        asyncgen_hooks=tuple(sys.get_asyncgen_hooks()),
        gc_callbacks=list(gc.callbacks),
    )
    capture_module_table()
    capture_module_patches()
    watch_attribute_stores(shell)
    PRELOADED.clear()
    PRELOADED.update(
        name for name in list(ns) if name not in _before_preload and not name.startswith("_")
    )
    if restore_after_execute not in shell.events.callbacks["post_execute"]:
        shell.events.register("post_execute", restore_after_execute)
    # registered after the setup and preload code's hooks, so it runs after theirs
    if _reset_if_last not in shell.events.callbacks["post_run_cell"]:
        shell.events.register("post_run_cell", _reset_if_last)
    # a cell's own run-cell hooks would outlive it and run in later requests' cells (execute
    # hooks are not checked: the inline backend registers one when a cell first imports pyplot)
    BASELINE["cell_hooks"] = {e: tuple(shell.events.callbacks[e]) for e in _CELL_HOOK_EVENTS}
    BASELINE["machinery"] = kernel_machinery(shell)
    gc.collect()
    gc.freeze()  # the warm baseline is never garbage: keep later collections short
    return {"names": len(ns), "preloaded": sorted(PRELOADED)}


def _verify(ns: dict[str, Any], problems: list[str]) -> None:
    names = BASELINE["names"]
    if set(ns) != set(names):
        problems.append("namespace differs from the baseline after reset")
    elif any(ns[name] is not obj for name, obj in names.items()):
        problems.append("a baseline name is bound to another object after reset")
    if not environ_unchanged():
        problems.append("environment differs from the baseline")
    if list(sys.path) != BASELINE["path"]:
        problems.append("sys.path differs from the baseline")
    shell = get_shell()
    callbacks = shell.events.callbacks
    for event, hooks in BASELINE["cell_hooks"].items():
        if tuple(callbacks.get(event, ())) != hooks:
            problems.append(f"a cell registered or removed a {event} hook")
    machinery = kernel_machinery(shell)
    for part, baseline in BASELINE["machinery"].items():
        if machinery[part] != baseline:
            problems.append(f"a cell changed the kernel's {part}")
    problems.extend(pending_loop_work())
    left_open = open_fd_count() - BASELINE["open_fds"]
    if left_open > _MAX_FDS_LEFT_OPEN:  # raw descriptors cells opened and never closed
        problems.append(f"{left_open} more file descriptors are open than at the baseline")
    for name in set(closed_streams()) - BASELINE["closed_streams"]:
        problems.append(f"sys.{name} was closed")  # no reopening it: later writes would fail
    for thread in threads_left(problems):
        problems.append(f"thread {thread.name!r} is still running")


def reset(context_problems: list[str] | None = None) -> Any:
    """Return the kernel to its baseline; report whether it could be verified clean.

    ``context_problems``: the settings held in context variables were already restored, from
    the cells' context, with these problems (see :func:`_reset_if_last`).
    """
    problems: list[str] = []
    if context_problems is None:
        restore_context_settings(problems)
    else:
        problems.extend(context_problems)
    for hook in _reset_hooks:
        try:
            hook()
        except Exception as exc:
            problems.append(f"reset hook failed: {type(exc).__name__}: {exc}")
    shell = get_shell()
    ns = shell.user_ns
    restore_interpreter(problems)
    restore_names(ns, problems)
    restore_process_state(problems)
    reap_exited_children()
    restore_settings(problems)
    problems += clear_caches(shell)
    gc.collect()
    # What survives a reset (imported modules, their caches) is long-lived: freezing it keeps
    # the next reset's collection proportional to what the next cell allocates.
    gc.freeze()
    _verify(ns, problems)
    return {
        "clean": not problems,
        "problems": problems,
        "library_processes": library_processes(),
    }


def _parent_asking_reset(shell: Any) -> Any:
    """The request being answered, if it is a lease's last cell (it asks for a reset)."""
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return None
    try:
        parent = kernel.get_parent("shell") or {}
    except Exception:
        return None
    asked = (parent.get("metadata") or {}).get("kernel_pool") or {}
    return parent if isinstance(asked, dict) and asked.get("reset") is True else None


def _reset_if_last(result: Any = None) -> None:
    """The lease's last cell asked for it: reset as soon as the reply has gone out."""
    shell = get_shell()
    parent = _parent_asking_reset(shell) if BASELINE else None
    if parent is None:
        return
    loop = running_loop()
    if loop is None:  # no loop running: reset now, before the reply
        reset_and_report(shell, parent)
    else:  # run once the reply and the idle status are out: off the request's path
        # except the few settings held in context variables: a callback gets a copy of the
        # cells' context, so they are restored here, in the cells' own (microseconds)
        problems: list[str] = []
        restore_context_settings(problems)
        reset_after_idle(loop, functools.partial(reset_and_report, shell, parent, problems))


def reset_and_report(shell: Any, parent: Any, context_problems: list[str] | None = None) -> None:
    started = time.perf_counter()
    try:
        report = reset(context_problems)
    except BaseException as exc:  # any failure makes the kernel suspect
        report = {"clean": False, "problems": [f"reset failed: {type(exc).__name__}: {exc}"]}
    report["seconds"] = time.perf_counter() - started
    kernel = shell.kernel
    # should this fail, the pool times out waiting and runs a full reset
    with contextlib.suppress(Exception):
        kernel.session.send(
            kernel.iopub_socket, RESET_MSG_TYPE, report, parent=parent, ident=RESET_TOPIC
        )
