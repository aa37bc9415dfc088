"""The pool's helper that lives inside every kernel: baseline capture, reset, verification.

This file is never imported by the pool process. Its source, followed by those of
``_inkernel_state.py``, ``_inkernel_logging.py``, ``_inkernel_modules.py``,
``_inkernel_hooks.py`` and ``_inkernel_patches.py`` (the interpreter, process, logging,
hook and module settings a reset restores), ``_inkernel_imports.py`` and
``_inkernel_threads.py`` (which entries of ``sys.modules`` and which threads left running
are a library's) and ``_inkernel_messaging.py`` (what the kernel publishes, and when), is
sent to each kernel once at start-up and executed there as the module
``_kernel_pool_agent`` (stdlib only). The pool then calls its functions through
``user_expressions``, so nothing is ever bound in the user namespace by the pool itself.

Other in-kernel code (e.g. a worker's agent) may call :func:`register_reset_hook` to have
its own per-request state cleared by every reset.

An ``execute_request`` whose metadata carries ``{"kernel_pool": {"reset": true}}`` is the
last execution of its lease: the kernel resets itself right after replying (scheduled by the
last ``post_run_cell`` hook) and publishes the verdict on IOPub as a ``kernel_pool_reset``
message, so a lease costs one round trip instead of two and the reset is off its path.
"""

import asyncio
import builtins
import contextlib
import gc
import itertools
import linecache
import os
import stat
import sys
import threading
import time

_LAST_ERROR_ATTRS = ("last_type", "last_value", "last_traceback", "last_exc")
_MISSING = object()
# modules whose attributes a cell might monkeypatch and that everything else relies on
_GUARDED_MODULES = ("builtins", "json", "pickle", "copyreg", "os", "os.path", "io", "pathlib")
_SYS_HOOKS = (
    "stdin",
    "stdout",
    "stderr",
    "displayhook",
    "excepthook",
    "breakpointhook",
    "unraisablehook",
)
RESET_MSG_TYPE = "kernel_pool_reset"
_CELL_HOOK_EVENTS = ("pre_run_cell", "post_run_cell")
# descriptors a kernel may gain over its life (libraries imported later keep a few open)
_MAX_FDS_LEFT_OPEN = 64
RESET_TOPIC = b"kernel_pool.reset"
# code of these packages is the kernel's own (its message handling runs as loop tasks)
_KERNEL_PACKAGES = ("ipykernel", "tornado", "zmq", "jupyter_client", "IPython", "anyio")

_baseline = {}
_preloaded = frozenset()
_before_preload = frozenset()
_template_names = frozenset()  # the preload's names, when it ran in the fork server
_reset_hooks = []


def _shell():
    from IPython import get_ipython

    return get_ipython()


def register_reset_hook(hook):
    """Call ``hook()`` at the start of every reset (exceptions make the reset unclean)."""
    _reset_hooks.append(hook)


def mark_before_preload():
    """Remember which names exist before the preload, to tell preloaded names apart.

    The lifeline starts here, before the preload: a pool killed while a model loads (for
    minutes) took nothing down, and the kernels ran on, adopted, until the preload ended.
    """
    global _before_preload
    # a forked kernel starts with the template's names (set by the fork server): preloaded
    _before_preload = frozenset(_shell().user_ns) - _template_names
    _start_lifeline()
    _adopt_orphans()
    return len(_before_preload)


def _adopt_orphans():
    """Make this kernel the reaper of the processes its cells start (PR_SET_CHILD_SUBREAPER).

    A process whose parent exits is adopted by the nearest such ancestor instead of init: a
    shell's background job (``os.system('job &')``), or a daemon that forks twice, becomes
    the kernel's child, which the pool's check after each request sees. Otherwise the job
    ran on unseen, in the kernel's process group, writing into later requests' output.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:
        pass


def _reap_exited_children():
    """Collect children that have exited and nobody waited for (an adopted orphan, a
    ``Popen`` never waited on): as zombies they would look like processes left running."""
    try:
        with open(f"/proc/self/task/{os.getpid()}/children", "rb") as fh:
            children = fh.read().split()
    except OSError:
        return
    for child in children:
        pid = int(child)
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == b"Z":
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def _start_lazy_infrastructure_threads():
    """Start threads the kernel itself would start later, so the baseline includes them.

    pyzmq starts a garbage-collector thread the first time it sends a large (zero-copy)
    frame; without this, the first big output would look like a thread a cell left behind.
    """
    try:
        from zmq.utils.garbage import gc as zmq_gc

        zmq_gc.start()
    except Exception:
        pass
    _forbid_tracing_when_unprivileged()  # (the lifeline began before the preload)
    _lean_messaging()  # noqa: F821 (from _inkernel_messaging.py)


def _forbid_tracing_when_unprivileged():
    """Kernels sharing an unprivileged user must not read each other: no ptrace, and
    /proc/<pid>/mem, environ and fd become root's only (PR_SET_DUMPABLE = 0)."""
    if os.getuid() == 0 or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception:
        pass


