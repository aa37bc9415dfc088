"""The pool's helper that lives inside every kernel: baseline capture, reset, verification.

This file holds the entry points: :func:`capture` records the warm baseline, :func:`reset`
returns the kernel to it and verifies the result, and the report goes back to the pool.
What a reset restores lives in the other ``_inkernel*.py`` files: the user namespace
(``_inkernel_namespace.py``), the interpreter's hooks and machinery
(``_inkernel_interpreter.py``), the process (``_inkernel_process.py``), interpreter, logging,
module and hook settings (``_inkernel_state.py`` to ``_inkernel_patches.py``), and which
modules and threads left behind are a library's (``_inkernel_imports.py``,
``_inkernel_threads.py``); ``_inkernel_messaging.py`` decides what the kernel publishes.

None of them is imported by the pool process: their sources, concatenated in the order of
``helper_source._INKERNEL_FILES``, are sent to each kernel once at start-up and executed
there as the one module ``_kernel_pool_agent`` (stdlib only). The pool then calls its
functions through ``user_expressions``, so nothing is ever bound in the user namespace by
the pool itself.

Other in-kernel code (e.g. a worker's agent) may call :func:`register_reset_hook` to have
its own per-request state cleared by every reset.

An ``execute_request`` whose metadata carries ``{"kernel_pool": {"reset": true}}`` is the
last execution of its lease: the kernel resets itself right after replying (scheduled by the
last ``post_run_cell`` hook) and publishes the verdict on IOPub as a ``kernel_pool_reset``
message, so a lease costs one round trip instead of two and the reset is off its path.
"""

import contextlib
import gc
import os
import sys
import threading
import time

_MISSING = object()
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

_baseline = {}
_preloaded = frozenset()
_before_preload = frozenset()
_template_names = frozenset()  # the preload's names, when it ran in the fork server
_reset_hooks = []


def _shell():
    from IPython import get_ipython

    return get_ipython()


def register_reset_hook(hook):
    """Call ``hook()`` at the start of every reset (exceptions make the reset unclean)."""
    _reset_hooks.append(hook)


def mark_before_preload():
    """Remember which names exist before the preload, to tell preloaded names apart.

    The lifeline starts here, before the preload, so that a pool killed while a model loads
    (for minutes) takes its kernels down at once rather than when the preload ends.
    """
    global _before_preload
    # a forked kernel starts with the template's names (set by the fork server): preloaded
    _before_preload = frozenset(_shell().user_ns) - _template_names
    _start_lifeline()  # noqa: F821 (from _inkernel_process.py)
    _adopt_orphans()  # noqa: F821 (from _inkernel_process.py)
    return len(_before_preload)


def _start_lazy_infrastructure_threads():
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
    _forbid_tracing_when_unprivileged()  # noqa: F821 (from _inkernel_process.py)
    _lean_messaging()  # noqa: F821 (from _inkernel_messaging.py)


def capture():
    """Record the warm baseline that every reset returns to; returns a small summary."""
    global _preloaded
    _start_lazy_infrastructure_threads()
    watch_thread_starts(_shell())  # noqa: F821 (from _inkernel_threads.py)
    watch_imports()  # noqa: F821 (from _inkernel_imports.py)
    capture_settings()  # noqa: F821 (from _inkernel_state.py, shipped into this module too)
    shell = _shell()
    ns = shell.user_ns
    hm = shell.history_manager
    _watch_putenv()  # noqa: F821 (from _inkernel_process.py)
    deadline = time.monotonic() + 1.0
    # (one still busy stays, in the baseline)
    for thread in _retire_default_executor():  # noqa: F821 (from _inkernel_interpreter.py)
        thread.join(max(0.0, deadline - time.monotonic()))
    _baseline.clear()
    _baseline.update(
        names=dict(ns),
        environ=dict(os.environ),
        environ_data=dict(_environ_data()),  # noqa: F821 (from _inkernel_process.py)
        cwd=os.getcwd(),
        path=list(sys.path),
        # the objects, not their idents: an ident is reused once its thread ends
        threads=frozenset(threading.enumerate()),
        tasks=frozenset(id(t) for t in _loop_tasks(_running_loop())),  # noqa: F821
        history=(len(hm.input_hist_parsed), len(hm.input_hist_raw)),
        cell_names=frozenset(getattr(getattr(shell, "compile", None), "_filename_map", ())),
        modules=dict(sys.modules),
        module_dicts={
            name: _Snapshot(sys.modules[name].__dict__)  # noqa: F821
            for name in _GUARDED_MODULES
            if name in sys.modules
        },
        sys_hooks={name: getattr(sys, name, _MISSING) for name in _SYS_HOOKS},
        closed_streams=frozenset(_closed_streams()),  # noqa: F821 (from _inkernel_interpreter.py)
        importer_cache=_Snapshot(sys.path_importer_cache),  # noqa: F821
        open_fds=_open_fd_count(),  # noqa: F821 (from _inkernel_process.py)
        meta_path=list(sys.meta_path),
        path_hooks=list(sys.path_hooks),
        fds=_save_fds(),  # noqa: F821 (from _inkernel_process.py)
        asyncgen_hooks=tuple(sys.get_asyncgen_hooks()),
        gc_callbacks=list(gc.callbacks),
    )
    capture_module_table()  # noqa: F821 (from _inkernel_imports.py)
    capture_module_patches()  # noqa: F821 (from _inkernel_patches.py)
    watch_attribute_stores(shell)  # noqa: F821 (from _inkernel_patches.py)
    _preloaded = frozenset(
        name for name in list(ns) if name not in _before_preload and not name.startswith("_")
    )
    if _restore_after_execute not in shell.events.callbacks["post_execute"]:  # noqa: F821
        shell.events.register("post_execute", _restore_after_execute)  # noqa: F821
    # registered after the setup and preload code's hooks, so it runs after theirs
    if _reset_if_last not in shell.events.callbacks["post_run_cell"]:
        shell.events.register("post_run_cell", _reset_if_last)
    # a cell's own run-cell hooks would outlive it and run in later requests' cells (execute
    # hooks are not checked: the inline backend registers one when a cell first imports pyplot)
    _baseline["cell_hooks"] = {e: tuple(shell.events.callbacks[e]) for e in _CELL_HOOK_EVENTS}
    _baseline["machinery"] = _machinery(shell)  # noqa: F821 (from _inkernel_interpreter.py)
    gc.collect()
    gc.freeze()  # the warm baseline is never garbage: keep later collections short
    return {"names": len(ns), "preloaded": sorted(_preloaded)}


