"""A cell's error as the reference's cell process reports it: ``str(exc)`` and a Python traceback.

IPython lays a cell's traceback out its own way (``Cell In[1], line 2``, a blank line between
frames, every frame of a deep recursion written out, its own ``run_code`` frame), and it
compiles a cell with flags that turn an unclosed bracket into ``incomplete input`` in a file
named after a hash. The reference's cell process ``exec``s the cell's text, so its errors read
as Python prints them. :func:`install` makes the kernel's error message (the IOPub ``error``
the worker reports) say what Python says:

* a syntax error in the cell is the one ``compile(source, "<string>", "exec")`` raises
  (``source`` as IPython reads it: a ``%magic`` line is a call);
* the traceback is the standard one, the cell's frames named as the reference names them
  (``<string>``, or ``<cell>``: see ``plain_process.cell_file_label``), repeated frames collapsed,
  and the kernel's and the agent's own frames left out;
* a cell that reaches for the notebook's ``strata`` client, which exists only in cells the
  notebook's server runs, is told so on a second line of its error (:func:`message`).

Standard library only.
"""

from __future__ import annotations

import builtins
import contextlib
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

_RUN_CODE_FILE = "IPython/core/interactiveshell.py"
_AGENT_FILE_PREFIX = "<strata_kernel_agent"
_HEADER = "Traceback (most recent call last):\n"
_NO_CLIENT = (
    "Cells on a worker run without the notebook's `strata` client: read or scan artifacts "
    "in a cell that runs on the notebook's server, and pass the result to this cell."
)


class _Message:
    """An exception's report text where it is not ``str(exc)``: what ipykernel sends as the
    error's ``evalue`` (it only ever takes ``str`` of the value it is given)."""

    def __init__(self, text: str) -> None:
        self._text = text

    def __str__(self) -> str:
        return self._text


def message(error: BaseException) -> str:
    """The error text a cell's failure reports: ``str(error)``, and for a ``NameError`` on
    ``strata`` a second line saying why that name is missing here."""
    text = str(error)
    if isinstance(error, NameError) and getattr(error, "name", None) == "strata":
        return f"{text}\n{_NO_CLIENT}"
    return text


def install(shell: Any, source_of: Callable[[], str | None], label_of: Callable[[], str]) -> None:
    """Report ``shell``'s errors in Python's words.

    ``source_of()`` is the running cell's text (None outside a request), ``label_of()`` the
    file name its frames get. Whatever goes wrong here leaves IPython's own report.
    """
    original = shell._showtraceback

    def _showtraceback(etype: type[BaseException], evalue: BaseException, stb: Any) -> Any:
        try:
            lines: list[str]
            if isinstance(evalue, SyntaxError):
                _put_back_filename(evalue)
            if isinstance(evalue, SyntaxError) and _not_compiling(shell, evalue):
                # the cell's text does not compile (not a SyntaxError its code raised)
                evalue = _as_compiled(shell, evalue, source_of())
                lines = [_HEADER, *traceback.format_exception_only(type(evalue), evalue)]
            else:
                lines = list(_formatted(shell, evalue, label_of()))
            etype, stb = type(evalue), ["".join(lines).rstrip("\n")]
            text = message(evalue)
            if text != str(evalue):
                return original(etype, _Message(text), stb)
        except Exception:
            pass
        return original(etype, evalue, stb)

    shell._showtraceback = _showtraceback
    show = shell.showtraceback

    def showtraceback(exc_tuple: Any = None, *args: Any, **kwargs: Any) -> Any:
        if _quiet_depth[0]:
            return None  # an error while formatting a display (see quiet)
        # IPython prints an exception group straight to stderr, bypassing _showtraceback
        try:
            etype, evalue, _ = shell._get_exc_info(exc_tuple)
            if isinstance(evalue, SyntaxError):
                _filenames[id(evalue)] = (evalue, evalue.filename)
            grouped = _in_group(evalue)
        except Exception:
            grouped = False
        if not grouped:
            return show(exc_tuple, *args, **kwargs)
        return shell._showtraceback(etype, evalue, [])

    shell.showtraceback = showtraceback
    # IPython's advice after SystemExit is for its terminal; a cell has no prompt to leave.
    warnings.filterwarnings(
        "ignore", message=r"To exit: use 'exit', 'quit', or Ctrl-D\.", category=UserWarning
    )