_ADOPTION_SECONDS = 2.0


def _start_lifeline():
    """If the pool's process dies (even by SIGKILL), take this kernel's whole process group
    down with it within about half a second: no orphaned cell processes holding GPUs.

    The pool's process is the one ``JPY_PARENT_PID`` names (the pool and jupyter_client set
    it to the process that starts the kernel, which is its parent): a kernel whose pool died
    while it was starting (its preload running) was adopted by another process before this
    ran, and watching that one it outlived its pool for good.
    """
    if any(t.name == "kernel-pool-lifeline" for t in threading.enumerate()):
        return
    try:
        pool = int(os.environ.get("JPY_PARENT_PID") or 0)
    except ValueError:
        pool = 0

    def watch():
        import signal
        import time

        parent = os.getppid()
        if pool > 1 and parent != pool:
            # the fork server's go-between may still be exiting: give it a moment
            settle_by = time.monotonic() + _ADOPTION_SECONDS
            while os.getppid() != pool and time.monotonic() < settle_by:
                time.sleep(0.05)
            parent = pool
        while os.getppid() == parent:
            time.sleep(0.5)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="kernel-pool-lifeline", daemon=True).start()


def capture():
    """Record the warm baseline that every reset returns to; returns a small summary."""
    global _preloaded
    _start_lazy_infrastructure_threads()
    watch_thread_starts(_shell())  # noqa: F821 (from _inkernel_threads.py)
    watch_imports()  # noqa: F821 (from _inkernel_imports.py)
    capture_settings()  # noqa: F821 (from _inkernel_state.py, shipped into this module too)
    shell = _shell()
    ns = shell.user_ns
    hm = shell.history_manager
    _watch_putenv()
    deadline = time.monotonic() + 1.0
    for thread in _retire_default_executor():  # (one still busy stays, in the baseline)
        thread.join(max(0.0, deadline - time.monotonic()))
    _baseline.clear()
    _baseline.update(
        names=dict(ns),
        environ=dict(os.environ),
        environ_data=dict(_environ_data()),
        cwd=os.getcwd(),
        path=list(sys.path),
        # the objects, not their idents: an ident is reused once its thread ends
        threads=frozenset(threading.enumerate()),
        tasks=frozenset(id(t) for t in _loop_tasks(_running_loop())),
        history=(len(hm.input_hist_parsed), len(hm.input_hist_raw)),
        cell_names=frozenset(getattr(getattr(shell, "compile", None), "_filename_map", ())),
        modules=dict(sys.modules),
        module_dicts={
            name: _Snapshot(sys.modules[name].__dict__)
            for name in _GUARDED_MODULES
            if name in sys.modules
        },
        sys_hooks={name: getattr(sys, name, _MISSING) for name in _SYS_HOOKS},
        closed_streams=frozenset(_closed_streams()),
        importer_cache=_Snapshot(sys.path_importer_cache),
        open_fds=_open_fd_count(),
        meta_path=list(sys.meta_path),
        path_hooks=list(sys.path_hooks),
        fds=_save_fds(),
        asyncgen_hooks=tuple(sys.get_asyncgen_hooks()),
        gc_callbacks=list(gc.callbacks),
    )
    capture_module_table()  # noqa: F821 (from _inkernel_imports.py)
    capture_module_patches()  # noqa: F821 (from _inkernel_patches.py)
    watch_attribute_stores(shell)  # noqa: F821 (from _inkernel_patches.py)
    _preloaded = frozenset(
        name for name in list(ns) if name not in _before_preload and not name.startswith("_")
    )
    if _restore_after_execute not in shell.events.callbacks["post_execute"]:
        shell.events.register("post_execute", _restore_after_execute)
    # registered after the setup and preload code's hooks, so it runs after theirs
    if _reset_if_last not in shell.events.callbacks["post_run_cell"]:
        shell.events.register("post_run_cell", _reset_if_last)
    # a cell's own run-cell hooks would outlive it and run in later requests' cells (execute
    # hooks are not checked: the inline backend registers one when a cell first imports pyplot)
    _baseline["cell_hooks"] = {e: tuple(shell.events.callbacks[e]) for e in _CELL_HOOK_EVENTS}
    _baseline["machinery"] = _machinery(shell)
    gc.collect()
    gc.freeze()  # the warm baseline is never garbage: keep later collections short
    return {"names": len(ns), "preloaded": sorted(_preloaded)}


