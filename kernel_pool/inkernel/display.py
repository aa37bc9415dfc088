"""How outputs are shown: IPython's shell switches and display formatters, and matplotlib.

Parts of the settings ``modules`` lists (in ``PARTS`` and ``_LIBRARIES``): the shell's
switches a magic flips (``%xmode``, ``%precision``, ``%autoawait``...), the printers of the
display formatters, and matplotlib's settings, backend, interactive mode and the inline
backend's figure formats and printers."""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

from .records import LIBRARY_STATE, RECORDED, quietly

_RC_NOT_RESTORED = ("backend_fallback", "interactive")  # the kernel's own choice


# -- IPython's shell and display formatters --------------------------------------------------


def capture_shell() -> None:
    """The shell's switches a magic flips: ``%xmode``, ``%precision``, ``%pprint``,
    ``%autocall``, and the names it hides."""
    shell = _ipython_shell()
    if shell is None:
        RECORDED["shell"] = None
        return
    plain = shell.display_formatter.formatters.get("text/plain")
    RECORDED["shell"] = {
        "xmode": shell.InteractiveTB.mode,
        "precision": getattr(plain, "float_precision", None),
        "pprint": getattr(plain, "pprint", None),
        "autocall": shell.autocall,
        "hidden": frozenset(shell.user_ns_hidden),
        "switches": {name: getattr(shell, name, None) for name in _SHELL_SWITCHES},
        "formatters": _formatter_settings(shell),
    }
    backend = _inline_backend()
    RECORDED["inline backend"] = _inline_backend_settings(backend) if backend else None
    figure = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
    configured = figure is not None and "matplotlib_inline.backend_inline" in sys.modules
    RECORDED["figure printers"] = _figure_printers(shell, figure) if configured else None


def _ipython_shell() -> Any:
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def restore_shell(problems: list[str]) -> None:
    recorded = RECORDED["shell"]
    shell = _ipython_shell() if recorded is not None else None
    if shell is None:
        return
    if shell.InteractiveTB.mode != recorded["xmode"]:
        shell.InteractiveTB.set_mode(mode=recorded["xmode"])
    _restore_formatters(shell, recorded["formatters"])
    plain = shell.display_formatter.formatters.get("text/plain")
    if recorded["precision"] is not None and plain.float_precision != recorded["precision"]:
        plain.float_precision = recorded["precision"]  # its observer resets float_format
    if recorded["pprint"] is not None and plain.pprint != recorded["pprint"]:
        plain.pprint = recorded["pprint"]
    if shell.autocall != recorded["autocall"]:
        shell.autocall = recorded["autocall"]
    for name, value in recorded["switches"].items():
        if getattr(shell, name, None) is not value:
            setattr(shell, name, value)
    logger: Any = getattr(shell, "logger", None)
    if getattr(logger, "log_active", False):  # %logstart wrote every later request's code
        logger.logstop()
    _restore_inline_backend()
    hidden = shell.user_ns_hidden
    if len(hidden) != len(recorded["hidden"]):  # (with the numbered ones each cell adds)
        for name in [name for name in list(hidden) if name not in recorded["hidden"]]:
            del hidden[name]


# The shell's switches a magic or a line of code flips for every later cell: ``%autoawait``
# (its runner too), ``%pdb``, ``%automagic``, and which expressions display their value.
_SHELL_SWITCHES = ("autoawait", "loop_runner", "call_pdb", "automagic", "ast_node_interactivity")


def _formatter_settings(shell: Any) -> Any:
    """Each display formatter (the object, whether enabled) and its printers for builtin
    types. Printers a library registers for its own types as it is imported stay with it;
    ``for_type(float, ...)`` or ``pretty.install()`` (which replaces the plain-text
    formatter) is a cell's choice, undone."""
    return {
        mime: (formatter, formatter.enabled, _builtin_printers(formatter))
        for mime, formatter in list(shell.display_formatter.formatters.items())
    }


def _builtin_printers(formatter: Any) -> Any:
    printers = getattr(formatter, "type_printers", None)
    if not isinstance(printers, dict):
        return None
    return {kind: p for kind, p in list(printers.items()) if _builtin(kind)}


def _builtin(kind: Any) -> Any:
    return getattr(kind, "__module__", "") == "builtins"


def _restore_formatters(shell: Any, recorded: Any) -> None:
    formatters = shell.display_formatter.formatters
    if formatters.keys() != recorded.keys():
        for mime in [mime for mime in list(formatters) if mime not in recorded]:
            del formatters[mime]
    for mime, (formatter, enabled, builtin) in recorded.items():
        if formatters.get(mime) is not formatter:
            formatters[mime] = formatter
        if formatter.enabled is not enabled:
            formatter.enabled = enabled
        if builtin is not None and _builtin_printers(formatter) != builtin:
            printers = formatter.type_printers
            for kind in [k for k in list(printers) if _builtin(k)]:
                del printers[kind]
            printers.update(builtin)


