"""What a cell displays: recorded for the reference's display view, as a notebook's output
area keeps them (``display``, ``update_display``, ``clear_output``), and shown as the
reference's plain process would (``Figure.show``, ``plt.show``, rich, ``Markdown``).

The displays are recorded on the run in progress (``run_state``); ``outputs`` writes them.
Stdlib only at import time; IPython and matplotlib are patched when present.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import warnings
from typing import Any

from . import display_forms, tracebacks
from .run_state import current, state


def display(*objs: Any, **kwargs: Any) -> Any:
    """IPython's ``display`` that also records the objects for the reference's display view,
    as a notebook's output area keeps them: ``update_display`` (or a handle's ``update``)
    replaces the display of that id, ``clear_output`` (or ``clear=True``) drops those before."""
    if any(_is_rich_print(obj) for obj in objs):
        objs = _printed_as_text(objs)
        if not objs:
            return None
    run = current()
    raw = kwargs.get("raw")
    if run is None or not run.recording or (raw and run.formatting):
        return state["display"](*objs, **kwargs)
    shown = _raw_shown(objs) if raw else [obj for obj in objs if obj is not None]
    if kwargs.get("display_id") is True:  # as IPython names it, but known here
        kwargs["display_id"] = os.urandom(16).hex()
    display_id = kwargs.get("display_id")
    if kwargs.get("update"):
        for index in run.display_ids.get(str(display_id), ()):
            if shown:
                run.displays[index] = shown[0]
        return state["display"](*objs, **kwargs)
    if kwargs.pop("clear", False):  # IPython's own would mark a clear still to come
        run.clear_pending = True
        state["clear_output"](True)
    _apply_pending_clear(run)
    if display_id is not None:
        first = len(run.displays)
        run.display_ids.setdefault(str(display_id), []).extend(range(first, first + len(shown)))
    run.displays.extend(shown)
    return state["display"](*objs, **kwargs)


def _raw_shown(bundles: Any) -> list[Any]:
    """The raw bundles (``display(bundle, raw=True)``, as ``fig.show()`` of plotly sends) that
    hold a form Strata shows, as display values; the others only reach Jupyter's view."""
    return [
        display_forms.RawDisplay(bundle)
        for bundle in bundles
        if isinstance(bundle, dict) and display_forms.bundle_has_shown_form(bundle)
    ]


def clear_output(wait: bool = False) -> Any:
    """IPython's ``clear_output``: the displays shown so far leave the display view too (at
    once, or with ``wait=True`` when the next display comes)."""
    run = current()
    if run is not None and run.recording:
        run.clear_pending = True
        if not wait:
            _apply_pending_clear(run)
    return state["clear_output"](wait)


def _apply_pending_clear(run: Any) -> None:
    if run.clear_pending:
        run.clear_pending = False
        run.displays.clear()
        run.display_ids.clear()


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def _is_rich_print(obj: Any) -> Any:
    kind = type(obj)
    return kind.__name__ == "JupyterRenderable" and kind.__module__ == "rich.jupyter"


def _rich_as_in_a_process(module: Any) -> None:
    """rich takes a kernel for a notebook: it would send what it prints (``rich.print``, a
    ``Console``, a ``RichHandler``) as displays, which Strata cannot show, and a progress bar
    or ``Live`` would want ipywidgets. Here it writes to stdout as in the reference's cell
    process, a plain file: 80 columns, no colours, a progress bar's last state."""
    if callable(getattr(module, "_is_jupyter", None)):
        module._is_jupyter = _not_a_notebook


def _not_a_notebook() -> Any:
    return False


def _printed_as_text(objs: Any) -> Any:
    """What a ``Console(force_jupyter=True)`` sends as a display goes to stdout as text, as in
    the reference's cell process (see :func:`_rich_as_in_a_process`)."""
    kept = []
    for obj in objs:
        text = getattr(obj, "text", None) if _is_rich_print(obj) else None
        if isinstance(text, str):  # styled for a notebook: plain, as rich writes to a pipe
            _unproxied(sys.stdout).write(_ANSI_ESCAPE.sub("", text))
        else:
            kept.append(obj)
    return kept


def _unproxied(stream: Any) -> Any:
    """The stream under rich's stand-ins for ``sys.stdout``: a progress bar or ``Live``
    replaces it with a proxy that prints through its console, which here sends a display,
    which would come back to the proxy forever (the cell would hang until its timeout)."""
    for _ in range(8):
        inner = getattr(type(stream), "rich_proxied_file", None)
        if inner is None:
            break
        stream = stream.rich_proxied_file
    return stream


