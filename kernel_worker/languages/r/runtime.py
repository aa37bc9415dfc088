"""The R side, as the code an R kernel runs: :data:`R_CODE` (setup, baseline, reset) and
:func:`run_call`, the one line that runs a cell from its plan file.

The R sources (``session.R``: baseline and reset; ``cell.R``: one cell) are evaluated once
at kernel start into an environment attached to the search path as
:data:`TOOLS_NAME` and locked, so a cell can neither see them among its globals nor rebind
them. Every later call names that environment. Nothing of a request is ever part of the R
source the kernel runs: a cell's plan (its source included) travels as a JSON file, and the
only value written into code is that file's path, as an escaped R string literal.
"""

from __future__ import annotations

from pathlib import Path

from kernel_pool import LanguageCode

__all__ = ["R_CODE", "TOOLS_NAME", "r_string", "run_call"]

TOOLS_NAME = "tools:strata-kernel-worker"
"""The search-path entry holding the worker's R functions."""
_SOURCES = ("session.R", "cell.R")
_CONTROL = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
_TOOLS = f"as.environment({TOOLS_NAME!r})".replace("'", '"')


def r_string(text: str) -> str:
    """``text`` as an R string literal: quoted, every character outside printable ASCII
    (and the quote and backslash) escaped, so it reads back exactly."""
    out = ['"']
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif " " <= char <= "~":
            out.append(char)
        elif char in _CONTROL:
            out.append(_CONTROL[char])
        elif char == "\x00":
            raise ValueError("an R string cannot hold a NUL character")
        elif char < " " or char == "\x7f":
            out.append(f"\\x{ord(char):02x}")
        else:  # \u takes four hex digits at most, \U eight
            out.append(f"\\{'u' if ord(char) <= 0xFFFF else 'U'}{{{ord(char):x}}}")
    out.append('"')
    return "".join(out)


def _setup_code() -> str:
    folder = Path(__file__).parent
    source = "\n".join((folder / name).read_text(encoding="utf-8") for name in _SOURCES)
    return (
        "local({\n"
        f"  tools <- attach(NULL, name = {r_string(TOOLS_NAME)}, warn.conflicts = FALSE)\n"
        f"  eval(parse(text = {r_string(source)}, keep.source = FALSE), envir = tools)\n"
        "  lockEnvironment(tools, bindings = TRUE)\n"
        "})\n"
        "invisible(NULL)\n"
    )


R_CODE = LanguageCode(
    setup=_setup_code(),
    capture=f"{_TOOLS}$capture()",
    reset=f"{_TOOLS}$reset()",
)
"""What an R kernel runs at start (setup, baseline) and after each request (reset)."""


def run_call(plan_file: Path) -> str:
    """The R code that runs the cell whose plan is in ``plan_file``."""
    return f"{_TOOLS}$run({r_string(str(plan_file))})"
