"""The template: the preload, run once in the fork server, shared by every forked kernel.

Loaded by ``_zygote.py`` (as a plain module, never imported by the pool) the first time a
kernel is asked for with a preload. :func:`run` executes the preload as plain Python into
a fresh ``__main__``-like namespace; each kernel forked afterwards starts ipykernel with that
very dict as its user namespace, so the preload's names are there, its functions' globals
are the cells', and its objects' memory is shared copy-on-write until a kernel writes to it.

A fork copies memory, not threads, connections or a GPU context: a preload that leaves
any of these behind is refused with a message that names what it found and says to move
it to the per-kernel stage (``--kernel-init``), rather than giving kernels that fail later
in ways that are hard to trace. Native thread pools of BLAS and OpenMP libraries are known
to re-create themselves after a fork and are let through. Open files are refused too: a
forked kernel starts with none of the fork server's descriptors.
"""

from __future__ import annotations

import builtins
import linecache
import os
import re
import stat
import sys
import traceback
from typing import Any

_FILENAME = "<preload>"
# libraries whose native thread pools shut down before a fork and start again after it
_FORK_SAFE_POOLS = re.compile(rb"(openblas|libmkl_|libgomp|libiomp|libomp)[^/\n]*\.so")
_STAGE = "move it to --kernel-init, which runs in each kernel after the fork"


def run(source: str, own_fds: set[int]) -> tuple[dict[str, Any], frozenset[str]] | str:
    """The preload's namespace and the names it made, or why it cannot be the template."""
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    before = set(namespace)
    try:
        code = compile(source, _FILENAME, "exec")
    except SyntaxError as exc:
        return _syntax_error(source, exc)
    # the preload's lines, for tracebacks through its functions in every kernel
    lines = source.splitlines(keepends=True)
    linecache.cache[_FILENAME] = (len(source), None, lines, _FILENAME)
    try:
        exec(code, namespace)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included: a failed preload
        return f"{type(exc).__name__}: {exc}{_where(exc)}"
    found = _fork_hazards(own_fds)
    if found:
        return f"it left what a fork cannot copy: {'; '.join(found)}; {_STAGE}"
    return namespace, frozenset(name for name in namespace if name not in before)


def _syntax_error(source: str, exc: SyntaxError) -> str:
    line = (source.splitlines() or [""])[max(0, (exc.lineno or 1) - 1)].lstrip()
    message = f"SyntaxError: {exc.msg} (line {exc.lineno})"
    if line.startswith(("%", "!")) or "await" in (exc.msg or ""):
        return (
            f"{message}: the preload runs once as plain Python in the template, where "
            f"%-magics, ! commands and top-level await do not exist; {_STAGE} and runs "
            "as a cell"
        )
    return message


def _where(exc: BaseException) -> str:
    """`` (line N, in F)`` of the innermost frame of the preload itself, if any."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == _FILENAME]
    if not frames:
        return ""
    frame = frames[-1]
    inside = "" if frame.name == "<module>" else f", in {frame.name}"
    return f" (line {frame.lineno}{inside})"


def _fork_hazards(own_fds: set[int]) -> list[str]:
    found = []
    threading = sys.modules.get("threading")
    if threading is not None:
        names = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        if names:
            found.append(f"{len(names)} thread(s) running ({', '.join(names[:5])})")
    native = _task_count() - 1 - (len(names) if threading is not None else 0)
    if native > 0 and not _fork_safe_pool_loaded():
        found.append(f"{native} native thread(s) running")
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            found.append("a CUDA context (torch.cuda is initialised)")
    except Exception:  # a torch without CUDA support
        pass
    sockets, files = _open_descriptors(own_fds)
    if sockets:
        found.append(f"{sockets} open socket(s) (connections)")
    if files:
        found.append(f"{files} open file(s)")
    return found


def _task_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _fork_safe_pool_loaded() -> bool:
    try:
        with open("/proc/self/maps", "rb") as fh:
            return _FORK_SAFE_POOLS.search(fh.read()) is not None
    except OSError:
        return False


def _open_descriptors(own_fds: set[int]) -> tuple[int, int]:
    """Sockets and other descriptors (files, pipes, devices) open here beyond the standard
    streams and the fork server's own (its socket to the pool, the request's key pipe)."""
    sockets = files = 0
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return 0, 0
    for fd in fds:
        if fd <= 2 or fd in own_fds:
            continue
        try:
            mode = os.fstat(fd).st_mode
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if stat.S_ISSOCK(mode):
            sockets += 1
        elif not stat.S_ISDIR(mode):  # files, pipes, devices: a kernel starts with none
            files += 1
    return sockets, files
