"""What a cell can change in ``logging`` that would outlive it.

One of the parts ``modules`` lists in ``PARTS``: the root logger (handlers, level, filters,
``logging.disable``, ``logging.captureWarnings``), the record factory and logger class, and
every named logger's level, handlers, filters and ``propagate`` and ``disabled`` flags.
Without it, a cell's ``logging.config.dictConfig`` silences every logger that existed before
it in every later request, and a handler a cell adds to its own logger prints each record
once more for every request that added one.

What a module sets on a logger while it is being imported stays, as for warning filters: the
module stays imported and would not set it again. A logger a cell makes is put back as new:
no level of its own, no handlers or filters, propagating.
"""

from __future__ import annotations

import contextlib
import operator
import sys
from typing import Any

from .registries import importing

_root_recorded: dict[str, Any] = {}
# the named loggers looked after, their recorded states, and the logger table
_named: dict[str, Any] = {}
_LOGGER_STATE = operator.attrgetter("level", "propagate", "disabled", "handlers", "filters")
_TRACKED = frozenset({"level", "propagate", "disabled", "handlers", "filters"})
# logging.NOTSET, as Logger() makes one
_NEW_LOGGER_STATE: tuple[Any, ...] = (0, True, False, [], [])


def capture_logging() -> None:
    logging = sys.modules.get("logging")
    _root_recorded.clear()
    _named.clear()
    if logging is None:
        return
    root = logging.root
    _root_recorded.update(
        level=root.level,
        handlers=list(root.handlers),
        filters=list(root.filters),
        disabled=root.disabled,
        disable=root.manager.disable,
        captured_warnings=getattr(logging, "_warnings_showwarning", None),
        classes=_classes(logging),
    )
    table = root.manager.loggerDict
    loggers = [value for value in list(table.values()) if isinstance(value, logging.Logger)]
    _named.update(
        loggers=loggers,
        states=[_state_of(logger) for logger in loggers],
        index={logger: position for position, logger in enumerate(loggers)},
        table=list(table.values()),
    )
    _track_import_time_changes(logging)


def _classes(logging: Any) -> Any:
    """The record factory and the logger classes new records and loggers are made with."""
    manager_class = logging.root.manager.loggerClass
    return (logging.getLogRecordFactory(), logging.getLoggerClass(), manager_class)


def _state_of(logger: Any) -> Any:
    level, propagate, disabled, handlers, filters = _LOGGER_STATE(logger)
    return (level, propagate, disabled, list(handlers), list(filters))


def _track_import_time_changes(logging: Any) -> None:
    """Have loggers record what a module sets on them while it is being imported.

    Attribute writes (``setLevel``, ``propagate``, ``disabled``, a new logger's own
    ``__init__``) and the handler and filter methods look for importlib's frames on the
    stack; anything else a cell does to a logger is undone by the reset.
    """
    logger_class = logging.Logger
    if getattr(logger_class.__setattr__, "_kernel_pool_tracking", False):
        return
    root = logging.root
    base_setattr = logger_class.__setattr__

    def __setattr__(self: Any, name: str, value: Any) -> None:
        base_setattr(self, name, value)
        if name in _TRACKED and _named and self is not root and importing():
            _keep(self)

    vars(__setattr__)["_kernel_pool_tracking"] = True
    logger_class.__setattr__ = __setattr__
    for name in ("addHandler", "removeHandler", "addFilter", "removeFilter"):
        setattr(logger_class, name, _logger_method(getattr(logger_class, name), root))
    # the record factory and logger classes a module installs as it is imported stay too
    for owner, name in (
        (logging, "setLogRecordFactory"),
        (logging, "setLoggerClass"),
        (root.manager, "setLoggerClass"),
    ):
        setattr(owner, name, _class_setter(getattr(owner, name), logging))


def _logger_method(method: Any, root: Any) -> Any:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if _named and self is not root and importing():
            _keep(self)
        return result

    return _wrapping(wrapper, method)


def _class_setter(function: Any, logging: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        if _named and importing():
            _root_recorded["classes"] = _classes(logging)
        return result

    return _wrapping(wrapper, function)


def _wrapping(wrapper: Any, wrapped: Any) -> Any:
    wrapper.__name__ = wrapped.__name__
    wrapper.__qualname__ = wrapped.__qualname__
    wrapper.__doc__ = wrapped.__doc__
    vars(wrapper)["__wrapped__"] = wrapped
    return wrapper


def _keep(logger: Any) -> None:
    """Record ``logger``'s current state as the one resets return to."""
    try:
        state = _state_of(logger)
    except AttributeError:  # still being made: its last attribute records it
        return
    _record(logger, state)


def _record(logger: Any, state: Any) -> None:
    position = _named["index"].get(logger)
    if position is None:
        _named["index"][logger] = len(_named["loggers"])
        _named["loggers"].append(logger)
        _named["states"].append(state)
    else:
        _named["states"][position] = state


def restore_logging(problems: list[str]) -> None:
    logging = sys.modules.get("logging")
    if not _root_recorded or logging is None:
        return
    _restore_root(logging)
    _restore_named(logging)


def _restore_root(logging: Any) -> None:
    recorded = _root_recorded
    root = logging.root
    if root.handlers != recorded["handlers"]:
        _close_dropped(root.handlers, _kept_handlers())
        root.handlers[:] = recorded["handlers"]
    if root.filters != recorded["filters"]:
        root.filters[:] = recorded["filters"]
    if root.level != recorded["level"]:
        root.setLevel(recorded["level"])
    root.disabled = recorded["disabled"]
    if root.manager.disable != recorded["disable"]:
        logging.disable(recorded["disable"])
    if hasattr(logging, "_warnings_showwarning"):
        logging._warnings_showwarning = recorded["captured_warnings"]
    if _classes(logging) != recorded["classes"]:
        factory, logger_class, manager_class = recorded["classes"]
        logging.setLogRecordFactory(factory)
        logging.setLoggerClass(logger_class)
        root.manager.loggerClass = manager_class


def _restore_named(logging: Any) -> None:
    table = list(logging.root.manager.loggerDict.values())
    if table != _named["table"]:  # loggers made since: a cell's start as new
        for value in table:
            if isinstance(value, logging.Logger) and value not in _named["index"]:
                _record(value, _NEW_LOGGER_STATE)
        _named["table"] = table
    current = list(map(_LOGGER_STATE, _named["loggers"]))  # compared in C: loop on a change
    if current == _named["states"]:
        return
    kept = _kept_handlers()
    for logger, now, recorded in zip(_named["loggers"], current, _named["states"]):  # noqa: B905
        if now == recorded:
            continue
        level, propagate, disabled, handlers, filters = recorded
        if logger.handlers != handlers:
            _close_dropped(logger.handlers, kept)
            logger.handlers[:] = handlers
        if logger.filters != filters:
            logger.filters[:] = filters
        logger.level, logger.propagate, logger.disabled = level, propagate, disabled
    logging.root.manager._clear_cache()  # loggers cache what they found enabled


def _kept_handlers() -> Any:
    """The ids of the handlers some logger keeps."""
    kept = {id(handler) for handler in _root_recorded["handlers"]}
    kept.update(id(handler) for state in _named["states"] for handler in state[3])
    return kept


def _close_dropped(handlers: Any, kept: Any) -> None:
    """Close a cell's handlers as they are dropped (a file it opened, a socket)."""
    for handler in list(handlers):
        if id(handler) not in kept:
            kept.add(id(handler))  # once
            with contextlib.suppress(Exception):  # a cell's handler, possibly broken
                handler.close()
