"""The form of a display that Strata shows: its Markdown, or its PNG.

Strata's notebook shows a display as Markdown (``text/markdown``, rendered with raw HTML
turned off), as an image (``image/png``), as a table (``arrow/ipc``), or else as the text
of its preview. It has no HTML, SVG, JavaScript, LaTeX or widget view. So a display that
also has a Markdown or a PNG form goes out as that form, looked for in this order:

1. ``_repr_markdown_()`` (one that returns None has no Markdown form);
2. the ``text/markdown`` of ``_repr_mimebundle_()``;
3. ``_repr_png_()``, a matplotlib figure, a PIL image;
4. the ``image/png`` of ``_repr_mimebundle_()`` (base64 or bytes that are a PNG);
5. a plotly figure (a ``Figure``, or the ``application/vnd.plotly.v1+json`` of a bundle
   that ``fig.show()`` displays): a PNG where plotly can export one (kaleido and a Chrome
   on the machine), else a Markdown summary of its traces.

A bundle displayed with ``raw=True`` is recorded as a :class:`RawDisplay`, whose
``_repr_mimebundle_`` is that bundle. This module runs inside the kernel (shipped as
``strata_kernel_agent.display_forms``); the standard library only at import time.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib.util
import io
import sys
from typing import Any

from . import figures
from .content_types import MARKDOWN, PNG

__all__ = [
    "PLOTLY_MIME",
    "Png",
    "RawDisplay",
    "bundle_has_shown_form",
    "forget_forms",
    "plotly_summary",
    "shown_form",
]

PLOTLY_MIME = "application/vnd.plotly.v1+json"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CANARY = "_ipython_canary_method_should_not_exist_"  # as IPython tells proxies apart
_MAX_TRACES = 20
_LONGEST_NAME = 60

Png = tuple[bytes, int | None, int | None]
"""PNG bytes, and the image's width and height where the renderer knows them."""


@dataclasses.dataclass(frozen=True)
class RawDisplay:
    """A bundle the cell displayed with ``raw=True`` (``{mime: data}``), as a display value."""

    data: dict[str, Any]

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return self.data


def bundle_has_shown_form(bundle: dict[str, Any]) -> bool:
    """Whether a raw bundle holds a form :func:`shown_form` can turn into one Strata shows."""
    return (
        isinstance(bundle.get(MARKDOWN), str)
        or _bundle_png(bundle) is not None
        or isinstance(bundle.get(PLOTLY_MIME), dict)
    )


_Form = tuple[str, Any]
_forms: dict[int, tuple[object, _Form | None]] = {}  # id(value) -> (value, form), this run's


def shown_form(value: object) -> _Form | None:
    """``(MARKDOWN, text)`` or ``(PNG, (bytes, width, height))`` for *value*, or None when it
    has neither form. A ``_repr_markdown_`` or ``_repr_png_`` that raises, or returns what is
    neither text nor bytes, raises (the display is then an error entry, as in the
    reference); a ``_repr_mimebundle_`` that raises is taken as no bundle. A value's form is
    made once per run (displays are serialized together, after the cell)."""
    kept = _forms.get(id(value))
    if kept is not None and kept[0] is value:
        return kept[1]
    form = _form_of(value)
    _forms[id(value)] = (value, form)
    return form


def forget_forms() -> None:
    """End of a run: drop the kept forms and the values they hold."""
    _forms.clear()


def _form_of(value: object) -> _Form | None:
    if isinstance(value, type) or _claims_everything(value):
        return None
    text = _markdown_of(value)
    if text is not None:
        return MARKDOWN, text
    bundle = _bundle_of(value)
    if isinstance(bundle.get(MARKDOWN), str):
        return MARKDOWN, bundle[MARKDOWN]
    png = _png_of(value)
    if png is None:
        png = _bundle_png(bundle)
    if png is not None:
        return PNG, png
    figure = _plotly_dict(value, bundle)
    if figure is not None:
        return _plotly_form(figure)
    return None


def _claims_everything(value: object) -> bool:
    try:
        return getattr(value, _CANARY, None) is not None
    except Exception:
        return True


def _markdown_of(value: object) -> str | None:
    render = getattr(value, "_repr_markdown_", None)
    if not callable(render):
        return None
    text = render()
    if text is None:
        return None
    if isinstance(text, bytes):
        return text.decode("utf-8")
    if isinstance(text, str):
        return text
    raise ValueError("_repr_markdown_() returned neither str nor UTF-8 bytes")


def _bundle_of(value: object) -> dict[str, Any]:
    render = getattr(value, "_repr_mimebundle_", None)
    if not callable(render):
        return {}
    try:
        bundle = render()
    except Exception:
        return {}
    if isinstance(bundle, tuple) and bundle:  # (data, metadata)
        bundle = bundle[0]
    return bundle if isinstance(bundle, dict) else {}