_quiet_depth = [0]
# SyntaxError -> its filename before IPython's report of it wrote "<string>" over a None
# (``raise SyntaxError("manual")`` reads "manual", not "manual (<string>)")
_filenames: dict[int, tuple[SyntaxError, Any]] = {}


def _put_back_filename(error: SyntaxError) -> None:
    kept = _filenames.pop(id(error), None)
    _filenames.clear()
    if kept is not None and kept[0] is error:
        error.filename = kept[1]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No error report while this runs: IPython reports an exception raised by a value's
    ``__repr__`` or ``_repr_*_`` method while it formats a display as an error of the cell,
    which fails it. The reference's cell process never formats values that way (it
    serializes them by type), so the cell must not fail for it; the display just lacks
    that format."""
    _quiet_depth[0] += 1
    try:
        yield
    finally:
        _quiet_depth[0] -= 1


def _in_group(error: BaseException | None) -> bool:
    """Whether ``error`` or an exception it arose during is an exception group."""
    group = getattr(builtins, "BaseExceptionGroup", None)  # Python 3.11+
    seen = set()
    while group is not None and error is not None and id(error) not in seen:
        if isinstance(error, group):
            return True
        seen.add(id(error))
        error = error.__context__
    return False


def is_cell_file(shell: Any, filename: object) -> bool:
    """Whether ``filename`` is a cell's (IPython's tracebacks ask the same question)."""
    try:
        return shell.compile.format_code_name(filename) is not None
    except Exception:
        return False


def _not_compiling(shell: Any, error: SyntaxError) -> bool:
    """Whether ``error`` says the cell's text does not compile: raised compiling the cell, or
    reading it (IPython tokenizes a cell before compiling it: ``<tokenize>``), and not by a
    line of the cell (``raise SyntaxError(...)``), nor by compiling other code."""
    frames = traceback.extract_tb(error.__traceback__)
    if any(is_cell_file(shell, frame.filename) for frame in frames):
        return False
    if error.filename == "<tokenize>" or is_cell_file(shell, error.filename):
        return True
    # Python 3.12+ tokenizes in C: IPython's reading of the cell raises for "<string>"
    return error.filename == "<string>" and any(
        "/IPython/" in frame.filename.replace("\\", "/") for frame in frames
    )


def _as_compiled(shell: Any, error: SyntaxError, source: str | None) -> SyntaxError:
    """The syntax error ``compile`` raises for the cell's text, where it raises one.

    The text is IPython's reading of the cell (a ``%magic`` line becomes a call, on the same
    line), so that a cell using IPython's syntax is told of its real error, not of the magic.
    """
    if source is not None:
        try:
            text = shell.transform_cell(source)
        except SyntaxError:  # IPython could not even read it: Python's own words for it
            text = source
        try:
            compile(text, "<string>", "exec", dont_inherit=True)
        except SyntaxError as plain:
            return plain.with_traceback(None)
        except Exception:
            pass
    error.filename = "<string>"
    return error


def _formatted(shell: Any, error: BaseException, label: str) -> Iterator[str]:
    """The standard traceback of ``error`` (chained exceptions too), relabelled."""
    report = traceback.TracebackException(type(error), error, error.__traceback__, compact=True)
    _relabel(shell, report, label, set())
    return report.format()


def _is_kernel_file(filename: str) -> bool:
    path = filename.replace("\\", "/")
    return path.endswith(_RUN_CODE_FILE) or "/ipykernel/" in path


def _relabel(
    shell: Any, report: traceback.TracebackException | None, label: str, seen: set[int]
) -> None:
    """Name the cell's frames ``label`` and drop the kernel's and the agent's, in ``report``
    and in the exceptions chained to it."""
    if report is None or id(report) in seen:
        return
    seen.add(id(report))
    kept = []
    for frame in report.stack:
        name = frame.filename
        if name.startswith(_AGENT_FILE_PREFIX):
            continue
        if _is_kernel_file(name):  # IPython's run_code and open(), ipykernel's streams
            continue
        if is_cell_file(shell, name):
            frame.filename = label
        kept.append(frame)
    report.stack = traceback.StackSummary.from_list(kept)
    _relabel(shell, report.__cause__, label, seen)
    _relabel(shell, report.__context__, label, seen)
    for inner in getattr(report, "exceptions", None) or ():
        _relabel(shell, inner, label, seen)
