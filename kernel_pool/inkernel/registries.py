"""Process-wide tables and defaults a cell can add to or replace, which later requests use.

Parts of the settings ``modules`` lists: warning filters (and which warnings were already
shown), ``copyreg``'s reducers, sqlite3's adapters and converters, multiprocessing's start
method and urllib's opener. What a module adds to one of them while it is being imported
stays: the module stays imported and would not add it again."""

from __future__ import annotations

import copyreg
import functools
import sys
import warnings
from types import FrameType
from typing import Any

from .records import LIBRARY_STATE, RECORDED

# -- warnings --------------------------------------------------------------------------------


def capture_warnings() -> None:
    RECORDED["warnings"] = {
        "list": warnings.filters,
        "filters": list(warnings.filters),
        "defaultaction": warnings.defaultaction,  # type: ignore[attr-defined]
        "showwarning": warnings.showwarning,
        "formatwarning": warnings.formatwarning,
    }
    for name, append_at in (("filterwarnings", 5), ("simplefilter", 3)):
        function = getattr(warnings, name)
        if not getattr(function, "_kernel_pool_kept_at_import", False):
            setattr(warnings, name, _keeping_import_time_filters(function, append_at))


def _keeping_import_time_filters(add_filter: Any, append_at: Any) -> Any:
    """``warnings.filterwarnings``/``simplefilter`` that remembers filters added by imports.

    The reset removes every filter a cell added, except those a module adds while it is being
    imported: it stays imported and would not add them again. ``append_at`` is the position
    of the ``append`` argument.
    """

    def wrapper(*args: Any, **kwargs: Any) -> None:
        count = len(warnings.filters)
        add_filter(*args, **kwargs)
        recorded = RECORDED.get("warnings")
        if recorded is None or warnings.filters is not recorded["list"] or not importing():
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
    vars(wrapper)["__wrapped__"] = add_filter
    vars(wrapper)["_kernel_pool_kept_at_import"] = True
    return wrapper


def importing() -> Any:
    """Whether an import is running below the caller (importlib's frames are on the stack)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def restore_warnings(problems: list[str]) -> None:
    recorded = RECORDED["warnings"]
    filters = recorded["list"]
    if warnings.filters is not filters:
        warnings.filters = filters
    if filters != recorded["filters"]:
        filters[:] = recorded["filters"]
    for name in ("defaultaction", "showwarning", "formatwarning"):
        if getattr(warnings, name) is not recorded[name]:
            setattr(warnings, name, recorded[name])
    warnings.onceregistry.clear()  # type: ignore[attr-defined]
    # forget which warnings were already shown: the next request sees its own, as in a fresh
    # interpreter (every module's registry is invalidated by this version bump)
    mutated = getattr(warnings, "_filters_mutated", None)
    if mutated is not None:
        mutated()


# -- registries of other modules -------------------------------------------------------------


def restore_reducers(baseline: Any) -> None:
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


def capture_sqlite3(module: Any) -> Any:
    """The adapters and converters sqlite3 applies to every later connection's values."""
    if not isinstance(getattr(module, "adapters", None), dict):
        return None
    for name, table in (("register_adapter", "adapters"), ("register_converter", "converters")):
        _keep_registrations_made_on_import(module, name, table)
    return {"adapters": dict(module.adapters), "converters": dict(module.converters)}


def _keep_registrations_made_on_import(module: Any, name: str, table: Any) -> None:
    """What a library registers as it is imported stays with it, as its warning filters do."""
    register = getattr(module, name, None)
    if register is None or getattr(register, "_kernel_pool_kept_at_import", False):
        return

    @functools.wraps(register)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        registry = getattr(module, table)
        before = dict(registry)
        result = register(*args, **kwargs)
        recorded = LIBRARY_STATE.get("sqlite3")
        if recorded is not None and importing():
            entries = list(registry.items())
            recorded[table].update((k, v) for k, v in entries if before.get(k) is not v)
        return result

    vars(wrapper)["_kernel_pool_kept_at_import"] = True
    setattr(module, name, wrapper)


def restore_sqlite3(module: Any, recorded: Any) -> None:
    for table in ("adapters", "converters"):
        current = getattr(module, table)
        if current != recorded[table]:
            current.clear()
            current.update(recorded[table])


def capture_start_method(module: Any) -> Any:
    """multiprocessing's start method, which ``set_start_method`` sets once per process."""
    default = getattr(module, "_default_context", None)
    return None if default is None else (default, getattr(default, "_actual_context", None))


def restore_start_method(module: Any, recorded: Any) -> None:
    default, actual = recorded
    if default._actual_context is not actual:
        default._actual_context = actual


def capture_opener(module: Any) -> Any:
    """The opener ``urlopen`` uses: one a cell installed (credentials in its headers, a
    proxy) would serve every later request's ``urlopen``."""
    return {"opener": getattr(module, "_opener", None)}


def restore_opener(module: Any, recorded: Any) -> None:
    if getattr(module, "_opener", None) is not recorded["opener"]:
        module._opener = recorded["opener"]
