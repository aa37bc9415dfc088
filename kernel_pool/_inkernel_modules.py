"""Settings of modules that a cell can change and that would outlive it.

Shipped into every kernel after ``_inkernel_state.py``, ``_inkernel_logging.py``,
``_inkernel_registries.py`` and ``_inkernel_display.py``, into the same module (stdlib
only). This file holds the stdlib modules' switches (``tempfile``, the thread stack size,
``faulthandler``, asyncio's loop and policy), ``decimal``'s context, the options of numpy
and pandas and the ``random`` and numpy generators, and it adds each part of those files to
``_PARTS`` and each library's to ``_LIBRARIES``.

A library imported after the baseline is recorded as its import finishes
(:func:`after_import`), so a cell that imports matplotlib and then changes its style in the
same cell is undone as well.
"""

import contextlib
import copyreg
import functools
import os
import random
import sys
import threading
import warnings

_recorded = {}
_library_state = {}  # module name -> its recorded settings
_MT19937_STATE_BYTES = 624 * 4 + 4  # numpy's mt19937_state: uint32 key[624], int pos


# -- stdlib modules --------------------------------------------------------------------------


def _stdlib_settings():
    """Module-level switches of stdlib modules a cell may have set, where imported."""
    tempfile = sys.modules.get("tempfile")
    return {
        "tempdir": getattr(tempfile, "tempdir", None),
        "stack size": threading.stack_size(),
        "loop": _loop_settings(_kernel_loop()),
        "loop policy": _loop_policy(),
        "reducers": dict(copyreg.dispatch_table),
    }


def _kernel_loop():
    """The kernel's event loop, when this runs on it (cells, their hooks and resets do)."""
    asyncio = sys.modules.get("asyncio")
    try:
        return asyncio.get_running_loop() if asyncio is not None else None
    except RuntimeError:
        return None


def _loop_policy():
    """asyncio's event loop policy (a cell's ``uvloop.install()`` or own policy would make
    every later request's ``asyncio.run`` use it), read without the getter's deprecation."""
    events = getattr(sys.modules.get("asyncio"), "events", None)
    return getattr(events, "_event_loop_policy", None)


def _loop_settings(loop):
    """A loop's debug mode (slow for every later request), slow-callback threshold,
    exception handler and task factory, which a cell may set on the kernel's own loop."""
    if loop is None:
        return None
    return (
        loop, loop.get_debug(), loop.slow_callback_duration, loop.get_exception_handler(),
        loop.get_task_factory(),
    )  # fmt: skip


def _restore_stdlib(problems):
    recorded = _recorded["stdlib"]
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None and tempfile.tempdir != recorded["tempdir"]:
        tempfile.tempdir = recorded["tempdir"]
    if threading.stack_size() != recorded["stack size"]:
        threading.stack_size(recorded["stack size"])
    _restore_reducers(recorded["reducers"])  # noqa: F821 (from _inkernel_registries.py)
    faulthandler = sys.modules.get("faulthandler")
    if faulthandler is not None:  # a traceback dump (and exit) timed to land in a later request
        faulthandler.cancel_dump_traceback_later()
    policy = recorded["loop policy"]
    if policy is not None and _loop_policy() is not policy:
        with _quietly():
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


def _capture_decimal(module):
    context, default = module.getcontext().copy(), module.DefaultContext.copy()
    return {"context": context, "default": default, "reprs": (repr(context), repr(default))}


def _restore_decimal(module, recorded):
    context_repr, default_repr = recorded["reprs"]
    if repr(module.getcontext()) != context_repr:
        module.setcontext(recorded["context"].copy())
    default = module.DefaultContext
    if repr(default) != default_repr:
        for field in ("prec", "rounding", "Emin", "Emax", "capitals", "clamp"):
            setattr(default, field, getattr(recorded["default"], field))
        default.traps = dict(recorded["default"].traps)
        default.flags = dict(recorded["default"].flags)


def _capture_numpy(module):
    return {
        "print": module.get_printoptions(),
        "errors": module.geterr(),
        "error call": module.geterrcall(),
    }


def _restore_numpy(module, recorded):
    if module.get_printoptions() != recorded["print"]:
        module.set_printoptions(**recorded["print"])
    if module.geterr() != recorded["errors"]:
        module.seterr(**recorded["errors"])
    if module.geterrcall() is not recorded["error call"]:
        module.seterrcall(recorded["error call"])


def _capture_pandas(module):
    config = sys.modules.get("pandas._config.config")
    if config is None or not isinstance(getattr(config, "_global_config", None), dict):
        return None
    return _copy_tree(config._global_config)


