"""The pool's code that runs inside every kernel: baseline capture, reset, verification.

Never imported by the pool's process: :mod:`kernel_pool.shipping` ships these modules'
sources into each kernel, where they are the package ``kernel_pool_inkernel`` (the fork
server loads it once; a spawned kernel at start). Standard library only at import time, and
unchanged on every Python the kernels may run (3.11 to 3.13), beside whatever versions of
IPython, ipykernel and other libraries the kernel's environment has.

The pool calls these functions through ``user_expressions``, so nothing is ever bound in
the user namespace by the pool itself:

- :func:`mark_before_preload` (at start, before the preload), :func:`install` (the setup's
  code, handed :class:`KernelHooks`), :func:`capture` (the warm baseline), :func:`reset`
  (back to the baseline, verified);
- in a forked kernel, before ipykernel's application starts: :func:`before_kernel_app`
  and :func:`use_template_names`.

``restore.py`` holds the entry points and ``baseline.py`` the record they share; what a reset
restores is in the other modules: the user namespace (``namespace``), the interpreter's hooks
and machinery (``interpreter``), the process (``process``), interpreter and module settings
(``settings``, ``modules`` and the parts it lists), ``sys.modules`` (``imports``), threads
(``threads``) and monkeypatches (``patches``); ``messaging`` decides what the kernel
publishes.
"""

from __future__ import annotations

from .host import KernelHooks, install
from .messaging import before_kernel_app
from .restore import capture, mark_before_preload, reset, use_template_names

__all__ = [
    "KernelHooks",
    "before_kernel_app",
    "capture",
    "install",
    "mark_before_preload",
    "reset",
    "use_template_names",
]
