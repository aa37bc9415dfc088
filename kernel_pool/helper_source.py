"""What a kernel is started with: the pool's in-kernel helper as one source text, the code
that loads it into a kernel started without it, and ipykernel's arguments.

The ``_inkernel*.py`` files are not imported here: they run inside kernels, concatenated in
the order of ``_INKERNEL_FILES`` into the one module ``_kernel_pool_agent``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BOOTSTRAP", "HELPER", "INKERNEL_SOURCE", "KERNEL_ARGS"]

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
