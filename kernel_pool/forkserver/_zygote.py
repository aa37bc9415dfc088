"""The fork server: a process with ipykernel already imported that forks kernels on request.

Run by :mod:`kernel_pool.forkserver.server` as a script (``python _zygote.py FD ROOM``, ROOM being
blank space for the kernels' command lines, see ``_set_command_line``), never imported
by the pool. Starting a kernel from a fresh interpreter spends most of its time importing
ipykernel, IPython, ZMQ and tornado; a fork of this process starts with all of that in
memory, so a kernel is ready in a fraction of the time and with a fraction of the CPU.

Protocol on the inherited ``SOCK_SEQPACKET`` socket FD, one request at a time (a request is
zlib-compressed JSON, a reply plain JSON):

- request: a JSON object ``{"id", "argv", "env", "cwd", "uid", "gid", "helper", "template",
  "connection"}``, with the write end of a pipe passed along (``SCM_RIGHTS``); or, before
  the first of them, ``{"id", "prepare"}``.
  ``connection`` is the kernel's connection info without its key: the kernel makes its own
  key after the fork, writes it into that pipe (read by the pool only) and never to a file,
  so neither this process's memory (which later kernels are forked from) nor the disk ever
  holds a kernel's key.
  ``prepare`` is the code that loads the shipped packages (the pool's in-kernel package,
  named by ``helper`` in the requests that follow, and its user's), run here once: every
  kernel forked afterwards has them in ``sys.modules``, and the helper's
  ``before_kernel_app()`` runs in each kernel before ipykernel's application starts.
  ``template`` (may be empty) is the pool's preload: run here once, as plain Python, into
  the namespace that becomes every forked kernel's user namespace (see ``_template.py``);
- reply: ``{"id", "pid": N}``, ``{"id", "prepared": true}``, ``{"id", "error": "..."}`` or,
  when the preload failed or left what a fork breaks, ``{"id", "preload_error": "..."}``,
  in the order of requests; a long message is cut to its two ends, so that a reply stays
  within 48 KiB.

A kernel is forked twice: this process forks a go-between, which forks the kernel, reports
its pid and exits. The orphaned kernel is adopted by the pool's process (a child
subreaper while it waits for the reply), so it is that process's child, exactly like a
spawned kernel: it is reaped there, watches that process (the lifeline),
and outlives this one. Each kernel leads its own session. This process exits when the
pool's end of the socket closes. It never starts a thread or an event loop, so forking is
safe: nothing here may import something that does, and a preload that starts threads,
opens sockets or initialises CUDA is refused (its names stay out of every kernel).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import json
import os
import secrets
import socket
import sys
import types
import zlib
from typing import Any

_PR_SET_DUMPABLE = 4
_PR_SET_PDEATHSIG = 1
_ARG_START, _ARG_END = 45, 46  # fields 48 and 49 of /proc/PID/stat, counted after the name
# what a kernel imports while it starts (measured): imported once here instead of per kernel
_PRELOAD = (
    "ipykernel.ipkernel",
    "ipykernel.zmqshell",
    "ipykernel.debugger",
    "IPython.core.interactiveshell",
    "IPython.core.completerlib",
    "IPython.core.debugger",
    "IPython.core.logger",
    "IPython.core.oinspect",
    "IPython.extensions.storemagic",
    "IPython.utils.wildcard",
    "faulthandler",
    "pdb",
    "tornado.platform.asyncio",
    "zmq.utils.garbage",
)
_prepared: set[str] = set()  # the packages' load code already run here
# a template of another interpreter: the folders at the end of its sys.path (the kernel
# overlay its kernels see after their environment's packages)
_TEMPLATE_PATH: list[str] = []
# preload source -> (its namespace, its names) once run, or the message of its failure
_templates: dict[str, tuple[dict[str, Any], frozenset[str]] | str] = {}


def _die_with_parent() -> None:
    """Be killed when the pool's process dies, even in the middle of a preload that runs
    for minutes (the socket's end is only noticed between requests). Cleared for each
    forked child: kernels have a lifeline of their own."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL
    if os.getppid() != parent:  # it died before the setting took hold
        os._exit(1)


def _warm_up() -> None:
    """Do once here what every kernel would do at start, and freeze the result.

    IPython parses its colour themes when a shell is created (a fifth of a forked kernel's
    start). Frozen objects are never traversed by a kernel's collections, and no collection
    writes to their pages, so they stay shared between kernels.
    """
    importlib.import_module("ipykernel.kernelapp")  # the kernel itself: required
    for name in _PRELOAD:
        with contextlib.suppress(ImportError):  # modules of other versions than measured
            importlib.import_module(name)
    with contextlib.suppress(Exception):  # IPython versions without theme tables
        from IPython.utils import PyColorize

        for name in getattr(PyColorize, "_BUILTIN_THEMES", ()):
            PyColorize.theme_table[name]
    gc.collect()
    gc.freeze()


def _prepare(source: str) -> None:
    """Run the code that loads the shipped packages (once per text)."""
    if source not in _prepared:
        exec(compile(source, "<fork server setup>", "exec"), {"__name__": "__fork_setup__"})
        _prepared.add(source)
        gc.freeze()


def _template(source: str, own_fds: set[int]) -> tuple[dict[str, Any], frozenset[str]] | str:
    """The preload's namespace and names, run here the first time it is asked for; or why
    it cannot be the template (its failure, or what it left that a fork would break)."""
    made = _templates.get(source)
    if made is None:
        template = _load_template()
        made = template.run(source, own_fds)
        _templates[source] = made
        gc.collect()
        gc.freeze()  # shared with every kernel: no kernel's collection writes to these pages
    return made


def _load_template() -> types.ModuleType:
    """``_template.py``, beside this script, loaded as a plain module."""
    module = sys.modules.get("_kernel_pool_template")
    if module is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_template.py")
        module = types.ModuleType("_kernel_pool_template")
        module.__file__ = path
        with open(path, encoding="utf-8") as fh:
            exec(compile(fh.read(), path, "exec"), module.__dict__)
        sys.modules["_kernel_pool_template"] = module
    return module


def _set_command_line(args: list[str]) -> None:
    """Show ``args`` as this process's command line (``ps``, ``/proc/PID/cmdline``).

    A forked kernel would otherwise show the fork server's. The text is written over the
    original argument strings (the fork server is started with room to spare), ended by a
    NUL and padded with spaces: Linux then reads the command line up to that NUL. Only the
    display changes; ``sys.argv`` is separate.
    """
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[_ARG_START]), int(fields[_ARG_END])
    except (OSError, IndexError, ValueError):
        return
    size = end - start
    if size < 2:
        return
    title = " ".join(args).encode(errors="replace")[: size - 2] + b"\0"
    ctypes.memmove(start, title.ljust(size, b" "), size)


