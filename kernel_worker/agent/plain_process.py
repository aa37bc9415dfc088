"""A cell runs as in the reference's plain Python process, not as in a notebook: no event
loop while synchronous code runs, its text read as Python reads it, ``exit()`` ending the
cell, an empty stdin, and warnings that name the cell as ``<cell>`` or ``<string>``.

Stdlib only at import time; ``runtime.install`` applies these to the shell.
"""

from __future__ import annotations

import ast
import sys
from typing import Any

from . import tracebacks
from .run_state import current


def no_loop_while_synchronous(shell: Any) -> None:
    """Synchronous cell code runs with no event loop running, as in a plain process.

    The kernel runs its cells from inside its own event loop, so ``asyncio.run()`` and
    ``loop.run_until_complete()`` in a cell (or in a library it calls) would fail with
    "cannot be called from a running event loop", where the reference's cell process runs
    them. The loop is blocked while a synchronous statement runs anyway; it is marked
    running again (and made the thread's loop again: ``asyncio.run`` leaves none) before
    anything else happens. Statements IPython runs awaited (top-level ``await``) keep it.
    """
    import asyncio
    from asyncio import events

    run_code = shell.run_code

    async def run_code_without_loop(
        code_obj: Any, result: Any = None, *, async_: bool = False
    ) -> Any:
        loop = None if async_ else events._get_running_loop()
        if loop is None:
            return await run_code(code_obj, result, async_=async_)
        events._set_running_loop(None)
        try:
            return await run_code(code_obj, result, async_=async_)
        finally:
            events._set_running_loop(loop)
            asyncio.set_event_loop(loop)

    shell.run_code = run_code_without_loop


def plain_python_text(shell: Any) -> None:
    """A cell's text is read as Python reads it: IPython would dedent an indented cell and
    strip ``>>>`` and ``In [1]:`` prompts, which the reference's cell process refuses as
    Python does (``unexpected indent``, ``invalid syntax``). IPython's own syntax (``%magic``,
    ``!shell``) is kept."""
    from IPython.core import inputtransformer2 as transformers

    cleanup = shell.input_transformer_manager.cleanup_transforms
    for dropped in (
        transformers.leading_indent,
        transformers.classic_prompt,
        transformers.ipython_prompt,
    ):
        if dropped in cleanup:
            cleanup.remove(dropped)


class Exit:
    """``exit()``/``quit()`` end the cell with SystemExit instead of the whole kernel."""

    def __repr__(self) -> Any:
        return "Call exit() to stop the cell"

    def __call__(self, code: Any = None) -> None:
        raise SystemExit() if code is None else SystemExit(code)


# -- warnings ------------------------------------------------------------------------------------


def cell_warning_format(shell: Any) -> None:
    """A warning raised by the cell's own code names the cell as the reference's cell
    process does (see :func:`cell_file_label`), instead of the kernel's cache file for the
    cell (a temporary path) followed by the source line; warnings from any other file keep
    the usual format."""
    import warnings

    original = warnings.formatwarning

    def formatwarning(
        message: Any, category: Any, filename: str, lineno: Any, line: Any = None
    ) -> Any:
        if tracebacks.is_cell_file(shell, filename):
            filename, line = cell_file_label(), ""
        return original(message, category, filename, lineno, line)

    warnings.formatwarning = formatwarning
    # Python and IPython show a DeprecationWarning raised by ``__main__``'s code, which is
    # the cell's here; the reference's cell has no ``__name__``, so Python hides them there
    kept = [f for f in warnings.filters if not _shows_main_deprecations(f)]
    warnings.filters[:] = kept  # type: ignore[index]  # a list, typed as a sequence
    getattr(warnings, "_filters_mutated", lambda: None)()  # drop cached decisions


def _shows_main_deprecations(entry: Any) -> Any:
    action, _message, category, module, _lineno = entry
    pattern = getattr(module, "pattern", module)
    return (
        action == "default"
        and isinstance(category, type)
        and issubclass(category, DeprecationWarning)
        and isinstance(pattern, str)
        and pattern.startswith("__main__")
    )


def current_source() -> Any:
    run = current()
    return None if run is None else run.source


def cell_file_label() -> Any:
    """``<cell>`` when the cell ends in an expression, else ``<string>``: the reference
    compiles a cell that ends in an expression as ``<cell>`` (to evaluate that expression)
    and ``exec``s any other cell from its source text."""
    run = current()
    if run is None or run.source is None:
        return "<cell>"
    if run.file_label is None:
        try:
            body = ast.parse(run.source).body
        except SyntaxError:  # IPython syntax (magics): the reference's exec path
            body = []
        run.file_label = "<cell>" if body and isinstance(body[-1], ast.Expr) else "<string>"
    return run.file_label


# -- stdin ---------------------------------------------------------------------------------------


def _input_at_eof(prompt: str = "") -> None:
    """``input()`` as in a process whose stdin is empty (the reference's cell process): the
    prompt is written, then ``EOFError``; ipykernel would raise StdinNotImplementedError,
    which code written for scripts (``except EOFError``) does not expect."""
    sys.stdout.write(str(prompt))
    raise EOFError("EOF when reading a line")


def _getpass_at_eof(prompt: str = "Password: ", stream: Any = None) -> None:
    """``getpass.getpass()`` without a terminal and with an empty stdin: warns, writes the
    prompt to ``stream`` (stderr by default), then ``EOFError``."""
    import getpass
    import warnings

    warnings.warn("Can not control echo on the terminal.", getpass.GetPassWarning, stacklevel=2)
    stream = stream if stream is not None else sys.stderr
    stream.write("Warning: Password input may be echoed.\n" + str(prompt))
    raise EOFError


def stdin_at_eof(shell: Any) -> None:
    kernel = getattr(shell, "kernel", None)
    if kernel is not None:  # ipykernel installs these as input/getpass around each cell
        kernel.raw_input = _input_at_eof
        kernel.getpass = _getpass_at_eof
