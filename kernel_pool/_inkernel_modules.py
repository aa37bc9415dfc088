"""Settings of modules that a cell can change and that would outlive it.

Shipped into every kernel after ``_inkernel_state.py`` and ``_inkernel_logging.py``, into the
same module (stdlib only), where each part below is added to its ``_PARTS``: warning filters
(and which warnings were already shown), ``logging`` (its part is in the file before),
IPython's switches, ``tempfile``, the thread stack size, ``faulthandler``, ``decimal``'s
context, ``random``'s and numpy's generators, and the options of numpy, pandas and matplotlib.

A library imported after the baseline is recorded as its import finishes
(:func:`after_import`), so a cell that imports matplotlib and then changes its style in the
same cell is undone as well. Filters that a library adds to ``warnings`` while it is being
imported stay: the library stays imported and would not add them again.
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
_RC_NOT_RESTORED = ("backend_fallback", "interactive")  # the kernel's own choice


# -- warnings --------------------------------------------------------------------------------


def _capture_warnings():
    _recorded["warnings"] = {
        "list": warnings.filters,
        "filters": list(warnings.filters),
        "defaultaction": warnings.defaultaction,
        "showwarning": warnings.showwarning,
        "formatwarning": warnings.formatwarning,
    }
    for name, append_at in (("filterwarnings", 5), ("simplefilter", 3)):
        function = getattr(warnings, name)
        if not getattr(function, "_kernel_pool_kept_at_import", False):
            setattr(warnings, name, _keeping_import_time_filters(function, append_at))


def _keeping_import_time_filters(add_filter, append_at):
    """``warnings.filterwarnings``/``simplefilter`` that remembers filters added by imports.

    The reset removes every filter a cell added, except those a module adds while it is being
    imported: it stays imported and would not add them again. ``append_at`` is the position
    of the ``append`` argument.
    """

    def wrapper(*args, **kwargs):
        count = len(warnings.filters)
        add_filter(*args, **kwargs)
        recorded = _recorded.get("warnings")
        if recorded is None or warnings.filters is not recorded["list"] or not _importing():
            return
        append = kwargs.get("append", args[append_at] if len(args) > append_at else False)
        kept = recorded["filters"]
        if append:  # as warnings does it: at the end, unless it was there already
            if len(warnings.filters) > count and warnings.filters[-1] not in kept:
                kept.append(warnings.filters[-1])
            return
        item = warnings.filters[0]  # at the front, moved there if it was there already
        if item in kept:
            kept.remove(item)
        kept.insert(0, item)

    wrapper.__name__ = add_filter.__name__
    wrapper.__qualname__ = add_filter.__qualname__
    wrapper.__doc__ = add_filter.__doc__
    wrapper.__wrapped__ = add_filter
    wrapper._kernel_pool_kept_at_import = True
    return wrapper


def _importing():
    """Whether an import is running below the caller (importlib's frames are on the stack)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _restore_warnings(problems):
    recorded = _recorded["warnings"]
    filters = recorded["list"]
    if warnings.filters is not filters:
        warnings.filters = filters
    if filters != recorded["filters"]:
        filters[:] = recorded["filters"]
    for name in ("defaultaction", "showwarning", "formatwarning"):
        if getattr(warnings, name) is not recorded[name]:
            setattr(warnings, name, recorded[name])
    warnings.onceregistry.clear()
    # forget which warnings were already shown: the next request sees its own, as in a fresh
    # interpreter (every module's registry is invalidated by this version bump)
    mutated = getattr(warnings, "_filters_mutated", None)
    if mutated is not None:
        mutated()


# -- IPython and other stdlib modules ------------------------------------------------------


def _capture_shell():
    """The shell's switches a magic flips: ``%xmode``, ``%precision``, ``%pprint``,
    ``%autocall``, and the names it hides."""
    shell = _ipython_shell()
    if shell is None:
        _recorded["shell"] = None
        return
    plain = shell.display_formatter.formatters.get("text/plain")
    _recorded["shell"] = {
        "xmode": shell.InteractiveTB.mode,
        "precision": getattr(plain, "float_precision", None),
        "pprint": getattr(plain, "pprint", None),
        "autocall": shell.autocall,
        "hidden": frozenset(shell.user_ns_hidden),
        "switches": {name: getattr(shell, name, None) for name in _SHELL_SWITCHES},
        "formatters": _formatter_settings(shell),
    }
    backend = _inline_backend()
    _recorded["inline backend"] = _inline_backend_settings(backend) if backend else None
    figure = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
    configured = figure is not None and "matplotlib_inline.backend_inline" in sys.modules
    _recorded["figure printers"] = _figure_printers(shell, figure) if configured else None


def _ipython_shell():
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def _restore_shell(problems):
    recorded = _recorded["shell"]
    shell = _ipython_shell() if recorded is not None else None
    if shell is None:
        return
    if shell.InteractiveTB.mode != recorded["xmode"]:
        shell.InteractiveTB.set_mode(mode=recorded["xmode"])
    _restore_formatters(shell, recorded["formatters"])
    plain = shell.display_formatter.formatters.get("text/plain")
    if recorded["precision"] is not None and plain.float_precision != recorded["precision"]:
        plain.float_precision = recorded["precision"]  # its observer resets float_format
    if recorded["pprint"] is not None and plain.pprint != recorded["pprint"]:
        plain.pprint = recorded["pprint"]
    if shell.autocall != recorded["autocall"]:
        shell.autocall = recorded["autocall"]
    for name, value in recorded["switches"].items():
        if getattr(shell, name, None) is not value:
            setattr(shell, name, value)
    logger = getattr(shell, "logger", None)
    if getattr(logger, "log_active", False):  # %logstart wrote every later request's code
        logger.logstop()
    _restore_inline_backend()
    hidden = shell.user_ns_hidden
    if len(hidden) != len(recorded["hidden"]):  # (with the numbered ones each cell adds)
        for name in [name for name in list(hidden) if name not in recorded["hidden"]]:
            del hidden[name]


# The shell's switches a magic or a line of code flips for every later cell: ``%autoawait``
# (its runner too), ``%pdb``, ``%automagic``, and which expressions display their value.
_SHELL_SWITCHES = ("autoawait", "loop_runner", "call_pdb", "automagic", "ast_node_interactivity")


def _formatter_settings(shell):
    """Each display formatter (the object, whether enabled) and its printers for builtin
    types. Printers a library registers for its own types as it is imported stay with it;
    ``for_type(float, ...)`` or ``pretty.install()`` (which replaces the plain-text
    formatter) is a cell's choice, undone."""
    return {
        mime: (formatter, formatter.enabled, _builtin_printers(formatter))
        for mime, formatter in list(shell.display_formatter.formatters.items())
    }


def _builtin_printers(formatter):
    printers = getattr(formatter, "type_printers", None)
    if not isinstance(printers, dict):
        return None
    return {kind: p for kind, p in list(printers.items()) if _builtin(kind)}


def _builtin(kind):
    return getattr(kind, "__module__", "") == "builtins"


def _restore_formatters(shell, recorded):
    formatters = shell.display_formatter.formatters
    if formatters.keys() != recorded.keys():
        for mime in [mime for mime in list(formatters) if mime not in recorded]:
            del formatters[mime]
    for mime, (formatter, enabled, builtin) in recorded.items():
        if formatters.get(mime) is not formatter:
            formatters[mime] = formatter
        if formatter.enabled is not enabled:
            formatter.enabled = enabled
        if builtin is not None and _builtin_printers(formatter) != builtin:
            printers = formatter.type_printers
            for kind in [k for k in list(printers) if _builtin(k)]:
                del printers[kind]
            printers.update(builtin)


def _inline_backend():
    """matplotlib's inline backend configuration (``%config InlineBackend...``), once made."""
    config = sys.modules.get("matplotlib_inline.config")
    backend = getattr(config, "InlineBackend", None)
    return backend.instance() if backend is not None and backend.initialized() else None


def _inline_backend_settings(backend):
    return {name: getattr(backend, name) for name in backend.trait_names(config=True)}


def _restore_inline_backend():
    """Figure formats and print options back; setting them makes the backend choose its
    printers again. It is made when a cell first draws: its settings are recorded then."""
    backend = _inline_backend()
    if backend is None:
        return
    recorded = _recorded.get("inline backend")
    if recorded is None:
        _recorded["inline backend"] = _inline_backend_settings(backend)
    else:
        for name, value in recorded.items():
            if getattr(backend, name) != value:
                setattr(backend, name, value)
    _match_figure_printers(backend)


def _match_figure_printers(backend):
    """How figures are displayed, as at the baseline: ``set_matplotlib_formats`` (retina,
    other formats, print options, or none at all) changes the printers and leaves the
    backend's settings as they were. The printers are recorded once the backend has set them
    up (at the baseline, or chosen afresh from its settings at the first reset after a cell
    made it) and put back by identity."""
    figure = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
    shell = _ipython_shell()
    if figure is None or shell is None or "matplotlib_inline.backend_inline" not in sys.modules:
        return
    recorded = _recorded.get("figure printers")
    if recorded is None:
        from IPython.core.pylabtools import select_figure_formats

        select_figure_formats(shell, backend.figure_formats, **backend.print_figure_kwargs)
        _recorded["figure printers"] = _figure_printers(shell, figure)
        return
    formatters = shell.display_formatter.formatters
    for mime, formatter in list(formatters.items()):
        wanted = recorded.get(mime)
        if formatter.type_printers.get(figure) is wanted:
            continue
        if wanted is None:
            formatter.type_printers.pop(figure, None)
        else:
            formatter.type_printers[figure] = wanted


def _figure_printers(shell, figure):
    formatters = shell.display_formatter.formatters
    return {mime: f.type_printers.get(figure) for mime, f in list(formatters.items())}


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


def _restore_reducers(baseline):
    """Pickling of builtin types, and of the classes cells define, as at baseline.

    A reducer a cell registered (``copyreg.pickle(complex, ...)``) would rewrite every later
    request's pickled output. One a library registered for its own types as a cell first
    imported it stays with the library.
    """
    table = copyreg.dispatch_table
    if table == baseline:
        return
    for kind, reducer in baseline.items():
        if table.get(kind) is not reducer:
            table[kind] = reducer
    for kind in [k for k in list(table) if k not in baseline]:
        if getattr(kind, "__module__", None) in ("builtins", "__main__"):
            del table[kind]


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
    _restore_reducers(recorded["reducers"])
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
        loop.set_task_factory(factory)  # one calling a cell's names wedged later requests


# -- libraries -------------------------------------------------------------------------------


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


def _capture_matplotlib(module):
    return dict(dict.items(module.rcParams))


def _restore_matplotlib(module, recorded):
    params = module.rcParams
    _restore_backend(module, params, recorded.get("backend"))
    for key in _RC_NOT_RESTORED:
        if dict.__contains__(params, key):
            recorded[key] = dict.__getitem__(params, key)
    if dict.__eq__(params, recorded):
        return
    with _quietly():
        for key, value in recorded.items():
            if not dict.__contains__(params, key) or dict.__getitem__(params, key) != value:
                params[key] = value


def _restore_backend(module, params, wanted):
    """Back to the backend the import chose (``MPLBACKEND``: inline in a kernel) after a
    cell's ``matplotlib.use("Agg")`` or ``plt.switch_backend``, which would otherwise keep
    every later request's figures from being shown."""
    current = dict.__getitem__(params, "backend")
    sentinel = getattr(getattr(module, "rcsetup", None), "_auto_backend_sentinel", None)
    if wanted is None or wanted is sentinel or current == wanted:
        return
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.switch_backend(wanted)
    else:
        dict.__setitem__(params, "backend", wanted)


@contextlib.contextmanager
def _quietly():
    """Setting a deprecated option warns: that is not the next request's output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _capture_inline_backend(module):
    """Right after the inline backend's import, which activated it (interactive mode on, in
    some versions). matplotlib imports it when the backend is first needed, which may be
    inside a cell's ``plt.ion()`` or ``plt.ioff()``: the mode it had before that call,
    which matplotlib's own import recorded, is the kernel's then."""
    matplotlib = sys.modules.get("matplotlib")
    if matplotlib is None:
        return None
    interactive = matplotlib.is_interactive()
    recorded = _library_state.get("matplotlib")
    if recorded is not None and "interactive" in recorded and _inside_pyplot(("ion", "ioff")):
        interactive = bool(recorded["interactive"])
    return {"interactive": interactive}


def _inside_pyplot(functions):
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in functions and code.co_filename.endswith(f"pyplot{os.extsep}py"):
            return True
        frame = frame.f_back
    return False


def _restore_inline_interactive(module, recorded):
    matplotlib = sys.modules["matplotlib"]
    if matplotlib.is_interactive() != recorded["interactive"]:  # a cell's plt.ioff()
        matplotlib.interactive(recorded["interactive"])


def _capture_sqlite3(module):
    """The adapters and converters sqlite3 applies to every later connection's values."""
    if not isinstance(getattr(module, "adapters", None), dict):
        return None
    for name, table in (("register_adapter", "adapters"), ("register_converter", "converters")):
        _keep_registrations_made_on_import(module, name, table)
    return {"adapters": dict(module.adapters), "converters": dict(module.converters)}


