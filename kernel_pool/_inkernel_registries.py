"""Process-wide tables and defaults a cell can add to or replace, which later requests use.

Shipped into every kernel after ``_inkernel_logging.py``, into the same module (stdlib only):
warning filters (and which warnings were already shown), ``copyreg``'s reducers, sqlite3's
adapters and converters, multiprocessing's start method and urllib's opener. What a module
adds to one of them while it is being imported stays: the module stays imported and would
not add it again.
"""

import copyreg
import functools
import sys
import warnings

# -- warnings --------------------------------------------------------------------------------


def _capture_warnings():
    _recorded["warnings"] = {  # noqa: F821 (from _inkernel_modules.py)
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
        recorded = _recorded.get("warnings")  # noqa: F821
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
    recorded = _recorded["warnings"]  # noqa: F821
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


# -- registries of other modules -------------------------------------------------------------


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
        recorded = _library_state.get("sqlite3")  # noqa: F821 (from _inkernel_modules.py)
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
    proxy) would serve every later request's ``urlopen``."""
    return {"opener": getattr(module, "_opener", None)}


def _restore_opener(module, recorded):
    if getattr(module, "_opener", None) is not recorded["opener"]:
        module._opener = recorded["opener"]
