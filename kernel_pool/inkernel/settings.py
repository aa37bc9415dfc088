"""Interpreter and process settings that a cell can change and that would outlive it.

The settings of modules (logging, warnings, IPython, numpy, pandas, matplotlib...) are
parts of their own, listed in ``modules.PARTS`` and captured and restored from here.
:func:`capture_settings` records everything with the warm baseline, :func:`restore_settings`
puts back whatever a cell changed, so that the next request starts as it would in a fresh
interpreter: recursion limit, trace and profile functions, the garbage collector, switch
interval, ``sys.argv``, signal handlers, the signal mask and timers, umask, resource limits,
priority, CPU affinity, locale, time zone, the default socket timeout, and what a cell left
in the kernel's own temp folder here.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import _tracemalloc
import contextlib
import gc
import operator
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .modules import PARTS

_settings: dict[str, Any] = {}
_REAL_TIMER_SIGNALS = ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")
# the limits a cell could lower or raise to effect in a later request (the others are unused
# by ordinary processes): one system call each per reset
_RLIMITS = ("CPU", "FSIZE", "DATA", "STACK", "CORE", "NOFILE", "AS", "NPROC", "MEMLOCK")
# a kernel may run an older Python than the worker's: no zip(strict=), operator.call maybe
_call = getattr(operator, "call", lambda function: function())  # Python 3.11+


def _interpreter_settings() -> Any:
    """(name, get, set) of the process-wide switches a fresh interpreter has at defaults."""
    pairs = [
        ("recursion limit", sys.getrecursionlimit, sys.setrecursionlimit),
        ("switch interval", sys.getswitchinterval, sys.setswitchinterval),
        ("trace function", sys.gettrace, sys.settrace),
        ("profile function", sys.getprofile, sys.setprofile),
        ("gc thresholds", gc.get_threshold, lambda thresholds: gc.set_threshold(*thresholds)),
        ("gc debug flags", gc.get_debug, gc.set_debug),
        ("gc enabled", gc.isenabled, lambda enabled: gc.enable() if enabled else gc.disable()),
        ("bytecode writing", lambda: sys.dont_write_bytecode, _set_dont_write_bytecode),
        ("thread exception hook", lambda: threading.excepthook, _set_thread_excepthook),
    ]
    if hasattr(sys, "get_int_max_str_digits"):
        pairs.append(("int digits limit", sys.get_int_max_str_digits, sys.set_int_max_str_digits))
    if hasattr(threading, "gettrace"):
        pairs.append(("thread trace function", threading.gettrace, threading.settrace))
        pairs.append(("thread profile function", threading.getprofile, threading.setprofile))
    # tracing every allocation slows every later request (several times over)
    pairs.append(("allocation tracing", _tracemalloc.is_tracing, _set_allocation_tracing))
    socket = sys.modules.get("socket")
    if socket is not None:
        pairs.append(("socket timeout", socket.getdefaulttimeout, socket.setdefaulttimeout))
    return pairs


def _set_allocation_tracing(on: Any) -> None:
    if on:
        _tracemalloc.start()
    else:
        _tracemalloc.stop()


def _set_dont_write_bytecode(value: Any) -> None:
    sys.dont_write_bytecode = value


def _set_thread_excepthook(hook: Callable[..., Any]) -> None:
    threading.excepthook = hook


# -- capture ---------------------------------------------------------------------------------


def capture_settings() -> None:
    """Record the current settings as the baseline (call with the rest of the baseline)."""
    _settings.clear()
    names, getters, setters = zip(*_interpreter_settings())  # noqa: B905
    _settings["interpreter"] = (names, getters, setters, list(map(_call, getters)))
    handlers = _signal_handlers()
    _settings["signals"] = (tuple(handlers), list(handlers.values()))
    _settings["signal mask"] = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    _settings["umask"] = _umask()
    _settings["rlimits"] = _rlimits()
    _settings["priority"] = _priority()
    _settings["affinity"] = _affinity()
    _settings["locale"] = _locale()
    _settings["time zone"] = (time.tzname, time.timezone, time.altzone, time.daylight)
    _settings["argv"] = (sys.argv, list(sys.argv))
    _settings["temp folder"] = _temp_folder()
    for capture, _restore in PARTS:
        capture()


def _temp_folder() -> Any:
    """The kernel's own temp folder (``TMPDIR``, set by the pool) and what was in it at the
    baseline; None where the kernel has none of its own."""
    folder = os.environ.get("KERNEL_POOL_TMPDIR")
    if not folder or os.environ.get("TMPDIR") != folder:
        return None
    try:
        return folder, frozenset(os.listdir(folder))
    except OSError:
        return None


def _empty_temp_folder(problems: list[str]) -> None:
    """Remove what cells left in the kernel's temp folder: a later request starts with it
    as a fresh kernel would (what was there at the baseline stays)."""
    recorded = _settings.get("temp folder")
    if recorded is None:
        return
    folder, kept = recorded
    try:
        entries = [entry for entry in os.scandir(folder) if entry.name not in kept]
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError as exc:
            problems.append(f"cannot empty the temp folder: {exc.strerror}: {entry.name}")


def _signal_handlers() -> Any:
    """Handlers set from Python (not where C code set one: it cannot be read or put back).

    Not SIGINT's: ipykernel installs its interrupting handler around every execution and puts
    its own back after it (it ignores SIGINT while idle), so a cell's handler never outlives
    the execution, and the one seen now, during one, is not the one an idle kernel needs.
    """
    handlers = {}
    for signum in signal.Signals:  # the named ones (not the 30 real-time signals)
        if signum in (signal.SIGKILL, signal.SIGSTOP, signal.SIGINT):
            continue
        with contextlib.suppress(OSError, ValueError):
            handler = _signal.getsignal(signum)
            if handler is not None:
                handlers[signum] = handler
    return handlers


def _umask() -> Any:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _rlimits() -> Any:
    """``(resource module, limit numbers, their names, their values)``."""
    resource = _optional("resource")
    limits = {}
    for name in _RLIMITS if resource is not None else ():
        which = getattr(resource, f"RLIMIT_{name}", None)
        if which is not None:
            with contextlib.suppress(OSError, ValueError):
                limits[which] = (name, resource.getrlimit(which))
    return resource, tuple(limits), [limits[w][0] for w in limits], [limits[w][1] for w in limits]


def _priority() -> Any:
    try:
        return os.getpriority(os.PRIO_PROCESS, 0)
    except (AttributeError, OSError):
        return None


def _affinity() -> Any:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None


def _locale() -> Any:
    locale = _optional("locale")
    try:
        return (locale, locale.setlocale(locale.LC_ALL)) if locale is not None else None
    except Exception:  # an error from the C library
        return None


def _optional(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError:
        return None


# -- restore ---------------------------------------------------------------------------------


def restore_settings(problems: list[str]) -> None:
    """Put back every recorded setting a cell changed; what cannot be undone is a problem.

    Call after ``os.environ`` is restored (the time zone follows ``TZ``).
    """
    if not _settings:
        return
    names, getters, setters, values = _settings["interpreter"]
    current = list(map(_call, getters))  # compared in C: the loop below runs on a change only
    if current != values:
        for name, now, set_, value in zip(names, current, setters, values):  # noqa: B905
            try:
                if now != value:
                    set_(value)
            except Exception as exc:
                problems.append(f"cannot restore the {name}: {type(exc).__name__}")
    argv, items = _settings["argv"]
    if sys.argv is not argv or argv != items:
        argv[:] = items
        sys.argv = argv
    _restore_signals(problems)
    _restore_process(problems)
    _empty_temp_folder(problems)
    for _capture, restore in PARTS:
        restore(problems)


def _restore_signals(problems: list[str]) -> None:
    signums, handlers = _settings["signals"]
    current = list(map(_signal.getsignal, signums))
    if current != handlers:
        for signum, now, handler in zip(signums, current, handlers):  # noqa: B905
            try:
                if now != handler:
                    signal.signal(signum, handler)
            except (OSError, ValueError, TypeError) as exc:
                problems.append(f"cannot restore the handler of signal {signum}: {exc}")
    for name in _REAL_TIMER_SIGNALS:  # a timer left running would signal another request
        which = getattr(signal, name, None)
        if which is not None and signal.getitimer(which) != (0.0, 0.0):
            signal.setitimer(which, 0)
    signal.pthread_sigmask(signal.SIG_SETMASK, _settings["signal mask"])


def _restore_process(problems: list[str]) -> None:
    umask = _settings["umask"]
    os.umask(umask)
    resource, which, names, limits = _settings["rlimits"]
    current = list(map(resource.getrlimit, which)) if resource is not None else limits
    for number, name, now, wanted in zip(which, names, current, limits):  # noqa: B905
        if now == wanted:
            continue
        try:
            resource.setrlimit(number, wanted)
        except (OSError, ValueError):
            problems.append(f"a cell lowered RLIMIT_{name} for good (to {now}, from {wanted})")
    priority = _settings["priority"]
    if priority is not None and _priority() != priority:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, priority)
        except OSError:
            problems.append(f"a cell lowered the kernel's priority to {_priority()}")
    affinity = _settings["affinity"]
    if affinity is not None and _affinity() != affinity:
        try:
            os.sched_setaffinity(0, affinity)
        except OSError as exc:
            problems.append(f"cannot restore the CPU affinity: {exc.strerror}")
    recorded = _settings["locale"]
    if recorded is not None:
        locale, wanted = recorded
        try:
            if locale.setlocale(locale.LC_ALL) != wanted:
                locale.setlocale(locale.LC_ALL, wanted)
        except locale.Error:
            problems.append("cannot restore the locale")
    if (time.tzname, time.timezone, time.altzone, time.daylight) != _settings["time zone"]:
        time.tzset()