def _fd_identity(fd):
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def _save_fds():
    """Duplicates of fds 0-2, so a cell that closes or redirects them can be undone."""
    saved = {}
    for fd in (0, 1, 2):
        identity = _fd_identity(fd)
        if identity is not None:
            saved[fd] = (os.dup(fd), identity)
    return saved


class _Snapshot:
    """A dict's keys and values at baseline, to tell cheaply (in C) whether it still holds
    exactly them: the same objects, not merely equal ones, which a cell's object could be.

    C compares the whole list of values at once with ``==``, which checks identity first and
    then equality. Where equality is identity (functions, classes, modules) or equal values
    are interchangeable (strings, numbers, bytes), that is the same answer; the few values
    whose equality means something else (a mapping such as ``os.environ``: a cell could put
    an equal dict in its place) are also checked one by one, by identity.
    """

    __slots__ = ("by_identity", "items", "keys", "values")

    def __init__(self, mapping):
        self.items = dict(mapping)
        self.keys = list(self.items)
        self.values = list(self.items.values())
        self.by_identity = [(k, v) for k, v in self.items.items() if not _equal_is_same(v)]

    def unchanged(self, current, *, exact):
        """``current`` starts with the baseline entries, same objects, in the same order
        (``exact``: and has nothing else)."""
        count = len(self.keys)
        if len(current) < count or (exact and len(current) != count):
            return False
        prefix = itertools.islice
        return (
            list(prefix(current.values(), count)) == self.values
            and list(prefix(current, count)) == self.keys
            and all(current.get(key) is value for key, value in self.by_identity)
        )

    def restore(self, current, *, exact):
        """Put the baseline entries back into ``current`` (``exact``: and drop the rest)."""
        if self.unchanged(current, exact=exact):
            return
        for key, value in self.items.items():
            if current.get(key, _MISSING) is not value:
                current[key] = value
        if exact:
            for key in [k for k in list(current) if k not in self.items]:
                del current[key]


# equal ones are interchangeable; builtin functions are equal when they are the same C
# function bound to the same object
_INTERCHANGEABLE = (
    str,
    bytes,
    int,
    float,
    complex,
    bool,
    type(None),
    type(Ellipsis),
    type(len),
    type([].append),
)


def _equal_is_same(value):
    """Whether ``== value`` can only be true of ``value`` or of an interchangeable twin."""
    kind = type(value)
    return kind in _INTERCHANGEABLE or kind.__eq__ is object.__eq__


def _cells(function):
    """Whether a callable was defined by a cell (its names are gone after the reset)."""
    return getattr(function, "__module__", None) == "__main__"


def _retire_default_executor():
    """Shut down the event loop's default executor (``asyncio.to_thread``), if it has one,
    and return its threads: idle ones end, one still at work does not. Its idle threads
    never end otherwise, so threads it started for a cell looked left running (and retired
    the kernel every time). Done before the baseline too, for one a preload made."""
    loop = _running_loop()
    executor = getattr(loop, "_default_executor", None)
    if executor is None or not hasattr(executor, "shutdown"):
        return []
    threads = list(getattr(executor, "_threads", ()))
    executor.shutdown(wait=False)
    loop._default_executor = None
    return threads


_put_names = set()  # names passed to os.putenv / os.unsetenv since the last reset


