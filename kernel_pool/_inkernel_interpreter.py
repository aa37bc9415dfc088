"""Interpreter state every request runs through: core modules, ``sys`` hooks, the import
system, and the kernel's own machinery and event loop.

Shipped into every kernel after ``_inkernel.py``, into the same module (stdlib only). The
reset puts back the attributes of the core modules (also right after each execution, before
the reply), the ``sys`` hooks, ``sys.meta_path`` and ``sys.path_hooks``, the importer cache,
async generator hooks and ``gc`` callbacks; what it cannot put back (the shell's
transformers and handlers, a cell's timers and tasks on the loop, a closed ``sys.stdout``)
makes the kernel unfit for reuse.
"""

import asyncio
import contextlib
import gc
import itertools
import os
import sys

# code of these packages is the kernel's own (its message handling runs as loop tasks)
_KERNEL_PACKAGES = ("ipykernel", "tornado", "zmq", "jupyter_client", "IPython", "anyio")


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
            if current.get(key, _MISSING) is not value:  # noqa: F821 (from _inkernel.py)
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


_MODULE = type(sys)


def _restore_core_modules():
    """Undo monkeypatches of the core modules (the kernel's own messaging uses them)."""
    for name, snapshot in _baseline["module_dicts"].items():  # noqa: F821 (from _inkernel.py)
        snapshot.restore(
            _baseline["modules"][name].__dict__,  # noqa: F821
            exact=name == "builtins",
        )


def _restore_interpreter(problems):
    """Undo monkeypatches of core modules, sys hooks, sys.modules and fds 0-2."""
    _restore_core_modules()
    restore_touched(problems)  # noqa: F821 (from _inkernel_patches.py)
    restore_module_patches()  # noqa: F821 (from _inkernel_patches.py)
    for name, value in _baseline["sys_hooks"].items():  # noqa: F821
        if value is not _MISSING and getattr(sys, name, _MISSING) is not value:  # noqa: F821
            setattr(sys, name, value)
    sys.meta_path[:] = _baseline["meta_path"]  # noqa: F821
    sys.path_hooks[:] = _baseline["path_hooks"]  # noqa: F821
    # hooks that call a cell's function: once its names are gone, they fail in later requests
    if tuple(sys.get_asyncgen_hooks()) != _baseline["asyncgen_hooks"]:  # noqa: F821
        firstiter, finalizer = _baseline["asyncgen_hooks"]  # noqa: F821
        sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=finalizer)
    if gc.callbacks != _baseline["gc_callbacks"]:  # noqa: F821
        # a library's own (added as a cell imported it) stays, as its warning filters do
        baseline = _baseline["gc_callbacks"]  # noqa: F821
        kept = [c for c in list(gc.callbacks) if c not in baseline and not _cells(c)]
        gc.callbacks[:] = _baseline["gc_callbacks"] + kept  # noqa: F821
    # a finder a cell put there would run later requests' imports; any other is rebuilt
    _baseline["importer_cache"].restore(sys.path_importer_cache, exact=True)  # noqa: F821
    restore_module_table()  # noqa: F821 (from _inkernel_imports.py)
    _restore_std_fds(problems)  # noqa: F821 (from _inkernel_process.py)


def _restore_after_execute():
    """Undo core monkeypatches right after each execution, before the kernel replies.

    The kernel's own messaging uses ``json``; a cell that patched it would otherwise make
    the reply itself unreadable. Output the cell's subprocesses wrote is passed on first.
    """
    drain_fd_output()  # noqa: F821 (from _inkernel_messaging.py)
    if _baseline:  # noqa: F821
        # a std fd the cell closed is put back now, before anything can take its number
        for fd, (copy, _) in _baseline["fds"].items():  # noqa: F821
            if _fd_identity(fd) is None:  # noqa: F821 (from _inkernel_process.py)
                with contextlib.suppress(OSError):
                    os.dup2(copy, fd)
        _restore_core_modules()
        # the kernel flushes and writes its reply through these: a stand-in the cell left
        # (without write or flush, say) would keep the reply from going out
        for name in ("stdout", "stderr"):
            stream = _baseline["sys_hooks"].get(name, _MISSING)  # noqa: F821
            if stream is not _MISSING and getattr(sys, name, None) is not stream:  # noqa: F821
                setattr(sys, name, stream)


def _cells(function):
    """Whether a callable was defined by a cell (its names are gone after the reset)."""
    return getattr(function, "__module__", None) == "__main__"


def _retire_default_executor():
    """Shut down the event loop's default executor (``asyncio.to_thread``), if it has one,
    and return its threads: idle ones end, one still at work does not. Its idle threads
    never end otherwise, so threads it started for a cell would look left running (and
    retire the kernel every time). Done before the baseline too, for one a preload made."""
    loop = _running_loop()
    executor = getattr(loop, "_default_executor", None)
    if executor is None or not hasattr(executor, "shutdown"):
        return []
    threads = list(getattr(executor, "_threads", ()))
    executor.shutdown(wait=False)
    loop._default_executor = None
    return threads


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
        if task.done() or id(task) in _baseline["tasks"]:  # noqa: F821
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


def _closed_streams():
    for name in ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__"):
        if getattr(getattr(sys, name, None), "closed", False) is True:
            yield name
