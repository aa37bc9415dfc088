"""Process-wide hooks a cell can install: undone where Python allows, else the kernel retires.

Shipped into every kernel after ``_inkernel_modules.py``, into the same module (stdlib only),
and added to :data:`_PARTS`. An audit hook can never be removed (it would see the source of
every later request's cells), so adding one, from a cell or from what it imports, makes the
kernel unfit for reuse; so does ``os.register_at_fork`` called by a cell (its callbacks
would run in later requests' forks; those a module registers as it is imported stay, as the
module does). ``atexit`` callbacks a cell registered are unregistered, the signal wakeup fd
is put back, and so are ``sys.monitoring`` tools and the trace and profile functions of the
kernel's other threads (``threading.settrace_all_threads``).
"""

_hooks = {"audit hook added": False, "at-fork by a cell": False}
_cell_exit_callbacks = []


def _capture_hooks():
    _watch_audit_hooks()
    _watch_register_at_fork()
    _watch_atexit()
    _recorded["wakeup fd"] = _wakeup_fd()  # noqa: F821 (_recorded from _inkernel_modules.py)
    monitoring = getattr(sys, "monitoring", None)  # noqa: F821 (sys from _inkernel.py)
    tools = [monitoring.get_tool(i) for i in range(6)] if monitoring is not None else []
    _recorded["monitoring tools"] = tools  # noqa: F821
    _hooks["audit hook added"] = _hooks["at-fork by a cell"] = False
    _cell_exit_callbacks.clear()


def _restore_hooks(problems):
    if _hooks["audit hook added"]:
        problems.append("an audit hook was added (it cannot be removed)")
    if _hooks["at-fork by a cell"]:
        problems.append("a cell registered an at-fork callback (it cannot be removed)")
    atexit = sys.modules.get("atexit")  # noqa: F821
    while _cell_exit_callbacks:
        with contextlib.suppress(Exception):  # noqa: F821
            atexit.unregister(_cell_exit_callbacks.pop())
    _restore_wakeup_fd(problems)
    _restore_monitoring(problems)
    _clear_other_threads_tracing()


def _watch_audit_hooks():
    """Note every audit hook added after this one, through ``sys.addaudithook`` or C."""
    if getattr(sys, "_kernel_pool_audit_watched", False):  # noqa: F821
        return

    def noting(event, args):
        if event == "sys.addaudithook":
            _hooks["audit hook added"] = True

    sys.addaudithook(noting)  # noqa: F821
    sys._kernel_pool_audit_watched = True  # noqa: F821


def _watch_register_at_fork():
    register = getattr(os, "register_at_fork", None)  # noqa: F821 (os from _inkernel.py)
    if register is None or getattr(register, "_kernel_pool_noted", False):
        return

    def noting(*args, **kwargs):
        if not _importing():  # noqa: F821 (from _inkernel_registries.py)
            _hooks["at-fork by a cell"] = True
        return register(*args, **kwargs)

    noting._kernel_pool_noted = True
    noting.__name__ = noting.__qualname__ = "register_at_fork"
    noting.__doc__ = register.__doc__
    os.register_at_fork = noting  # noqa: F821


def _watch_atexit():
    atexit = sys.modules.get("atexit") or __import__("atexit")  # noqa: F821
    register = atexit.register
    if getattr(register, "_kernel_pool_noted", False):
        return

    def noting(function, *args, **kwargs):
        result = register(function, *args, **kwargs)
        if not _importing():  # noqa: F821 (a library's own, registered as it is imported, stays)
            _cell_exit_callbacks.append(function)
        return result

    noting._kernel_pool_noted = True
    noting.__name__ = noting.__qualname__ = "register"
    noting.__doc__ = register.__doc__
    atexit.register = noting


def _wakeup_fd():
    """The signal wakeup fd (read by setting it and putting it back: there is no getter)."""
    try:
        fd = signal.set_wakeup_fd(-1)  # noqa: F821 (signal from _inkernel_state.py)
        signal.set_wakeup_fd(fd)  # noqa: F821
    except ValueError:  # not the main thread
        return None
    return fd


def _restore_wakeup_fd(problems):
    wanted = _recorded.get("wakeup fd")  # noqa: F821
    if wanted is None:
        return
    try:
        signal.set_wakeup_fd(wanted)  # noqa: F821
    except (ValueError, OSError) as exc:
        problems.append(f"cannot restore the signal wakeup fd: {exc}")


def _restore_monitoring(problems):
    monitoring = getattr(sys, "monitoring", None)  # noqa: F821
    baseline = _recorded.get("monitoring tools") or []  # noqa: F821
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


def _clear_other_threads_tracing():
    """``threading.settrace_all_threads`` reached the kernel's own threads too: clear their
    trace and profile functions when the baseline had none (the thread hooks themselves are
    put back with the interpreter settings)."""
    for name, clear in (
        ("gettrace", "_settraceallthreads"),
        ("getprofile", "_setprofileallthreads"),
    ):
        get = getattr(threading, name, None)  # noqa: F821 (threading from _inkernel.py)
        set_all = getattr(sys, clear, None)  # noqa: F821
        if get is not None and set_all is not None and get() is None:
            set_all(None)


_PARTS.append((_capture_hooks, _restore_hooks))  # noqa: F821 (from _inkernel_state.py)