def _watch_putenv():
    """Note the names ``os.putenv`` and ``os.unsetenv`` set, which ``os.environ`` does not see
    (a cell's ``os.putenv('HTTP_PROXY', ...)`` reached every later request's processes).
    ``os.environ`` calls them too, so its own changes are noted as well."""
    for name in ("putenv", "unsetenv"):
        original = getattr(os, name, None)
        if original is None or getattr(original, "_kernel_pool_noted", False):
            continue

        def noting(key, *args, _original=original):
            _put_names.add(key)
            return _original(key, *args)

        noting._kernel_pool_noted = True
        noting.__name__ = noting.__qualname__ = name
        noting.__doc__ = original.__doc__
        setattr(os, name, noting)


def _environ_data():
    """The environment as the OS sees it (bytes, no decoding), where ``os`` exposes it."""
    data = getattr(os.environ, "_data", None)
    return data if isinstance(data, dict) else {}


def _environ_unchanged():
    data = _environ_data()
    if data:
        return data == _baseline["environ_data"]  # bytes keys and values: nothing to fake
    return dict(os.environ) == _baseline["environ"]


def _restore_core_modules():
    """Undo monkeypatches of the core modules (the kernel's own messaging uses them)."""
    for name, snapshot in _baseline["module_dicts"].items():
        snapshot.restore(_baseline["modules"][name].__dict__, exact=name == "builtins")


_MODULE = type(sys)


def _restore_interpreter(problems):
    """Undo monkeypatches of core modules, sys hooks, sys.modules and fds 0-2."""
    _restore_core_modules()
    restore_touched(problems)  # noqa: F821 (from _inkernel_patches.py)
    restore_module_patches()  # noqa: F821 (from _inkernel_patches.py)
    for name, value in _baseline["sys_hooks"].items():
        if value is not _MISSING and getattr(sys, name, _MISSING) is not value:
            setattr(sys, name, value)
    sys.meta_path[:] = _baseline["meta_path"]
    sys.path_hooks[:] = _baseline["path_hooks"]
    # hooks that call a cell's function: once its names are gone, they fail in later requests
    if tuple(sys.get_asyncgen_hooks()) != _baseline["asyncgen_hooks"]:
        firstiter, finalizer = _baseline["asyncgen_hooks"]
        sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=finalizer)
    if gc.callbacks != _baseline["gc_callbacks"]:
        # a library's own (added as a cell imported it) stays, as its warning filters do
        baseline = _baseline["gc_callbacks"]
        kept = [c for c in list(gc.callbacks) if c not in baseline and not _cells(c)]
        gc.callbacks[:] = _baseline["gc_callbacks"] + kept
    # a finder a cell put there would run later requests' imports; any other is rebuilt
    _baseline["importer_cache"].restore(sys.path_importer_cache, exact=True)
    restore_module_table()  # noqa: F821 (from _inkernel_imports.py)
    _restore_std_fds(problems)


def _restore_std_fds(problems):
    """Put fds 0-2 back; never over a number the kernel's own machinery has taken since."""
    for fd, (copy, identity) in _baseline["fds"].items():
        current = _fd_identity(fd)
        if current == identity:
            continue
        if current is not None and _machinery_fd(fd):
            # the cell closed it and a socket or an eventfd got the number: a dup2 would
            # close that under its owner (zmq aborts the kernel on it)
            problems.append(f"file descriptor {fd} was closed and taken over by the kernel")
            continue
        try:
            os.dup2(copy, fd)
        except OSError as exc:
            problems.append(f"cannot restore file descriptor {fd}: {exc.strerror}")


def _machinery_fd(fd):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            return True
        return os.readlink(f"/proc/self/fd/{fd}").startswith("anon_inode:")
    except OSError:
        return False


def _restore_after_execute():
    """Undo core monkeypatches right after each execution, before the kernel replies.

    The kernel's own messaging uses ``json``; a cell that patched it would otherwise make
    the reply itself unreadable. Output the cell's subprocesses wrote is passed on first.
    """
    drain_fd_output()  # noqa: F821 (from _inkernel_messaging.py)
    if _baseline:
        # a std fd the cell closed is put back now, before anything can take its number
        for fd, (copy, _) in _baseline["fds"].items():
            if _fd_identity(fd) is None:
                with contextlib.suppress(OSError):
                    os.dup2(copy, fd)
        _restore_core_modules()
        # the kernel flushes and writes its reply through these: a stand-in the cell left
        # (without write or flush, say) would keep the reply from going out
        for name in ("stdout", "stderr"):
            stream = _baseline["sys_hooks"].get(name, _MISSING)
            if stream is not _MISSING and getattr(sys, name, None) is not stream:
                setattr(sys, name, stream)


