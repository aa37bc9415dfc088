"""A kernel's start-up code: which steps run, in which order, and what their failure is.

Python kernels run the pool's setup (the shipped packages, the helper), the preload (unless
the fork server's template ran it before the fork) and the per-kernel init, in as few round
trips as the order allows: the helper's calls (mark the modules before the preload, capture
the baseline after the last step) ride on the steps' executions as user expressions. A kind
of another language runs its own setup, the preload, the init and its own capture, each as
a cell.

A step that fails is a :class:`PreloadError`, a :class:`KernelInitError`, or else a
:class:`KernelStartError` naming the step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .config import PoolConfig
from .errors import ExecutionTimeout, KernelDied, KernelInitError, KernelStartError, PreloadError
from .helper_source import HELPER, setup_code
from .kinds import LanguageCode
from .messages import ExecuteResult
from .replies import literal, where_in_cell


class StartingKernel(Protocol):
    """What start-up needs of the kernel it starts."""

    @property
    def kernel_id(self) -> str: ...

    @property
    def slot(self) -> str | None: ...

    @property
    def preloaded_in_template(self) -> bool: ...

    async def execute(
        self,
        code: str,
        *,
        deadline: float,
        silent: bool = ...,
        store_history: bool = ...,
        user_expressions: Mapping[str, str] | None = ...,
    ) -> ExecuteResult: ...


async def run_startup_code(
    kernel: StartingKernel, config: PoolConfig, deadline: float, *, loaded: bool
) -> None:
    """Run every start-up step of ``kernel`` by ``deadline``; ``loaded``: the shipped
    packages are loaded already (a forked kernel's, from the fork server)."""
    code = config.kind.code
    if code is not None:  # another language: the kind's own code, not the pool's helper
        await _run_language_startup(kernel, config, code, deadline)
    else:
        await _run_python_startup(kernel, config, deadline, loaded=loaded)


async def _run_language_startup(
    kernel: StartingKernel, config: PoolConfig, code: LanguageCode, deadline: float
) -> None:
    """The kind's setup, the preload and the kernel init (as cells), then its capture."""
    kind = config.kind
    stages = [("preload", kind.preload), ("kernel init", kind.kernel_init)]
    steps = [("setup", code.setup), *stages, ("baseline", code.capture)]
    for what, source in steps:
        if source:
            await _startup_step(kernel, config, what, source, deadline, {})


async def _run_python_startup(
    kernel: StartingKernel, config: PoolConfig, deadline: float, *, loaded: bool
) -> None:
    setup = setup_code(config, kernel.slot, loaded=loaded)
    # as few round trips as the order allows: the helper calls ride on the code's
    # execution (user expressions run after the code, and only if it succeeded)
    mark = {"mark": f"{HELPER}.mark_before_preload()"}
    capture = {"capture": f"{HELPER}.capture()"}
    # the stages after the setup: the preload (unless the template ran it before the
    # fork), then the per-kernel stage; the baseline is captured after the last
    stages = [("kernel init", config.kind.kernel_init)]
    if not kernel.preloaded_in_template:
        stages.insert(0, ("preload", config.kind.preload))
    steps = [("setup", setup), *((what, code) for what, code in stages if code)]
    for position, (what, code) in enumerate(steps):
        calls = {"mark": mark["mark"]} if position == 0 else {}
        if position == len(steps) - 1:
            calls.update(capture)
        await _startup_step(kernel, config, what, code, deadline, calls)


async def _startup_step(
    kernel: StartingKernel,
    config: PoolConfig,
    what: str,
    code: str,
    deadline: float,
    helper_calls: Mapping[str, str],
) -> None:
    """Run start-up ``code``, then the helper calls (as user expressions) if it worked."""
    try:
        result = await kernel.execute(
            code, deadline=deadline, silent=True, store_history=False,
            user_expressions=helper_calls,
        )  # fmt: skip
    except KernelDied as exc:  # e.g. a preload that crashes the interpreter
        message = f"the kernel died running it (exit status {exc.exit_code})"
        raise _start_failure(kernel, what, message) from exc
    except ExecutionTimeout as exc:
        limit = config.start_timeout_seconds
        message = f"it did not finish within the kernel start timeout ({limit:g}s)"
        raise _start_failure(kernel, what, message) from exc
    if not result.ok:
        message = f"{result.reply.get('ename', 'Error')}: {result.reply.get('evalue', '')}"
        where = where_in_cell(result.reply.get("traceback"))
        raise _start_failure(kernel, what, f"{message} ({where})" if where else message)
    for key in helper_calls:
        try:
            literal(result, key)
        except (RuntimeError, ValueError, SyntaxError, KeyError) as exc:
            raise KernelStartError(f"kernel helper call {key} failed: {exc}") from exc


def _start_failure(kernel: StartingKernel, what: str, message: str) -> KernelStartError:
    if what == "preload":
        return PreloadError(message)
    if what == "kernel init":
        return KernelInitError(message)
    return KernelStartError(f"{what} code failed in kernel {kernel.kernel_id}: {message}")