def _verify(ns, problems):
    names = _baseline["names"]
    if set(ns) != set(names):
        problems.append("namespace differs from the baseline after reset")
    elif any(ns[name] is not obj for name, obj in names.items()):
        problems.append("a baseline name is bound to another object after reset")
    if not _environ_unchanged():  # noqa: F821 (from _inkernel_process.py)
        problems.append("environment differs from the baseline")
    if list(sys.path) != _baseline["path"]:
        problems.append("sys.path differs from the baseline")
    shell = _shell()
    callbacks = shell.events.callbacks
    for event, hooks in _baseline["cell_hooks"].items():
        if tuple(callbacks.get(event, ())) != hooks:
            problems.append(f"a cell registered or removed a {event} hook")
    machinery = _machinery(shell)  # noqa: F821
    for part, baseline in _baseline["machinery"].items():
        if machinery[part] != baseline:
            problems.append(f"a cell changed the kernel's {part}")
    problems.extend(_pending_loop_work())  # noqa: F821 (from _inkernel_interpreter.py)
    left_open = _open_fd_count() - _baseline["open_fds"]  # noqa: F821
    if left_open > _MAX_FDS_LEFT_OPEN:  # raw descriptors cells opened and never closed
        problems.append(f"{left_open} more file descriptors are open than at the baseline")
    for name in set(_closed_streams()) - _baseline["closed_streams"]:  # noqa: F821
        problems.append(f"sys.{name} was closed")  # no reopening it: later writes would fail
    for thread in threads_left(problems):  # noqa: F821 (from _inkernel_threads.py)
        problems.append(f"thread {thread.name!r} is still running")


def reset(context_problems=None):
    """Return the kernel to its baseline; report whether it could be verified clean.

    ``context_problems``: the settings held in context variables were already restored, from
    the cells' context, with these problems (see :func:`_reset_if_last`).
    """
    problems = []
    if context_problems is None:
        restore_context_settings(problems)  # noqa: F821 (from _inkernel_modules.py)
    else:
        problems.extend(context_problems)
    for hook in _reset_hooks:
        try:
            hook()
        except Exception as exc:
            problems.append(f"reset hook failed: {type(exc).__name__}: {exc}")
    shell = _shell()
    ns = shell.user_ns
    _restore_interpreter(problems)  # noqa: F821 (from _inkernel_interpreter.py)
    _restore_names(ns, problems)  # noqa: F821 (from _inkernel_namespace.py)
    _restore_process_state(problems)  # noqa: F821 (from _inkernel_process.py)
    _reap_exited_children()  # noqa: F821 (from _inkernel_process.py)
    restore_settings(problems)  # noqa: F821 (from _inkernel_state.py)
    problems += _clear_caches(shell)  # noqa: F821 (from _inkernel_namespace.py)
    gc.collect()
    # What survives a reset (imported modules, their caches) is long-lived: freezing it keeps
    # the next reset's collection proportional to what the next cell allocates.
    gc.freeze()
    _verify(ns, problems)
    return {
        "clean": not problems,
        "problems": problems,
        "library_processes": library_processes(),  # noqa: F821 (from _inkernel_threads.py)
    }


def _parent_asking_reset(shell):
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


def _reset_if_last(result=None):
    """The lease's last cell asked for it: reset as soon as the reply has gone out."""
    shell = _shell()
    parent = _parent_asking_reset(shell) if _baseline else None
    if parent is None:
        return
    loop = _running_loop()  # noqa: F821
    if loop is None:  # no loop running: reset now, before the reply
        _reset_and_report(shell, parent)
    else:  # run once the reply and the idle status are out: off the request's path
        # except the few settings held in context variables: a callback gets a copy of the
        # cells' context, so they are restored here, in the cells' own (microseconds)
        problems = []
        restore_context_settings(problems)  # noqa: F821 (from _inkernel_modules.py)
        reset_after_idle(loop, shell, parent, problems)  # noqa: F821 (_inkernel_messaging.py)


def _reset_and_report(shell, parent, context_problems=None):
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