def _restore_pandas(module, recorded):
    config = sys.modules["pandas._config.config"]
    if config._global_config == recorded:
        return
    with _quietly():
        for key, value in _leaves(recorded):
            if _leaf(config._global_config, key) != value:
                module.set_option(key, value)


def _copy_tree(tree):
    return {k: _copy_tree(v) if isinstance(v, dict) else v for k, v in tree.items()}


def _leaves(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _leaf(tree, key):
    for part in key.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


@contextlib.contextmanager
def _quietly():
    """Setting a deprecated option warns: that is not the next request's output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# -- the libraries looked after, and the parts -----------------------------------------------


# (the parts of sqlite3 to urllib.request are in _inkernel_registries.py, matplotlib's in
# _inkernel_display.py)
_LIBRARIES = {  # restored in this order
    "decimal": (_capture_decimal, _restore_decimal),
    "sqlite3": (_capture_sqlite3, _restore_sqlite3),  # noqa: F821
    "multiprocessing.context": (_capture_start_method, _restore_start_method),  # noqa: F821
    "urllib.request": (_capture_opener, _restore_opener),  # noqa: F821
    "numpy": (_capture_numpy, _restore_numpy),
    "pandas": (_capture_pandas, _restore_pandas),
    "matplotlib": (_capture_matplotlib, _restore_matplotlib),  # noqa: F821
    "matplotlib_inline.backend_inline": (
        _capture_inline_backend,  # noqa: F821
        _restore_inline_interactive,  # noqa: F821
    ),
}
_IN_CONTEXT = frozenset({"decimal", "numpy"})  # settings kept in context variables


def _reseed_numpy():
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
        if _recorded.get("numpy generator") == (generator, state):
            return
        generator.seed()
        _recorded["numpy generator"] = (generator, ctypes.string_at(address, _MT19937_STATE_BYTES))
    except Exception:  # another bit generator, or no ctypes: reseed every time
        generator.seed()


def _record_library(name, capture, module):
    try:
        state = capture(module)
    except Exception:  # a version whose API differs: its settings are not looked after
        state = None
    if state is not None:
        _library_state[name] = state


def _restore_libraries(problems, *, in_context):
    for name, recorded in list(_library_state.items()):
        module = sys.modules.get(name)
        if module is None or (name in _IN_CONTEXT) != in_context:
            continue
        try:
            _LIBRARIES[name][1](module, recorded)
        except Exception as exc:
            problems.append(f"cannot restore {name}'s settings: {type(exc).__name__}: {exc}")


_after_import = {}  # module name -> hook(module)s, called once as that module's import ends


def after_import(name, hook):
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
    def find_spec(self, name, path=None, target=None):
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
        loader = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module):
            del loader.exec_module  # the loader is this import's own: leave it as it was
            run(module)
            for hook in _after_import.pop(name, ()):
                with contextlib.suppress(Exception):  # one hook's failure is not the import's
                    hook(module)

        with contextlib.suppress(AttributeError, TypeError):  # a loader without attributes
            loader.exec_module = exec_module
        return spec


def _capture_stdlib():
    _recorded["stdlib"] = _stdlib_settings()


def _capture_libraries():
    _library_state.clear()
    for name, (capture, _restore) in _LIBRARIES.items():
        after_import(name, functools.partial(_record_library, name, capture))


def _restore_global_libraries(problems):
    _restore_libraries(problems, in_context=False)


def restore_context_settings(problems):
    """Put back the settings held in context variables (numpy's options, decimal's context).

    Cells share one context, but a loop callback runs in a copy of it: call this from the
    cells' own context (a ``post_run_cell`` hook, or an execution), not from a callback.
    """
    _restore_libraries(problems, in_context=True)


def _reseed(problems):
    """A cell's seed must not make the next request's random numbers predictable (128 bits
    from the OS: a third of the cost of ``random``'s default seeding, from 2.5 KB)."""
    random.seed(int.from_bytes(os.urandom(16), "big"))
    _reseed_numpy()


def _record_nothing():
    pass


# restored in this order: libraries first (they may warn, quietly), warnings after them
_PARTS.extend(  # noqa: F821 (from _inkernel_state.py, shipped ahead of this file)
    [
        (_capture_libraries, _restore_global_libraries),
        (_capture_logging, _restore_logging),  # noqa: F821 (from _inkernel_logging.py)
        (_capture_warnings, _restore_warnings),  # noqa: F821 (from _inkernel_registries.py)
        (_capture_shell, _restore_shell),  # noqa: F821 (from _inkernel_display.py)
        (_capture_stdlib, _restore_stdlib),
        (_record_nothing, _reseed),
    ]
)