def _keep_registrations_made_on_import(module, name, table):
    """What a library registers as it is imported stays with it, as its warning filters do."""
    register = getattr(module, name, None)
    if register is None or getattr(register, "_kernel_pool_kept_at_import", False):
        return

    @functools.wraps(register)
    def wrapper(*args, **kwargs):
        registry = getattr(module, table)
        before = dict(registry)
        result = register(*args, **kwargs)
        recorded = _library_state.get("sqlite3")
        if recorded is not None and _importing():
            entries = list(registry.items())
            recorded[table].update((k, v) for k, v in entries if before.get(k) is not v)
        return result

    wrapper._kernel_pool_kept_at_import = True
    setattr(module, name, wrapper)


def _restore_sqlite3(module, recorded):
    for table in ("adapters", "converters"):
        current = getattr(module, table)
        if current != recorded[table]:
            current.clear()
            current.update(recorded[table])


def _capture_start_method(module):
    """multiprocessing's start method, which ``set_start_method`` sets once per process."""
    default = getattr(module, "_default_context", None)
    return None if default is None else (default, getattr(default, "_actual_context", None))


def _restore_start_method(module, recorded):
    default, actual = recorded
    if default._actual_context is not actual:
        default._actual_context = actual


def _capture_opener(module):
    """The opener ``urlopen`` uses: one a cell installed (credentials in its headers, a
    proxy) served every later request's ``urlopen``."""
    return {"opener": getattr(module, "_opener", None)}


def _restore_opener(module, recorded):
    if getattr(module, "_opener", None) is not recorded["opener"]:
        module._opener = recorded["opener"]


_LIBRARIES = {  # restored in this order
    "decimal": (_capture_decimal, _restore_decimal),
    "sqlite3": (_capture_sqlite3, _restore_sqlite3),
    "multiprocessing.context": (_capture_start_method, _restore_start_method),
    "urllib.request": (_capture_opener, _restore_opener),
    "numpy": (_capture_numpy, _restore_numpy),
    "pandas": (_capture_pandas, _restore_pandas),
    "matplotlib": (_capture_matplotlib, _restore_matplotlib),
    "matplotlib_inline.backend_inline": (_capture_inline_backend, _restore_inline_interactive),
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
        (_capture_logging, _restore_logging),  # noqa: F821 (_inkernel_logging.py)
        (_capture_warnings, _restore_warnings),
        (_capture_shell, _restore_shell),
        (_capture_stdlib, _restore_stdlib),
        (_record_nothing, _reseed),
    ]
)