def _restore_names(ns, problems):
    names = _baseline["names"]
    for name in [n for n in list(ns) if n not in names]:
        del ns[name]
    for name, obj in names.items():
        current = ns.get(name, _MISSING)
        if current is obj:
            continue
        if name in _preloaded:
            what = "deleted" if current is _MISSING else "replaced"
            problems.append(f"preloaded name {name!r} was {what}")
        ns[name] = obj


def _clear_caches(shell):
    try:
        _flush_output_cache(shell)
    except Exception as exc:  # a cell may have broken the display hook
        return [f"output cache flush failed: {type(exc).__name__}"]
    hm = shell.history_manager
    parsed, raw = _baseline["history"]
    del hm.input_hist_parsed[parsed:]
    del hm.input_hist_raw[raw:]
    for attr in _LAST_ERROR_ATTRS:
        if hasattr(sys, attr):
            delattr(sys, attr)
    _drop_tracebacks(shell)
    shell.last_execution_result = None
    shell._last_traceback = None
    _forget_cell_sources(shell)
    return []


def _drop_tracebacks(shell):
    """Let go of the last failed cell's traceback, and of everything its frames hold.

    The reset runs while the request's handler is still finishing: the failed cell's
    exception (in the execution result), its traceback (also kept by IPython's traceback
    formatter for ``%debug``) and the frames it holds were alive when the reset's
    collection ran, and were frozen with the baseline, where no later collection looks
    (they form a cycle through the result): about 12 objects, 3.8 KB, plus whatever the
    cell's frames held, were lost for good with every failed cell.
    """
    for formatter in (getattr(shell, "InteractiveTB", None), getattr(shell, "SyntaxTB", None)):
        if getattr(formatter, "tb", None) is not None:
            formatter.tb = None
    result = shell.last_execution_result
    pending = [getattr(result, "error_in_exec", None), getattr(result, "error_before_exec", None)]
    seen = set()
    while pending:
        exc = pending.pop()
        if not isinstance(exc, BaseException) or id(exc) in seen:
            continue
        seen.add(id(exc))
        tb, exc.__traceback__ = exc.__traceback__, None
        while tb is not None:  # should anything else still hold the traceback
            with contextlib.suppress(Exception):  # a frame still running, a generator's
                tb.tb_frame.clear()
                _ = tb.tb_frame.f_locals  # a copy of the locals made earlier is emptied too
            tb = tb.tb_next
        pending += [exc.__cause__, exc.__context__, *getattr(exc, "exceptions", ())]


def _forget_cell_sources(shell):
    """Drop the source lines IPython keeps of each cell run since the baseline.

    Every cell's text stays in ``linecache`` (for tracebacks) under a name of its own, one
    per distinct text, for the life of the kernel: a kernel serving a notebook whose cells
    change grew by about 3 KB per 1 KB cell run, and never gave it back.
    """
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    kept = _baseline.get("cell_names", ())
    if not isinstance(names, dict) or len(names) <= len(kept):
        return
    extra = getattr(linecache, "_ipython_cache", None)
    for name in [n for n in list(names) if n not in kept]:
        del names[name]
        linecache.cache.pop(name, None)
        if isinstance(extra, dict):
            extra.pop(name, None)


def _flush_output_cache(shell):
    """What IPython's ``DisplayHook.flush`` does, in time proportional to what is cached.

    IPython's walks every execution count so far (``_1`` … ``_<count>``), so with stored
    history a reset got slower with every cell the kernel had run; its ``gc.collect`` is
    :func:`reset`'s own. ``_<n>`` names come from the output cache ``_oh``. The hidden
    names also hold ``_i<n>`` (stored inputs) and any ``_<n>`` a cell left without an
    ``_oh`` entry: they are dropped too, or the hidden names would grow with every cell.
    """
    hook = shell.displayhook
    ns, hidden = shell.user_ns, shell.user_ns_hidden
    cache = ns.get("_oh")
    numbered = {f"_{n}" for n in list(cache)} if isinstance(cache, dict) else set()
    numbered.update(k for k in list(hidden) if k[:1] == "_" and k.lstrip("_i").isdigit())
    numbered.difference_update(_baseline.get("names", ()))  # a preload's own `_1` stays
    for key in numbered:
        ns.pop(key, None)
        hidden.pop(key, None)
    if isinstance(cache, dict):
        cache.clear()
    hook._, hook.__, hook.___ = "", "", ""  # the display hook's own references to outputs
    if "_" not in vars(builtins):
        ns.update({"_": "", "__": "", "___": ""})