def _png_of(value: Any) -> Png | None:
    """PNG bytes from ``_repr_png_``, a matplotlib figure or a PIL image, in that order."""
    render = getattr(value, "_repr_png_", None)
    raw = render() if callable(render) else None
    if isinstance(raw, str):  # IPython's own Image gives base64, as its PNG formatter may
        return _png_of_base64(raw) or raw.encode("latin1"), None, None
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw), None, None
    if raw is not None:
        raise ValueError("_repr_png_() did not return bytes")
    if figures.is_figure(value):
        size = (value.get_figwidth() * value.dpi, value.get_figheight() * value.dpi)
        return figures.figure_png(value), round(size[0]), round(size[1])
    image = sys.modules.get("PIL.Image")
    if image is not None and isinstance(value, image.Image):
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return buffer.getvalue(), value.size[0], value.size[1]
    return None


def _png_of_base64(text: str) -> bytes | None:
    """The PNG ``text`` holds in base64 (the bytes Jupyter shows), or None if it holds none."""
    if not text.startswith("iVBORw0KGg"):  # the PNG signature, in base64
        return None
    try:
        return base64.b64decode(text.replace("\n", ""), validate=True)
    except ValueError:  # binascii.Error is one
        return None


def _bundle_png(bundle: dict[str, Any]) -> Png | None:
    data = bundle.get(PNG)
    if isinstance(data, str):
        png = _png_of_base64(data)
        return None if png is None else (png, None, None)
    if isinstance(data, bytes | bytearray) and bytes(data[:8]) == _PNG_SIGNATURE:
        return bytes(data), None, None
    return None


# --- plotly ---------------------------------------------------------------------------------


def _plotly_dict(value: object, bundle: dict[str, Any]) -> dict[str, Any] | None:
    """The figure's ``{"data", "layout"}``, from a plotly figure or a bundle's plotly JSON."""
    figure = bundle.get(PLOTLY_MIME)
    base = sys.modules.get("plotly.basedatatypes")
    if not isinstance(figure, dict) and base is not None and isinstance(value, base.BaseFigure):
        figure = value.to_dict()
    if not isinstance(figure, dict):
        return None
    return {"data": figure.get("data") or [], "layout": figure.get("layout") or {}}


def _plotly_form(figure: dict[str, Any]) -> tuple[str, Any]:
    png = _plotly_png(figure)
    if png is not None:
        return PNG, (png, None, None)
    return MARKDOWN, plotly_summary(figure)


def _plotly_png(figure: dict[str, Any]) -> bytes | None:
    """The figure as plotly exports it to PNG; None without kaleido or a browser for it."""
    plotly_io = sys.modules.get("plotly.io")
    if plotly_io is None or not _kaleido_installed():
        return None
    try:
        png = plotly_io.to_image(figure, format="png")
    except Exception:  # no Chrome for kaleido, or a figure it cannot draw
        return None
    return png if isinstance(png, bytes) and png.startswith(_PNG_SIGNATURE) else None


def _kaleido_installed() -> bool:
    return importlib.util.find_spec("kaleido") is not None


def plotly_summary(figure: dict[str, Any]) -> str:
    """Markdown that names the figure and its traces (type, name, how many points)."""
    layout = figure.get("layout") if isinstance(figure.get("layout"), dict) else {}
    title = layout.get("title") if isinstance(layout, dict) else None
    if isinstance(title, dict):
        title = title.get("text")
    heading = "**Plotly figure**" + (f": {_cell(title)}" if isinstance(title, str) else "")
    traces = [t for t in figure.get("data") or [] if isinstance(t, dict)]
    lines = [heading, "", "| trace | type | points |", "| --- | --- | --- |"]
    for index, trace in enumerate(traces[:_MAX_TRACES]):
        name = trace.get("name")
        label = _cell(name) if isinstance(name, str) and name else str(index)
        points = _points(trace)
        lines.append(f"| {label} | {_cell(str(trace.get('type', 'scatter')))} | {points} |")
    if len(traces) > _MAX_TRACES:
        lines.append(f"| … {len(traces) - _MAX_TRACES} more | | |")
    lines += [
        "",
        "*An interactive plotly chart: shown here as this summary. A worker with kaleido "
        "and Chrome sends it as an image.*",
    ]
    return "\n".join(lines)


def _cell(text: str) -> str:
    """``text`` fit for one cell of a Markdown table."""
    flat = " ".join(text.split()).replace("\\", "\\\\").replace("|", "\\|")
    return flat if len(flat) <= _LONGEST_NAME else flat[: _LONGEST_NAME - 1] + "…"


_ITEM_BYTES = {"i1": 1, "u1": 1, "i2": 2, "u2": 2, "i4": 4, "u4": 4, "f4": 4, "f8": 8}


def _points(trace: dict[str, Any]) -> str:
    """How many points the trace has: the length of its first data array."""
    for key in ("x", "y", "z", "values", "r", "lat", "labels", "locations"):
        length = _length(trace.get(key))
        if length is not None:
            return str(length)
    return ""


def _length(array: object) -> int | None:
    if isinstance(array, dict) and isinstance(array.get("bdata"), str):  # a typed array
        shape = array.get("shape")
        if isinstance(shape, str) and shape.split(",")[0].strip().isdigit():
            return int(shape.split(",")[0])
        size = _ITEM_BYTES.get(str(array.get("dtype")))
        try:
            raw = base64.b64decode(array["bdata"], validate=True)
        except ValueError:
            return None
        return None if size is None else len(raw) // size
    if isinstance(array, str | bytes | dict) or array is None:
        return None
    try:
        return len(array)  # type: ignore[arg-type]
    except TypeError:
        return None