@dataclasses.dataclass(frozen=True)
class Markdown:
    """The cell's ``Markdown``: text shown as Markdown, as the reference's cell process has it.

    IPython's class of that name reads a file or fetches a URL when the text looks like a
    path or an address; this one only ever holds the text it is given.
    """

    text: str

    def _repr_markdown_(self) -> Any:
        return self.text

    def __str__(self) -> Any:
        return self.text


def patch_display() -> None:
    import IPython.core.display_functions as functions
    import IPython.display as public

    state["display"] = functions.display
    state["clear_output"] = functions.clear_output
    functions.display = display
    public.display = display
    functions.clear_output = public.clear_output = clear_output
    inline: Any = sys.modules.get("matplotlib_inline.backend_inline")
    if inline is not None:
        inline.display = display


def _show_figure(figure: Any, warn: bool = True) -> Any:
    """``Figure.show()`` during a cell: the figure is displayed (recorded, as in the
    reference, and sent as IPython's display); a headless backend would show nothing."""
    run = current()
    if run is not None and run.recording:
        display(figure)
        return None
    return state["figure_show"](figure, warn=warn)


def quiet_formatting(shell: Any) -> None:
    """Formatting a display never fails the cell, and a format method that returns the wrong
    type leaves no warning in its stderr: that display just lacks the format (see
    ``tracebacks.quiet``)."""
    from IPython.core.formatters import FormatterWarning

    formatter = shell.display_formatter
    format_ = formatter.format

    def format(obj: Any, include: Any = None, exclude: Any = None) -> Any:
        run = current()
        if run is not None:  # what formatting displays raw is that value's display, not one more
            run.formatting += 1
        try:
            with tracebacks.quiet(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FormatterWarning)
                return format_(obj, include=include, exclude=exclude)
        finally:
            if run is not None:
                run.formatting -= 1

    formatter.format = format


def _patch_figure(module: Any) -> None:
    figure: Any = getattr(module, "Figure", None)
    show = getattr(figure, "show", None)
    if show is None or show is _show_figure:
        return
    state["figure_show"] = show
    figure.show = _show_figure


def _show_pyplot(*args: Any, **kwargs: Any) -> Any:
    """``plt.show()`` during a cell: every open figure is displayed, whatever the backend,
    and stays open, as in the reference (a second ``plt.show()`` shows them again). The
    inline backend's own ``show`` would close them, so it is not called; its end-of-cell
    flush then has nothing new to show unless the cell draws again."""
    run = current()
    pyplot = sys.modules.get("matplotlib.pyplot")
    if run is not None and run.recording and pyplot is not None:
        for number in pyplot.get_fignums():
            display(pyplot.figure(number))
        inline_show = getattr(sys.modules.get("matplotlib_inline.backend_inline"), "show", None)
        if inline_show is not None and _inline_backend():
            inline_show._draw_called = False  # shown: the end-of-cell flush leaves them
            inline_show._to_draw = []
        return None
    return state["pyplot_show"](*args, **kwargs)


def _inline_backend() -> Any:
    """Whether the inline backend is matplotlib's (read raw: reading ``rcParams["backend"]``
    would make matplotlib choose one now)."""
    params = getattr(sys.modules.get("matplotlib"), "rcParams", {})
    backend = dict.get(params, "backend", "") if isinstance(params, dict) else ""
    return "matplotlib_inline" in str(backend)


def _patch_pyplot(module: Any) -> None:
    show = getattr(module, "show", None)
    if show is None or show is _show_pyplot:
        return
    state["pyplot_show"] = show
    module.show = _show_pyplot


def patch_figure_show(pool: Any) -> None:
    """``Figure.show`` and ``pyplot.show`` patched now, or the moment a cell imports their
    modules (the pool's in-kernel code watches imports: ``pool``, a :class:`~.host.PoolHooks`)."""
    pool.after_import("matplotlib.figure", _patch_figure)
    pool.after_import("matplotlib.pyplot", _patch_pyplot)
    pool.after_import("matplotlib_inline.backend_inline", _keep_figures_open)
    pool.after_import("rich.console", _rich_as_in_a_process)


def stop_recording() -> None:
    """``post_execute`` runs before the inline backend flushes figures nobody showed."""
    run = current()
    if run is not None:
        run.recording = False


def _keep_figures_open(module: Any) -> None:
    """The inline backend shows the figures nobody showed at the end of a cell and would
    then close them all, before the cell's outputs are serialized: a figure that is an output
    would be pickled detached from pyplot (read back without its Agg canvas, and unknown to
    a later ``plt.show()``), where the reference's cell process leaves figures open. Here
    they stay open until the reset closes them."""
    config = sys.modules.get("matplotlib_inline.config")
    backend = getattr(config, "InlineBackend", None)
    if backend is not None:
        backend.instance().close_figures = False