def _restore_process_state(problems):
    if not _environ_unchanged():
        os.environ.clear()
        os.environ.update(_baseline["environ"])
    if _put_names:  # os.putenv/unsetenv change the environment under os.environ
        environ = _baseline["environ_data"] or {}
        for name in list(_put_names):
            value = environ.get(os.fsencode(name) if isinstance(name, str) else name)
            with contextlib.suppress(OSError, ValueError):
                os.putenv(name, value) if value is not None else os.unsetenv(name)
        _put_names.clear()
    try:
        os.chdir(_baseline["cwd"])  # getcwd() would fail if a cell's directory is gone
    except OSError as exc:
        problems.append(f"cannot restore cwd: {exc.strerror}")
    sys.path[:] = _baseline["path"]
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        try:
            pyplot.close("all")
        except Exception as exc:
            problems.append(f"closing figures failed: {type(exc).__name__}")


def _running_loop():
    """The kernel's event loop, when this runs on it (cells and their hooks do)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _loop_tasks(loop):
    return asyncio.all_tasks(loop) if loop is not None else set()


def _kernel_code(filename):
    """Whether code in ``filename`` belongs to the kernel's own machinery."""
    return any(f"{os.sep}{package}{os.sep}" in filename for package in _KERNEL_PACKAGES)


def _pending_loop_work():
    """Timers and tasks a cell left on the kernel's event loop: they would run later, in
    another request's time (the kernel's own loop is otherwise quiet between requests)."""
    loop = _running_loop()
    if loop is None:
        return []
    problems = []
    for handle in list(getattr(loop, "_scheduled", ())):
        callback = getattr(handle, "_callback", None)
        code = getattr(callback, "__code__", None)
        if handle.cancelled() or (code is not None and _kernel_code(code.co_filename)):
            continue
        problems.append(f"a timer is still scheduled on the kernel's event loop ({callback!r:.80})")
        break
    for task in _loop_tasks(loop):
        if task.done() or id(task) in _baseline["tasks"]:
            continue
        code = getattr(task.get_coro(), "cr_code", None)
        if code is not None and _kernel_code(code.co_filename):
            continue
        problems.append(f"a task is still running on the kernel's event loop ({task.get_name()})")
        break
    return problems


def _machinery(shell):
    """What the kernel runs every request through and a cell could replace or extend: the
    shell's input and AST transformers, methods patched on the shell, the kernel's message
    handlers. Compared by identity; a change makes the kernel unfit for reuse."""
    manager = getattr(shell, "input_transformer_manager", None)
    kernel = getattr(shell, "kernel", None)
    return {
        "input transformers": (
            tuple(getattr(shell, "input_transformers_cleanup", ())),
            tuple(getattr(shell, "input_transformers_post", ())),
            tuple(getattr(manager, "cleanup_transforms", ())),
            tuple(getattr(manager, "line_transforms", ())),
            tuple(getattr(manager, "token_transformers", ())),
        ),
        "AST transformers": tuple(getattr(shell, "ast_transformers", ())),
        "shell methods": {
            name: value for name, value in list(vars(shell).items()) if _is_function(value)
        },
        "message handlers": dict(getattr(kernel, "shell_handlers", None) or {}),
    }


def _is_function(value):
    return callable(value) and not isinstance(value, type)


def _open_fd_count():
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _closed_streams():
    for name in ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__"):
        if getattr(getattr(sys, name, None), "closed", False) is True:
            yield name


