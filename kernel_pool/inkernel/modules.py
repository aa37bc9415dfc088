"""Settings of modules that a cell can change and that would outlive it.

This module holds the stdlib modules' switches (``tempfile``, the thread stack size,
``faulthandler``, asyncio's loop and policy), ``decimal``'s context, the options of numpy
and pandas and the ``random`` and numpy generators, and it adds each part of those files to
``PARTS`` and each library's to ``_LIBRARIES``.

A library imported after the baseline is recorded as its import finishes
(:func:`after_import`), so a cell that imports matplotlib and then changes its style in the
same cell is undone as well.
"""

from __future__ import annotations

import contextlib
import copyreg
import functools
import os
import random
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

from .display import (
    capture_inline_backend,
    capture_matplotlib,
    capture_shell,
    restore_inline_interactive,
    restore_matplotlib,
    restore_shell,
)
from .hooks import capture_hooks, restore_hooks
from .logs import capture_logging, restore_logging
from .records import LIBRARY_STATE, RECORDED, quietly
from .registries import (
    capture_opener,
    capture_sqlite3,
    capture_start_method,
    capture_warnings,
    restore_opener,
    restore_reducers,
    restore_sqlite3,
    restore_start_method,
    restore_warnings,
)

_MT19937_STATE_BYTES = 624 * 4 + 4  # numpy's mt19937_state: uint32 key[624], int pos


# -- stdlib modules --------------------------------------------------------------------------


def _stdlib_settings() -> Any:
    """Module-level switches of stdlib modules a cell may have set, where imported."""
    tempfile = sys.modules.get("tempfile")
    return {
        "tempdir": getattr(tempfile, "tempdir", None),
        "stack size": threading.stack_size(),
        "loop": _loop_settings(_kernel_loop()),
        "loop policy": _loop_policy(),
        "reducers": dict(copyreg.dispatch_table),
    }


def _kernel_loop() -> Any:
    """The kernel's event loop, when this runs on it (cells, their hooks and resets do)."""
    asyncio = sys.modules.get("asyncio")
    try:
        return asyncio.get_running_loop() if asyncio is not None else None
    except RuntimeError:
        return None


def _loop_policy() -> Any:
    """asyncio's event loop policy (a cell's ``uvloop.install()`` or own policy would make
    every later request's ``asyncio.run`` use it), read without the getter's deprecation."""
    events = getattr(sys.modules.get("asyncio"), "events", None)
    return getattr(events, "_event_loop_policy", None)


def _loop_settings(loop: Any) -> Any:
    """A loop's debug mode (slow for every later request), slow-callback threshold,
    exception handler and task factory, which a cell may set on the kernel's own loop."""
    if loop is None:
        return None
    return (
        loop, loop.get_debug(), loop.slow_callback_duration, loop.get_exception_handler(),
        loop.get_task_factory(),
    )  # fmt: skip


def _restore_stdlib(problems: list[str]) -> None:
    recorded = RECORDED["stdlib"]
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None and tempfile.tempdir != recorded["tempdir"]:
        tempfile.tempdir = recorded["tempdir"]  # type: ignore[attr-defined]
    if threading.stack_size() != recorded["stack size"]:
        threading.stack_size(recorded["stack size"])
    restore_reducers(recorded["reducers"])
    faulthandler = sys.modules.get("faulthandler")
    if faulthandler is not None:  # a traceback dump (and exit) timed to land in a later request
        faulthandler.cancel_dump_traceback_later()
    policy = recorded["loop policy"]
    if policy is not None and _loop_policy() is not policy:
        with quietly():
            sys.modules["asyncio"].set_event_loop_policy(policy)
    loop = _kernel_loop()
    wanted = recorded["loop"]
    if wanted is not None and wanted[0] is loop and _loop_settings(loop) != wanted:
        _, debug, slow, handler, factory = wanted
        loop.set_debug(debug)
        loop.slow_callback_duration = slow
        loop.set_exception_handler(handler)
        loop.set_task_factory(factory)  # one calling a cell's names would wedge later requests


# -- numeric libraries -----------------------------------------------------------------------


def _capture_decimal(module: Any) -> Any:
    context, default = module.getcontext().copy(), module.DefaultContext.copy()
    return {"context": context, "default": default, "reprs": (repr(context), repr(default))}


def _restore_decimal(module: Any, recorded: Any) -> None:
    context_repr, default_repr = recorded["reprs"]
    if repr(module.getcontext()) != context_repr:
        module.setcontext(recorded["context"].copy())
    default = module.DefaultContext
    if repr(default) != default_repr:
        for field in ("prec", "rounding", "Emin", "Emax", "capitals", "clamp"):
            setattr(default, field, getattr(recorded["default"], field))
        default.traps = dict(recorded["default"].traps)
        default.flags = dict(recorded["default"].flags)


def _capture_numpy(module: Any) -> Any:
    return {
        "print": module.get_printoptions(),
        "errors": module.geterr(),
        "error call": module.geterrcall(),
    }


def _restore_numpy(module: Any, recorded: Any) -> None:
    if module.get_printoptions() != recorded["print"]:
        module.set_printoptions(**recorded["print"])
    if module.geterr() != recorded["errors"]:
        module.seterr(**recorded["errors"])
    if module.geterrcall() is not recorded["error call"]:
        module.seterrcall(recorded["error call"])


def _capture_pandas(module: Any) -> Any:
    config = sys.modules.get("pandas._config.config")
    if config is None or not isinstance(getattr(config, "_global_config", None), dict):
        return None
    return _copy_tree(config._global_config)


