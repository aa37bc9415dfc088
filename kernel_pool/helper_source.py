"""What a kernel is started with: the code that loads and installs the pool's in-kernel
package and the setup's, ipykernel's arguments, and the kernel's environment (which owns its
GPU slot) and working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from .config import PoolConfig
from .shipping import INKERNEL, ShippedPackage, load_code

__all__ = [
    "GPU_VARIABLE",
    "HELPER",
    "KERNEL_ARGS",
    "kernel_cwd",
    "kernel_environment",
    "setup_code",
    "shipped_packages",
]

HELPER = f"__import__({INKERNEL.name!r})"
"""The pool's in-kernel package, as an expression run in the kernel."""
GPU_VARIABLE = "CUDA_VISIBLE_DEVICES"
"""Set to a kernel's GPU slot in its start environment, and kept so for every cell."""


def shipped_packages(config: PoolConfig) -> tuple[ShippedPackage, ...]:
    """The packages every kernel of ``config`` starts with loaded."""
    return (INKERNEL, *config.setup.packages)


def setup_code(config: PoolConfig, slot: str | None, *, loaded: bool) -> str:
    """Kernel source run first in a kernel: load the shipped packages (unless ``loaded``: a
    forked kernel has them from the fork server) and install the setup's code."""
    pinned = (GPU_VARIABLE,) if slot is not None else ()
    install = f"{HELPER}.install(get_ipython(), {config.setup.install!r}, {pinned!r})\n"
    return install if loaded else load_code(shipped_packages(config)) + install


KERNEL_ARGS = (
    "--HistoryManager.enabled=False",  # no SQLite history: nothing of a cell is written to disk
    "--IPKernelApp.capture_fd_output=True",
    # ipykernel sleeps 0.5 ms after every execution so that late output reaches clients that
    # stop reading at the reply; the pool reads until the IOPub idle status, which comes after
    # every output of the execution, so the sleep only adds latency
    "--Kernel._execute_sleep=0",
    # no ipykernel parent poller: when the pool's process dies it exits the kernel alone,
    # leaving the cell's processes behind, and it raced the lifeline, which takes the
    # kernel's whole process group down (see the in-kernel process.start_lifeline). ipykernel starts
    # none for a parent that is PID 1 (which never goes away), and with a parent (unlike
    # 0) it does not print how to connect to the kernel.
    "--IPKernelApp.parent_handle=1",
)


def kernel_environment(
    config: PoolConfig, slot: str | None, kernel_dir: Path, tmp_dir: Path, *, own_user: bool
) -> dict[str, str]:
    """A kernel's environment: the configured one (else the pool's), with its GPU slot, its
    own IPython and temp folders (joblib's too, unless set), and, for a kernel of its own
    user, its own home."""
    env = dict(config.env if config.env is not None else os.environ)
    env.update(config.kind.env)
    if slot is not None:
        env[GPU_VARIABLE] = slot
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    env["IPYTHONDIR"] = str(kernel_dir / "ipython")
    for name in ("TMPDIR", "TEMP", "TMP", "KERNEL_POOL_TMPDIR"):  # a temp folder of its own
        env[name] = str(tmp_dir)
    # joblib memory-maps into /dev/shm otherwise, where a killed kernel's folders stay for good
    env.setdefault("JOBLIB_TEMP_FOLDER", str(tmp_dir))
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