def _verify(ns, problems):
    names = _baseline["names"]
    if set(ns) != set(names):
        problems.append("namespace differs from the baseline after reset")
    elif any(ns[name] is not obj for name, obj in names.items()):
        problems.append("a baseline name is bound to another object after reset")
    if not _environ_unchanged():
        problems.append("environment differs from the baseline")
    if list(sys.path) != _baseline["path"]:
        problems.append("sys.path differs from the baseline")
    shell = _shell()
    callbacks = shell.events.callbacks
    for event, hooks in _baseline["cell_hooks"].items():
        if tuple(callbacks.get(event, ())) != hooks:
            problems.append(f"a cell registered or removed a {event} hook")
    machinery = _machinery(shell)
    for part, baseline in _baseline["machinery"].items():
        if machinery[part] != baseline:
            problems.append(f"a cell changed the kernel's {part}")
    problems.extend(_pending_loop_work())
    left_open = _open_fd_count() - _baseline["open_fds"]
    if left_open > _MAX_FDS_LEFT_OPEN:  # raw descriptors cells opened and never closed
        problems.append(f"{left_open} more file descriptors are open than at the baseline")
    for name in set(_closed_streams()) - _baseline["closed_streams"]:
        problems.append(f"sys.{name} was closed")  # no reopening it: later writes would fail
    for thread in threads_left(problems):  # noqa: F821 (from _inkernel_threads.py)
        problems.append(f"thread {thread.name!r} is still running")


def reset(context_problems=None):
    """Return the kernel to its baseline; report whether it could be verified clean.

    ``context_problems``: the settings held in context variables were already restored, from
    the cells' context, with these problems (see :func:`_reset_if_last`).
    """
    problems = []
    if context_problems is None:
        restore_context_settings(problems)  # noqa: F821 (from _inkernel_modules.py)
    else:
        problems.extend(context_problems)
    for hook in _reset_hooks:
        try:
            hook()
        except Exception as exc:
            problems.append(f"reset hook failed: {type(exc).__name__}: {exc}")
    shell = _shell()
    ns = shell.user_ns
    _restore_interpreter(problems)
    _restore_names(ns, problems)
    _restore_process_state(problems)
    _reap_exited_children()
    restore_settings(problems)  # noqa: F821 (from _inkernel_state.py)
    problems += _clear_caches(shell)
    gc.collect()
    # What survives a reset (imported modules, their caches) is long-lived: freezing it keeps
    # the next reset's collection proportional to what the next cell allocates.
    gc.freeze()
    _verify(ns, problems)
    return {
        "clean": not problems,
        "problems": problems,
        "library_processes": library_processes(),  # noqa: F821 (from _inkernel_threads.py)
    }


def _parent_asking_reset(shell):
    """The request being answered, if it is a lease's last cell (it asks for a reset)."""
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return None
    try:
        parent = kernel.get_parent("shell") or {}
    except Exception:
        return None
    asked = (parent.get("metadata") or {}).get("kernel_pool") or {}
    return parent if isinstance(asked, dict) and asked.get("reset") is True else None


def _reset_if_last(result=None):
    """The lease's last cell asked for it: reset as soon as the reply has gone out."""
    shell = _shell()
    parent = _parent_asking_reset(shell) if _baseline else None
    if parent is None:
        return
    loop = _running_loop()
    if loop is None:  # no loop running: reset now, before the reply
        _reset_and_report(shell, parent)
    else:  # run once the reply and the idle status are out: off the request's path
        # except the few settings held in context variables: a callback gets a copy of the
        # cells' context, so they are restored here, in the cells' own (microseconds)
        problems = []
        restore_context_settings(problems)  # noqa: F821 (from _inkernel_modules.py)
        reset_after_idle(loop, shell, parent, problems)  # noqa: F821 (_inkernel_messaging.py)


def _reset_and_report(shell, parent, context_problems=None):
    started = time.perf_counter()
    try:
        report = reset(context_problems)
    except BaseException as exc:  # any failure makes the kernel suspect
        report = {"clean": False, "problems": [f"reset failed: {type(exc).__name__}: {exc}"]}
    report["seconds"] = time.perf_counter() - started
    kernel = shell.kernel
    # should this fail, the pool times out waiting and runs a full reset
    with contextlib.suppress(Exception):
        kernel.session.send(
            kernel.iopub_socket, RESET_MSG_TYPE, report, parent=parent, ident=RESET_TOPIC
        )