def _become_kernel(
    request: dict[str, Any],
    helper: types.ModuleType,
    template: tuple[dict[str, Any], frozenset[str]] | None,
    key_fd: int,
) -> None:
    """In the forked child: drop to the kernel's identity and environment, run ipykernel."""
    code = 1
    try:
        os.setsid()  # its own session and process group: signals reach it and its children
        kernelapp = sys.modules["ipykernel.kernelapp"]
        _connect_without_a_file(kernelapp.IPKernelApp, request["connection"], key_fd)
        if request.get("uid") is not None:
            os.setgroups([])
            os.setgid(request["gid"])
            os.setuid(request["uid"])
            # a change of identity without exec makes the process undumpable (its /proc
            # files root's) until exec, which a forked kernel never does: as a spawned
            # kernel starts (the pool's helper decides later what a cell may see)
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _enter_environment(request.get("environment") or {})
        sys.path.insert(0, os.getcwd())  # as ``python -m ipykernel_launcher`` in cwd has it
        argv = request["argv"]  # parent_handle=1 among them: the lifeline watches the pool
        helper.before_kernel_app()
        sys.argv = [str(kernelapp.__file__), *argv]
        _set_command_line([sys.executable, "-m", "ipykernel_launcher", *request["argv"]])
        code = 0
        if template is None:
            kernelapp.launch_new_instance(argv=argv)
        else:  # the preload's namespace is the kernel's: its functions' globals are the cells'
            namespace, names = template
            helper.use_template_names(names)
            kernelapp.launch_new_instance(argv=argv, user_ns=namespace)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # never return into the fork server's loop


def _enter_environment(environment: dict[str, Any]) -> None:
    """Become a kernel of the environment the request names (a template of another
    interpreter, started without site-packages): its site-packages (``.pth`` files
    processed) before this template's own folders, its prefix and its interpreter."""
    if not environment:
        return
    import site

    tail = [p for p in sys.path if p in _TEMPLATE_PATH]
    head = [p for p in sys.path if p not in _TEMPLATE_PATH]
    sys.path[:] = head
    for folder in environment["site_packages"]:
        site.addsitedir(folder)
    sys.path.extend(tail)
    sys.prefix = sys.exec_prefix = environment["prefix"]
    sys.executable = environment["executable"]
    paths = sys.modules.get("jupyter_core.paths")  # computed from the template's prefix
    for name, folder in (("ENV_JUPYTER_PATH", "share"), ("ENV_CONFIG_PATH", "etc")):
        found = getattr(paths, name, None)
        if isinstance(found, list):
            found[:] = [os.path.join(sys.prefix, folder, "jupyter")]


