"""Threads and worker pools left running after a cell: which are a library's warm state.

A thread still running after a cell (given a moment to end) makes the kernel unfit for
reuse, unless a library owns it: it was started by a library's code, runs a library's code,
and a loaded module holds it (a global or a class attribute, directly or through a few
objects, as ``tqdm.tqdm.monitor`` or a library's module-wide thread pool). Such a thread
lives as long as the library does, as in any long-lived interpreter, and joins the baseline.
A thread a cell started itself, or one that runs a cell's function, never does.

The pools that keep worker *processes* (joblib's and loky's reusable executor) are shut
down by the reset instead: their workers were started with the request's environment and
working directory, which must not reach a later request. The helper processes that live
as long as the interpreter and run no cell code (multiprocessing's and loky's resource
trackers, multiprocessing's fork server) are reported to the pool as part of the baseline.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import time
from types import FrameType, ModuleType
from typing import Any

from .baseline import BASELINE
from .interpreter import retire_default_executor

_THREAD_GRACE_SECONDS = 0.25
# how many objects deep a module may hold a library's thread (module -> pool -> set -> thread)
_HOLDER_DEPTH = 4
# modules whose reusable executor keeps worker processes between calls
_PROCESS_POOL_MODULES = ("joblib.externals.loky.reusable_executor", "loky.reusable_executor")
_STARTED_BY_CELL = "_kernel_pool_started_by_cell"
# "ns": the shell's user namespace, the globals of a cell's code
_user_ns_of_cells: dict[str, Any] = {}


def watch_thread_starts(shell: Any) -> None:
    """Mark each thread started from a cell's own code (call once, before the baseline)."""
    _user_ns_of_cells["ns"] = shell.user_ns
    start = threading.Thread.start
    if getattr(start, "_kernel_pool_watched", False):
        return

    def marking_start(self: threading.Thread, _start: Any = start) -> Any:
        with contextlib.suppress(Exception):  # a thread that refuses attributes
            setattr(self, _STARTED_BY_CELL, _called_from_cell())
        return _start(self)

    vars(marking_start)["_kernel_pool_watched"] = True
    marking_start.__name__ = marking_start.__qualname__ = "start"
    marking_start.__doc__ = start.__doc__
    threading.Thread.start = marking_start  # type: ignore[method-assign]


def _called_from_cell() -> Any:
    """Whether the code that called ``Thread.start`` (past threading's own) is a cell's."""
    frame: FrameType | None = sys._getframe(2)
    own = threading.__file__
    while frame is not None and frame.f_code.co_filename == own:
        frame = frame.f_back
    return frame is not None and _cells_globals(frame.f_globals)


def _cells_globals(namespace: Any) -> Any:
    return namespace is _user_ns_of_cells.get("ns")


def _runs_cell_code(thread: Any) -> Any:
    """Whether ``thread`` runs a function or a ``run`` method a cell defined."""
    for function in (getattr(thread, "_target", None), getattr(type(thread), "run", None)):
        if _cells_globals(getattr(function, "__globals__", None)):
            return True
    return False


def threads_left(problems: list[str]) -> Any:
    """Threads started since the baseline that still run and no library owns. A library's
    own join the baseline. The event loop's default executor (``await asyncio.to_thread``)
    and the libraries' process pools are shut down first, and threads get a moment to end:
    one ending just after the cell is not worth a new kernel."""
    retire_default_executor()
    _shut_down_process_pools(problems)
    left = [
        thread
        for thread in threading.enumerate()
        if thread not in BASELINE["threads"] and thread.is_alive()
    ]
    deadline = time.monotonic() + _THREAD_GRACE_SECONDS
    for thread in left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        with contextlib.suppress(RuntimeError):  # the reset's own: never the case
            thread.join(remaining)
    left = [thread for thread in left if thread.is_alive()]
    candidates = [
        thread
        for thread in left
        if not getattr(thread, _STARTED_BY_CELL, False) and not _runs_cell_code(thread)
    ]
    owned = _held_by_libraries(candidates) if candidates else set()
    if owned:  # (the baseline's threads that ended are let go)
        alive = {t for t in BASELINE["threads"] if t.is_alive()}
        BASELINE["threads"] = frozenset(alive | {t for t in left if id(t) in owned})
    return [thread for thread in left if id(thread) not in owned]


def _held_by_libraries(threads: Any) -> Any:
    """ids of the ``threads`` that a loaded module holds, a few objects deep.

    Walks referrers outward from the threads, level by level; a module's namespace (other
    than the cells', ``__main__``'s or threading's own tables) or a class defined in a
    loaded module holds what it reaches. The baseline's objects are frozen, which hides them
    from ``gc.get_referrers``: they are unfrozen for the walk and frozen again after it.
    """
    modules = {
        id(vars(module)): name
        for name, module in list(sys.modules.items())
        if isinstance(module, ModuleType) and name != "__main__"
    }
    tables = (getattr(threading, "_active", None), getattr(threading, "_limbo", None))
    skipped = {*map(id, tables), id(_user_ns_of_cells.get("ns"))}
    owned = set()
    gc.unfreeze()
    try:
        for thread in threads:
            if _held(thread, modules, skipped):
                owned.add(id(thread))
    finally:
        gc.freeze()
    return owned


def _held(thread: Any, modules: Any, skipped: Any) -> Any:
    frontier = [thread]
    seen = {id(thread)}
    for _ in range(_HOLDER_DEPTH):
        found = []
        skipped.add(id(frontier))
        for holder in gc.get_referrers(*frontier):
            key = id(holder)
            if key in seen or key in skipped or isinstance(holder, _FRAME):
                continue
            if key in modules or _library_class(holder):
                return True
            seen.add(key)
            found.append(holder)
        skipped.discard(id(frontier))
        frontier = found
        if not frontier:
            return False
    return False


_FRAME = type(sys._getframe())


def _library_class(holder: Any) -> Any:
    if not isinstance(holder, type):
        return False
    module = sys.modules.get(str(getattr(holder, "__module__", "")))
    return module is not None and holder.__module__ != "__main__"


def _shut_down_process_pools(problems: list[str]) -> None:
    """Shut the libraries' reusable process pools down, their workers killed: a later call
    starts new ones from the kernel as it is then."""
    for name in _PROCESS_POOL_MODULES:
        module: Any = sys.modules.get(name)
        executor = getattr(module, "_executor", None)
        if executor is None:
            continue
        try:
            executor.shutdown(wait=True, kill_workers=True)
        except Exception as exc:
            problems.append(f"cannot shut down {name}'s workers: {type(exc).__name__}: {exc}")
        module._executor = None


# (module, attribute of its singleton, attribute of the singleton holding the pid): helper
# processes kept for the life of the interpreter, which run no cell code
_HELPER_PROCESSES = (
    ("multiprocessing.resource_tracker", "_resource_tracker", "_pid"),
    ("multiprocessing.forkserver", "_forkserver", "_forkserver_pid"),
    ("joblib.externals.loky.backend.resource_tracker", "_resource_tracker", "_pid"),
    ("loky.backend.resource_tracker", "_resource_tracker", "_pid"),
)


def library_processes() -> Any:
    """pids of the helper processes the standard library and loaded libraries keep for the
    life of the interpreter (multiprocessing's and loky's resource trackers, the fork
    server); the pool counts them as part of the baseline."""
    pids = []
    for name, singleton, attribute in _HELPER_PROCESSES:
        module = sys.modules.get(name)
        pid = getattr(getattr(module, singleton, None), attribute, None)
        if isinstance(pid, int) and not isinstance(pid, bool):
            pids.append(pid)
    return pids
