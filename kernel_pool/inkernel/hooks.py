"""Process-wide hooks a cell can install: undone where Python allows, else the kernel retires.

One of the parts ``modules`` lists in ``PARTS``. An audit hook can never be removed (it
would see the source of every later request's cells), so adding one, from a cell or from
what it imports, makes the kernel unfit for reuse; so does ``os.register_at_fork`` called by
a cell (its callbacks would run in later requests' forks; those a module registers as it is
imported stay, as the module does). ``atexit`` callbacks a cell registered are unregistered,
the signal wakeup fd is put back, and so are ``sys.monitoring`` tools and the trace and
profile functions of the kernel's other threads (``threading.settrace_all_threads``)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any

from .records import RECORDED
from .registries import importing

_hooks = {"audit hook added": False, "at-fork by a cell": False}
_cell_exit_callbacks: list[Any] = []


def capture_hooks() -> None:
    _watch_audit_hooks()
    _watch_register_at_fork()
    _watch_atexit()
    RECORDED["wakeup fd"] = _wakeup_fd()
    monitoring = getattr(sys, "monitoring", None)
    tools = [monitoring.get_tool(i) for i in range(6)] if monitoring is not None else []
    RECORDED["monitoring tools"] = tools
    _hooks["audit hook added"] = _hooks["at-fork by a cell"] = False
    _cell_exit_callbacks.clear()


def restore_hooks(problems: list[str]) -> None:
    if _hooks["audit hook added"]:
        problems.append("an audit hook was added (it cannot be removed)")
    if _hooks["at-fork by a cell"]:
        problems.append("a cell registered an at-fork callback (it cannot be removed)")
    atexit: Any = sys.modules.get("atexit")
    while _cell_exit_callbacks:
        with contextlib.suppress(Exception):
            atexit.unregister(_cell_exit_callbacks.pop())
    _restore_wakeup_fd(problems)
    _restore_monitoring(problems)
    _clear_other_threads_tracing()


def _watch_audit_hooks() -> None:
    """Note every audit hook added after this one, through ``sys.addaudithook`` or C."""
    if getattr(sys, "_kernel_pool_audit_watched", False):
        return

    def noting(event: Any, args: Any) -> None:
        if event == "sys.addaudithook":
            _hooks["audit hook added"] = True

    sys.addaudithook(noting)
    vars(sys)["_kernel_pool_audit_watched"] = True


def _watch_register_at_fork() -> None:
    register = getattr(os, "register_at_fork", None)
    if register is None or getattr(register, "_kernel_pool_noted", False):
        return

    def noting(*args: Any, **kwargs: Any) -> Any:
        if not importing():
            _hooks["at-fork by a cell"] = True
        return register(*args, **kwargs)

    vars(noting)["_kernel_pool_noted"] = True
    noting.__name__ = noting.__qualname__ = "register_at_fork"
    noting.__doc__ = register.__doc__
    os.register_at_fork = noting


def _watch_atexit() -> None:
    atexit: Any = sys.modules.get("atexit") or __import__("atexit")
    register = atexit.register
    if getattr(register, "_kernel_pool_noted", False):
        return

    def noting(function: Any, *args: Any, **kwargs: Any) -> Any:
        result = register(function, *args, **kwargs)
        if not importing():  # a library's own, registered as it is imported, stays
            _cell_exit_callbacks.append(function)
        return result

    vars(noting)["_kernel_pool_noted"] = True
    noting.__name__ = noting.__qualname__ = "register"
    noting.__doc__ = register.__doc__
    atexit.register = noting


def _wakeup_fd() -> Any:
    """The signal wakeup fd (read by setting it and putting it back: there is no getter)."""
    try:
        fd = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(fd)
    except ValueError:  # not the main thread
        return None
    return fd


def _restore_wakeup_fd(problems: list[str]) -> None:
    wanted = RECORDED.get("wakeup fd")
    if wanted is None:
        return
    try:
        signal.set_wakeup_fd(wanted)
    except (ValueError, OSError) as exc:
        problems.append(f"cannot restore the signal wakeup fd: {exc}")


def _restore_monitoring(problems: list[str]) -> None:
    monitoring = getattr(sys, "monitoring", None)
    baseline = RECORDED.get("monitoring tools") or []
    if monitoring is None or not baseline:
        return
    for tool, name in enumerate(baseline):
        if monitoring.get_tool(tool) == name:
            continue
        clear = getattr(monitoring, "clear_tool_id", None)
        try:
            if clear is not None:
                clear(tool)  # events, local events and callbacks
            else:  # local events on code objects cannot be found to clear
                problems.append(f"a cell took sys.monitoring tool {tool}")
                monitoring.set_events(tool, 0)
            monitoring.free_tool_id(tool)
            if name is not None:
                monitoring.use_tool_id(tool, name)
        except (ValueError, RuntimeError) as exc:
            problems.append(f"cannot free sys.monitoring tool {tool}: {exc}")


def _clear_other_threads_tracing() -> None:
    """``threading.settrace_all_threads`` reached the kernel's own threads too: clear their
    trace and profile functions when the baseline had none (the thread hooks themselves are
    put back with the interpreter settings)."""
    for name, clear in (
        ("gettrace", "_settraceallthreads"),
        ("getprofile", "_setprofileallthreads"),
    ):
        get = getattr(threading, name, None)
        set_all = getattr(sys, clear, None)
        if get is not None and set_all is not None and get() is None:
            set_all(None)
