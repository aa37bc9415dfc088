"""Matplotlib figures rendered once per run, for both kinds of display.

A shown figure appears twice in a bundle: as the reference's display (``files/``, rendered
the way ``Figure.savefig(format="png")`` renders it) and as Jupyter's ``image/png`` display
output (``display/``). The inline backend's PNG printer crops to a tight bounding box, which
costs a second draw and differs from the reference's image, so rendering both meant three
draws per figure. Here the inline backend's *default* printer is swapped for one that
renders as ``savefig`` does, and the bytes are kept for the rest of the run: the same image
serves both displays, drawn once. A user's own printer settings (``%config InlineBackend``,
retina, SVG) are left alone.

A kept render is reused only while its figure is unchanged: a render draws every artist,
after which the figure is marked fresh, and matplotlib marks it stale again when any of its
artists changes. Runs inside the kernel; the standard library only at import time.
"""

from __future__ import annotations

import binascii
import functools
import io
import sys
from collections.abc import Callable
from typing import Any

_renders: dict[int, tuple[Any, bytes]] = {}  # id(figure) -> (figure, png), this run's
_TIGHT_DEFAULT = {"fmt": "png", "bbox_inches": "tight"}  # the inline backend's default


def is_figure(value: object) -> bool:
    module = sys.modules.get("matplotlib.figure")
    return module is not None and isinstance(value, module.Figure)


def figure_png(figure: Any) -> bytes:
    """``figure`` as ``savefig(format="png")`` renders it; rendered again only if it changed
    since this run last rendered it."""
    kept = _renders.get(id(figure))
    if kept is not None and kept[0] is figure and not figure.stale:
        return kept[1]
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    png = buffer.getvalue()
    figure.stale = False  # everything was just drawn; any change marks it stale again
    _renders[id(figure)] = (figure, png)
    return png


def forget_renders() -> None:
    """End of a run: drop the kept images and the figures they hold."""
    _renders.clear()


def _png_printer(figure: Any, base64: bool = False) -> bytes | str | None:
    """Jupyter's ``image/png`` of a figure, as the reference's display renders it."""
    if not figure.axes and not figure.lines:  # as IPython's printer: an empty figure is not shown
        return None
    png = figure_png(figure)
    return binascii.b2a_base64(png, newline=False).decode("ascii") if base64 else png


def _inline_default(printer: object) -> bool:
    """Whether ``printer`` is the inline backend's default PNG printer (a tight crop)."""
    if not isinstance(printer, functools.partial) or printer.args:
        return False
    pylabtools = sys.modules.get("IPython.core.pylabtools")
    if pylabtools is None or printer.func is not getattr(pylabtools, "print_figure", None):
        return False
    keywords = dict(printer.keywords)
    keywords.pop("base64", None)
    return keywords == _TIGHT_DEFAULT


def install(shell: Any) -> None:
    """Have the shell's ``image/png`` formatter use :func:`_png_printer` for figures whenever
    the inline backend's default printer is the one registered (it registers it when
    matplotlib is first imported, and again when its configuration changes)."""
    formatter = shell.display_formatter.formatters.get("image/png")
    if formatter is None:
        return
    lookup: Callable[[type], Any] = formatter.lookup_by_type
    printers = {flag: functools.partial(_png_printer, base64=flag) for flag in (False, True)}

    def lookup_by_type(typ: type) -> Any:
        printer = lookup(typ)
        if _inline_default(printer):
            return printers[bool(printer.keywords.get("base64", False))]
        return printer

    formatter.lookup_by_type = lookup_by_type