def _connect_without_a_file(app: type, connection: dict[str, Any], key_fd: int) -> None:
    """Give the kernel a key of its own, sent to the pool through ``key_fd``, and its
    connection info from the request: ipykernel reads and writes no connection file."""
    key = secrets.token_hex(32)
    try:
        os.write(key_fd, key.encode())
    finally:
        os.close(key_fd)
    info = {**connection, "key": key, "signature_scheme": "hmac-sha256"}

    def init_connection_file(self: Any) -> None:
        self.load_connection_info(info)

    def write_connection_file(self: Any, **kwargs: Any) -> None:
        pass

    setattr(app, "init_connection_file", init_connection_file)  # noqa: B010
    setattr(app, "write_connection_file", write_connection_file)  # noqa: B010


def _fork_kernel(
    request: dict[str, Any],
    helper: types.ModuleType,
    template: tuple[dict[str, Any], frozenset[str]] | None,
    key_fd: int,
) -> int:
    """Fork the kernel through a go-between that exits at once; return the kernel's pid."""
    read_end, write_end = os.pipe()
    try:
        go_between = os.fork()
        if go_between == 0:  # the go-between: fork the kernel, say its pid, leave
            try:
                os.close(read_end)
                kernel = os.fork()
                if kernel == 0:
                    os.close(write_end)
                    _become_kernel(request, helper, template, key_fd)
                os.write(write_end, str(kernel).encode())
            finally:
                os._exit(0)
        os.close(write_end)
        write_end = -1
        with os.fdopen(read_end, "rb", closefd=True) as pipe:
            read_end = -1
            answer = pipe.read()
        os.waitpid(go_between, 0)  # gone before the reply: the kernel is adopted by then
        if not answer:
            raise OSError("the kernel could not be forked")
        return int(answer)
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)


_REPLY_ROOM = 48 << 10  # bytes a reply may take (the pool reads at most 64 KiB of one)
_TEXT_KEPT = 4000  # characters kept of each end of a long message (JSON may take 6 bytes each)


def _reply(sock: socket.socket, reply: dict[str, Any]) -> None:
    """Send ``reply`` as one datagram, a long message (a preload's error) cut to fit."""
    data = json.dumps(reply).encode()
    if len(data) > _REPLY_ROOM:
        for key in ("preload_error", "error"):
            text = reply.get(key)
            if isinstance(text, str) and len(text) > 2 * _TEXT_KEPT:
                dropped = len(text) - 2 * _TEXT_KEPT
                note = f"\n[{dropped} characters not kept]\n"
                reply[key] = text[:_TEXT_KEPT] + note + text[-_TEXT_KEPT:]
        data = json.dumps(reply).encode()
    with contextlib.suppress(OSError):  # the pool has gone: the next read ends this process
        sock.send(data)


def _serve(sock: socket.socket) -> None:
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 1)
        except OSError:
            return
        if not data:
            return  # the pool closed its end: stop
        request_id = None
        key_fd = fds[0] if fds else -1
        try:
            request = json.loads(zlib.decompress(data))
            request_id = request.get("id")
            if "prepare" in request:  # load the packages, before the first fork
                _prepare(request["prepare"])
                _reply(sock, {"id": request_id, "prepared": True})
                continue
            helper = sys.modules[request["helper"]]
            template = None
            if request.get("template"):
                made = _template(request["template"], {sock.fileno(), key_fd})
                if isinstance(made, str):
                    _reply(sock, {"id": request_id, "preload_error": made})
                    continue
                template = made
            sys.stdout.flush()
            sys.stderr.flush()
            if key_fd < 0:
                raise ValueError("no pipe for the kernel's key came with the request")
            pid = _fork_kernel(request, helper, template, key_fd)
        except Exception as exc:  # a bad request (or helper source) is answered, not fatal
            _reply(sock, {"id": request_id, "error": str(exc)})
            continue
        finally:
            if key_fd >= 0:
                os.close(key_fd)  # (the kernel has its own copy)
        _reply(sock, {"id": request_id, "pid": pid})


def main() -> None:
    # this script's directory (kernel_pool/forkserver/) must not shadow what a kernel imports
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    template_path = os.environ.pop("KERNEL_POOL_TEMPLATE_PATH", "")
    if template_path:  # started with -S: no site-packages but these, and site's builtins
        import site

        _TEMPLATE_PATH.extend(template_path.split(os.pathsep))
        sys.path.extend(_TEMPLATE_PATH)
        site.setquit()
        site.setcopyright()
        site.sethelper()
    sock = socket.socket(fileno=int(sys.argv[1]))
    _die_with_parent()
    # shown without the room reserved for the kernels' command lines
    _set_command_line([sys.executable, *sys.argv[:2]])
    _warm_up()
    _serve(sock)


if __name__ == "__main__":
    main()