# -- matplotlib: its settings, its backend, inline figures -----------------------------------


def _inline_backend() -> Any:
    """matplotlib's inline backend configuration (``%config InlineBackend...``), once made."""
    config = sys.modules.get("matplotlib_inline.config")
    backend = getattr(config, "InlineBackend", None)
    return backend.instance() if backend is not None and backend.initialized() else None


def _inline_backend_settings(backend: Any) -> Any:
    return {name: getattr(backend, name) for name in backend.trait_names(config=True)}


def _restore_inline_backend() -> None:
    """Figure formats and print options back; setting them makes the backend choose its
    printers again. It is made when a cell first draws: its settings are recorded then."""
    backend = _inline_backend()
    if backend is None:
        return
    recorded = RECORDED.get("inline backend")
    if recorded is None:
        RECORDED["inline backend"] = _inline_backend_settings(backend)
    else:
        for name, value in recorded.items():
            if getattr(backend, name) != value:
                setattr(backend, name, value)
    _match_figure_printers(backend)


def _match_figure_printers(backend: Any) -> None:
    """How figures are displayed, as at the baseline: ``set_matplotlib_formats`` (retina,
    other formats, print options, or none at all) changes the printers and leaves the
    backend's settings as they were. The printers are recorded once the backend has set them
    up (at the baseline, or chosen afresh from its settings at the first reset after a cell
    made it) and put back by identity."""
    figure = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
    shell = _ipython_shell()
    if figure is None or shell is None or "matplotlib_inline.backend_inline" not in sys.modules:
        return
    recorded = RECORDED.get("figure printers")
    if recorded is None:
        from IPython.core.pylabtools import select_figure_formats

        select_figure_formats(shell, backend.figure_formats, **backend.print_figure_kwargs)  # type: ignore[no-untyped-call]
        RECORDED["figure printers"] = _figure_printers(shell, figure)
        return
    formatters = shell.display_formatter.formatters
    for mime, formatter in list(formatters.items()):
        wanted = recorded.get(mime)
        if formatter.type_printers.get(figure) is wanted:
            continue
        if wanted is None:
            formatter.type_printers.pop(figure, None)
        else:
            formatter.type_printers[figure] = wanted


def _figure_printers(shell: Any, figure: Any) -> Any:
    formatters = shell.display_formatter.formatters
    return {mime: f.type_printers.get(figure) for mime, f in list(formatters.items())}


def capture_matplotlib(module: Any) -> Any:
    return dict(dict.items(module.rcParams))


def restore_matplotlib(module: Any, recorded: Any) -> None:
    params = module.rcParams
    _restore_backend(module, params, recorded.get("backend"))
    for key in _RC_NOT_RESTORED:
        if dict.__contains__(params, key):
            recorded[key] = dict.__getitem__(params, key)
    if dict.__eq__(params, recorded):
        return
    with quietly():
        for key, value in recorded.items():
            if not dict.__contains__(params, key) or dict.__getitem__(params, key) != value:
                params[key] = value


def _restore_backend(module: Any, params: Any, wanted: Any) -> None:
    """Back to the backend the import chose (``MPLBACKEND``: inline in a kernel) after a
    cell's ``matplotlib.use("Agg")`` or ``plt.switch_backend``, which would otherwise keep
    every later request's figures from being shown."""
    current = dict.__getitem__(params, "backend")
    sentinel = getattr(getattr(module, "rcsetup", None), "_auto_backend_sentinel", None)
    if wanted is None or wanted is sentinel or current == wanted:
        return
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.switch_backend(wanted)
    else:
        dict.__setitem__(params, "backend", wanted)


def capture_inline_backend(module: Any) -> Any:
    """Right after the inline backend's import, which activated it (interactive mode on, in
    some versions). matplotlib imports it when the backend is first needed, which may be
    inside a cell's ``plt.ion()`` or ``plt.ioff()``: the mode it had before that call,
    which matplotlib's own import recorded, is the kernel's then."""
    matplotlib = sys.modules.get("matplotlib")
    if matplotlib is None:
        return None
    interactive = matplotlib.is_interactive()
    recorded = LIBRARY_STATE.get("matplotlib")
    if recorded is not None and "interactive" in recorded and _inside_pyplot(("ion", "ioff")):
        interactive = bool(recorded["interactive"])
    return {"interactive": interactive}


def _inside_pyplot(functions: Any) -> Any:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in functions and code.co_filename.endswith(f"pyplot{os.extsep}py"):
            return True
        frame = frame.f_back
    return False


def restore_inline_interactive(module: Any, recorded: Any) -> None:
    matplotlib = sys.modules["matplotlib"]
    if matplotlib.is_interactive() != recorded["interactive"]:  # a cell's plt.ioff()
        matplotlib.interactive(recorded["interactive"])
