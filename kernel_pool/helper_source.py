"""What a kernel is started with: the pool's in-kernel helper as one source text, the code
that loads it into a kernel started without it, ipykernel's arguments, and the kernel's
environment and working directory.

The ``_inkernel*.py`` files are not imported here: they run inside kernels, concatenated in
the order of ``_INKERNEL_FILES`` into the one module ``_kernel_pool_agent``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .config import PoolConfig

__all__ = [
    "BOOTSTRAP",
    "HELPER",
    "INKERNEL_SOURCE",
    "KERNEL_ARGS",
    "kernel_cwd",
    "kernel_environment",
]

# the helper, and the interpreter and library settings its reset restores, as one module
_INKERNEL_FILES = (
    "_inkernel",
    "_inkernel_namespace",
    "_inkernel_interpreter",
    "_inkernel_process",
    "_inkernel_state",
    "_inkernel_logging",
    "_inkernel_registries",
    "_inkernel_display",
    "_inkernel_modules",
    "_inkernel_hooks",
    "_inkernel_patches",
    "_inkernel_imports",
    "_inkernel_threads",
    "_inkernel_messaging",
    "_inkernel_streams",
    "_inkernel_sizes",
)
INKERNEL_SOURCE = "\n".join(
    Path(__file__).with_name(f"{name}.py").read_text(encoding="utf-8") for name in _INKERNEL_FILES
)
HELPER = "__import__('sys').modules['_kernel_pool_agent']"
BOOTSTRAP = (  # loads the helper in a kernel that starts without it
    "def __kernel_pool_boot(src):\n"
    "    import sys, types\n"
    "    mod = types.ModuleType('_kernel_pool_agent')\n"
    "    exec(compile(src, '<kernel_pool agent>', 'exec'), mod.__dict__)\n"
    "    sys.modules['_kernel_pool_agent'] = mod\n"
    f"__kernel_pool_boot({INKERNEL_SOURCE!r})\n"
    "del __kernel_pool_boot\n"
)
KERNEL_ARGS = (
    "--HistoryManager.enabled=False",  # no SQLite history: nothing of a cell is written to disk
    "--IPKernelApp.capture_fd_output=True",
    # ipykernel sleeps 0.5 ms after every execution so that late output reaches clients that
    # stop reading at the reply; the pool reads until the IOPub idle status, which comes after
    # every output of the execution, so the sleep only adds latency
    "--Kernel._execute_sleep=0",
    # no ipykernel parent poller: when the pool's process dies it exits the kernel alone,
    # leaving the cell's processes behind, and it raced the lifeline, which takes the
    # kernel's whole process group down (see _inkernel._start_lifeline). ipykernel starts
    # none for a parent that is PID 1 (which never goes away), and with a parent (unlike
    # 0) it does not print how to connect to the kernel.
    "--IPKernelApp.parent_handle=1",
)


def kernel_environment(
    config: PoolConfig, slot: str | None, kernel_dir: Path, tmp_dir: Path, *, own_user: bool
) -> dict[str, str]:
    """A kernel's environment: the configured one (else the pool's), with its GPU slot, its
    own IPython and temp folders, and, for a kernel of its own user, its own home."""
    env = dict(config.env if config.env is not None else os.environ)
    env.update(config.kind.env)
    if slot is not None:
        env["CUDA_VISIBLE_DEVICES"] = slot
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    env["IPYTHONDIR"] = str(kernel_dir / "ipython")
    for name in ("TMPDIR", "TEMP", "TMP", "KERNEL_POOL_TMPDIR"):  # a temp folder of its own
        env[name] = str(tmp_dir)
    if own_user:  # a user that may have no home directory
        env["HOME"] = env["MPLCONFIGDIR"] = str(kernel_dir)
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    return env


def kernel_cwd(config: PoolConfig, kernel_dir: Path, *, own_user: bool) -> Path:
    """The configured directory; else the kernel's own for a user of its own, else the
    pool's."""
    if config.kernel_cwd is not None:
        return config.kernel_cwd
    return kernel_dir if own_user else Path.cwd()
