"""The fork server: a process with ipykernel imported that forks the pool's kernels.

``server.py`` is the pool's side (start it, ask it for a kernel, adopt what it forks),
``forked.py`` a forked kernel as the pool sees it (its exit), ``wire.py`` the framing of
requests and replies; ``_zygote.py`` is the fork server itself, run as a script, and
``_template.py`` the preload's template, which it loads. Neither of those two is imported
by the pool.
"""

from .forked import ExitCallback, ForkedKernelProcess, unwatch_and_close
from .server import FORK_SERVER_SCRIPT, ForkServer, killed_with_kernel

__all__ = [
    "FORK_SERVER_SCRIPT",
    "ExitCallback",
    "ForkServer",
    "ForkedKernelProcess",
    "killed_with_kernel",
    "unwatch_and_close",
]