def _restore_pandas(module: Any, recorded: Any) -> None:
    config = sys.modules["pandas._config.config"]
    if config._global_config == recorded:
        return
    with quietly():
        for key, value in _leaves(recorded):
            if _leaf(config._global_config, key) != value:
                module.set_option(key, value)


def _copy_tree(tree: Any) -> Any:
    return {k: _copy_tree(v) if isinstance(v, dict) else v for k, v in tree.items()}


def _leaves(tree: Any, prefix: str = "") -> Iterator[Any]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _leaf(tree: Any, key: str) -> Any:
    for part in key.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


# -- the libraries looked after, and the parts -----------------------------------------------


# (the parts of sqlite3 to urllib.request are in registries.py, matplotlib's in display.py)
_LIBRARIES = {  # restored in this order
    "decimal": (_capture_decimal, _restore_decimal),
    "sqlite3": (capture_sqlite3, restore_sqlite3),
    "multiprocessing.context": (capture_start_method, restore_start_method),
    "urllib.request": (capture_opener, restore_opener),
    "numpy": (_capture_numpy, _restore_numpy),
    "pandas": (_capture_pandas, _restore_pandas),
    "matplotlib": (capture_matplotlib, restore_matplotlib),
    "matplotlib_inline.backend_inline": (
        capture_inline_backend,
        restore_inline_interactive,
    ),
}
_IN_CONTEXT = frozenset({"decimal", "numpy"})  # settings kept in context variables


def _reseed_numpy() -> None:
    """Reseed numpy's global generator from the OS, if it was used since the last time.

    Reseeding costs about 0.1 ms, so the generator's state (2.5 KB, read through its
    documented ctypes address) is compared with what it was after the last reseed.
    """
    mtrand = sys.modules.get("numpy.random.mtrand")
    generator = getattr(mtrand, "_rand", None)
    if generator is None:
        return
    ctypes = sys.modules.get("ctypes") or __import__("ctypes")
    try:
        address = generator._bit_generator.ctypes.state_address
        state = ctypes.string_at(address, _MT19937_STATE_BYTES)
        if RECORDED.get("numpy generator") == (generator, state):
            return
        generator.seed()
        RECORDED["numpy generator"] = (generator, ctypes.string_at(address, _MT19937_STATE_BYTES))
    except Exception:  # another bit generator, or no ctypes: reseed every time
        generator.seed()


def _record_library(name: str, capture: Any, module: Any) -> None:
    try:
        state = capture(module)
    except Exception:  # a version whose API differs: its settings are not looked after
        state = None
    if state is not None:
        LIBRARY_STATE[name] = state


def _restore_libraries(problems: list[str], *, in_context: bool) -> None:
    for name, recorded in list(LIBRARY_STATE.items()):
        module = sys.modules.get(name)
        if module is None or (name in _IN_CONTEXT) != in_context:
            continue
        try:
            _LIBRARIES[name][1](module, recorded)
        except Exception as exc:
            problems.append(f"cannot restore {name}'s settings: {type(exc).__name__}: {exc}")


# module name -> hook(module)s, called once as that module's import ends
_after_import: dict[str, list[Callable[[Any], Any]]] = {}


def after_import(name: str, hook: Callable[..., Any]) -> None:
    """Call ``hook(module)`` once the module ``name`` is imported: now if it already is, else
    the moment its import ends, so the very cell that imports it is covered too.

    A meta path finder watches for the names (it finds nothing itself); other in-kernel code
    (a worker's agent) uses it as well. Call before the baseline, which records the finder.
    """
    module = sys.modules.get(name)
    if module is not None:
        hook(module)
        return
    _after_import.setdefault(name, []).append(hook)
    if not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


class _AfterImport:
    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> Any:
        if name not in _after_import:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        loader: Any = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module: Any) -> None:
            del loader.exec_module  # the loader is this import's own: leave it as it was
            run(module)
            for hook in _after_import.pop(name, ()):
                with contextlib.suppress(Exception):  # one hook's failure is not the import's
                    hook(module)

        with contextlib.suppress(AttributeError, TypeError):  # a loader without attributes
            loader.exec_module = exec_module
        return spec


def _capture_stdlib() -> None:
    RECORDED["stdlib"] = _stdlib_settings()


def _capture_libraries() -> None:
    LIBRARY_STATE.clear()
    for name, (capture, _restore) in _LIBRARIES.items():
        after_import(name, functools.partial(_record_library, name, capture))


def _restore_global_libraries(problems: list[str]) -> None:
    _restore_libraries(problems, in_context=False)


def restore_context_settings(problems: list[str]) -> None:
    """Put back the settings held in context variables (numpy's options, decimal's context).

    Cells share one context, but a loop callback runs in a copy of it: call this from the
    cells' own context (a ``post_run_cell`` hook, or an execution), not from a callback.
    """
    _restore_libraries(problems, in_context=True)


def _reseed(problems: list[str]) -> None:
    """A cell's seed must not make the next request's random numbers predictable (128 bits
    from the OS: a third of the cost of ``random``'s default seeding, from 2.5 KB)."""
    random.seed(int.from_bytes(os.urandom(16), "big"))
    _reseed_numpy()


def _record_nothing() -> None:
    pass


# (capture(), restore(problems)) of each module settings part, in the order they run:
# libraries first (they may warn, quietly), warnings after them, the process-wide hooks last
PARTS = (
    (_capture_libraries, _restore_global_libraries),
    (capture_logging, restore_logging),
    (capture_warnings, restore_warnings),
    (capture_shell, restore_shell),
    (_capture_stdlib, _restore_stdlib),
    (_record_nothing, _reseed),
    (capture_hooks, restore_hooks),
)
