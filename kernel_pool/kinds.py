"""What starts a kernel, as one value: a :class:`KernelKind`.

A pool serves kernels of one kind. The kind says which program runs the kernel (ipykernel on
this interpreter, ipykernel on another interpreter or environment, or any Jupyter
kernelspec), its language, whether kernels are forked from a template or spawned, and what
every kernel of the kind starts with (the preload and the per-kernel init). Leasing, reset
and retirement never look at the kind: adding a kind touches only how a kernel is started.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DEFAULT_KIND", "KernelKind", "LanguageCode", "write_kernelspec"]


@dataclass(frozen=True, slots=True)
class LanguageCode:
    """How the pool sets up and resets a kernel of a language other than Python, in that
    language (the pool's in-kernel Python package does it for ipykernel).

    Each is run as one ``execute_request``; an error reply is a failure, and its message
    says why (for :attr:`reset`: what could not be put back, which retires the kernel).
    """

    setup: str
    """Run first at start, before the preload: defines what :attr:`capture` and
    :attr:`reset` call (and what a pool's user runs in the kernel)."""
    capture: str
    """Run last at start, after the preload and the kernel init: records the baseline."""
    reset: str
    """Run after each lease the kernel is reused after: puts the baseline back, then checks
    it; an error when something differs."""


@dataclass(frozen=True, slots=True)
class KernelKind:
    """One way of starting a kernel."""

    name: str = "default"
    """A label for logs, stats and metrics; pools of a :class:`~kernel_pool.PoolSet` are
    told apart by it."""
    language: str = "python"
    """The language the kernel runs (what the pool's user may send it)."""
    kernel_name: str | None = None
    """A Jupyter kernelspec to spawn; ``None``: ipykernel of :attr:`python`."""
    python: Path | None = None
    """The interpreter ipykernel runs on (``None``: the pool's own). An environment's
    interpreter sees its own packages first."""
    python_path: tuple[Path, ...] = ()
    """Folders appended to the kernel's ``sys.path`` after its own site-packages: what the
    kernel needs (ipykernel) where the environment lacks it, never shadowing what the
    environment has."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables added to the pool's kernel environment (e.g. ``VIRTUAL_ENV``)."""
    fork: bool = True
    """Fork kernels from a template process that imported ipykernel once: ipykernel on
    the pool's own interpreter, or on another one when the kind names its
    :attr:`site_packages`; other kinds are always spawned."""
    site_packages: tuple[Path, ...] = ()
    """For a kind with a :attr:`python` of an environment: its site-packages. Kernels are
    then forked from a template running that interpreter's base (``-S``, no site-packages
    of its own) with :attr:`python_path` on ``sys.path`` and ipykernel imported, shared by
    every kind naming the same base and python_path; the forked kernel puts these folders
    before :attr:`python_path` and takes the environment's ``sys.prefix`` and
    ``sys.executable`` before any of its user's code runs. Only for an environment that
    holds none of what the template imported at another version than the template's."""
    preload: str | None = None
    """User code whose names every kernel starts with (part of the baseline). Forked
    kernels get it from the template, where it runs once as plain Python (it must leave no
    threads, sockets, open files or CUDA context); spawned kernels run it at start."""
    kernel_init: str | None = None
    """User code run in every kernel at start, as a cell, after the preload and the fork:
    what cannot be forked (a GPU context, threads, connections). Its names join the
    baseline too."""
    code: LanguageCode | None = None
    """A kernelspec of another language: its own setup, baseline and reset, and no
    ipykernel arguments; ``None``: ipykernel, set up and reset by the pool's in-kernel
    package."""

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("a kernel kind needs a name")
        if self.kernel_name is not None and (self.python is not None or self.python_path):
            raise ValueError("a kernelspec kind names no interpreter or python_path")
        if self.code is not None and self.kernel_name is None:
            raise ValueError("a kind with code of its own names its kernelspec")

    @property
    def forks(self) -> bool:
        """Whether kernels of this kind are forked from the fork server."""
        native = self.python is None or bool(self.site_packages)
        return self.fork and self.kernel_name is None and native

    @property
    def template(self) -> tuple[Path, tuple[Path, ...]] | None:
        """The interpreter and ``sys.path`` tail of a template shared with other kinds
        (see :attr:`site_packages`); ``None``: the pool's own fork server, if it forks."""
        if not (self.forks and self.python is not None):
            return None
        return self.python.resolve(), self.python_path

    @property
    def entered(self) -> dict[str, object] | None:
        """What a kernel forked from a shared template enters (see :attr:`site_packages`)."""
        if self.template is None or self.python is None:
            return None
        return {
            "site_packages": [str(p) for p in self.site_packages],
            "prefix": str(self.python.parent.parent),  # <env>/bin/python
            "executable": str(self.python),
        }

    @property
    def spec_name(self) -> str:
        """The kernelspec that spawns kernels of this kind (one the pool writes, unless
        the kind names its own)."""
        return self.kernel_name or _OWN_SPEC


DEFAULT_KIND = KernelKind()
"""ipykernel on the pool's own interpreter, forked from a template."""

_OWN_SPEC = "kernel-pool-python"


def write_kernelspec(kind: KernelKind, private_dir: Path) -> Path:
    """Write the kernelspec that runs ipykernel for ``kind`` under ``private_dir`` and
    return its kernels folder (for ``KernelSpecManager(kernel_dirs=...)``)."""
    spec_dir = private_dir / "kernels" / _OWN_SPEC
    spec_dir.mkdir(parents=True, exist_ok=True)
    python = str(kind.python) if kind.python is not None else sys.executable
    start = ["-m", "ipykernel_launcher"]
    if kind.python_path:  # as ipykernel_launcher, with the kind's folders last on sys.path
        start = ["-c", (
            "import sys\n"
            "if sys.path and sys.path[0] == '': del sys.path[0]\n"
            f"sys.path.extend({[str(p) for p in kind.python_path]!r})\n"
            "from ipykernel import kernelapp\n"
            "kernelapp.launch_new_instance()\n"
        )]  # fmt: skip
    argv = [python, *start, "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": f"Python ({kind.name})", "language": kind.language}
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    return spec_dir.parent
