"""Which form of a display goes to Strata (``agent.display_forms``), on plain values."""

from __future__ import annotations

import base64
import io
import tomllib
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
import pytest
from PIL import Image

from kernel_worker.agent import codecs, display_forms
from kernel_worker.agent.display_forms import RawDisplay, shown_form


def _png(size: tuple[int, int] = (2, 2)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, "blue").save(buffer, format="PNG")
    return buffer.getvalue()


class _HtmlAndPng:
    def _repr_html_(self) -> str:
        return "<img>"

    def _repr_markdown_(self) -> None:
        return None

    def _repr_png_(self) -> bytes:
        return _png()


class _BrokenBundle:
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        raise RuntimeError("no bundle")


class _Everything:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: "# anything"


@pytest.fixture(autouse=True)
def _forms_forgotten() -> Any:
    yield
    display_forms.forget_forms()


class _Counted:
    def __init__(self) -> None:
        self.calls = 0

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        self.calls += 1
        return {"text/markdown": f"call {self.calls}"}


def test_a_form_is_made_once_per_run(tmp_path: Path) -> None:
    value = _Counted()
    assert codecs.detect_content_type(value, for_display=True) == "text/markdown"
    meta = codecs.serialize("__display__0", value, str(tmp_path), for_display=True)
    assert meta["markdown_text"] == "call 1" and value.calls == 1
    display_forms.forget_forms()  # the run ended: the next one asks again
    assert shown_form(value) == ("text/markdown", "call 2")


def test_a_markdown_method_that_returns_none_leaves_the_png() -> None:
    assert shown_form(_HtmlAndPng()) == ("image/png", (_png(), None, None))


def test_no_form_from_classes_proxies_or_a_failing_bundle() -> None:
    assert shown_form(_HtmlAndPng) is None  # the class, not an instance
    assert shown_form(_Everything()) is None  # claims every attribute, as IPython checks
    assert shown_form(_BrokenBundle()) is None
    assert shown_form(RawDisplay({"text/html": "<b>x</b>"})) is None


def test_a_bundle_png_must_be_a_png() -> None:
    assert shown_form(RawDisplay({"image/png": "just some text"})) is None
    png = base64.b64encode(_png()).decode()
    assert shown_form(RawDisplay({"image/png": png})) == ("image/png", (_png(), None, None))
    assert display_forms.bundle_has_shown_form({"image/png": png})
    assert not display_forms.bundle_has_shown_form({"image/png": "text", "text/html": "<p>"})


def test_markdown_comes_before_png_in_a_bundle(tmp_path: Path) -> None:
    bundle = {"image/png": base64.b64encode(_png()).decode(), "text/markdown": "*m*"}
    meta = codecs.serialize("__display__0", RawDisplay(bundle), str(tmp_path), for_display=True)
    assert meta["content_type"] == "text/markdown" and meta["markdown_text"] == "*m*"
    assert codecs.detect_content_type(RawDisplay(bundle), for_display=True) == "text/markdown"


def _figure() -> go.Figure:
    figure = go.Figure(go.Scatter(x=list(range(7)), y=list(range(7)), name="a|b"))
    figure.update_layout(title={"text": "Title"})
    return figure


def test_a_plotly_figure_without_an_exporter_is_a_summary() -> None:
    form = shown_form(_figure())
    assert form is not None and form[0] == "text/markdown"
    lines = form[1].splitlines()
    assert lines[0] == "**Plotly figure**: Title"
    assert lines[4] == "| a\\|b | scatter | 7 |"


def test_typed_arrays_and_many_traces_in_a_summary() -> None:
    typed = {"dtype": "f8", "bdata": base64.b64encode(bytes(8 * 5)).decode()}
    traces = [{"type": "scatter", "y": typed}] + [{"type": "bar", "x": [1]}] * 21
    text = display_forms.plotly_summary({"data": traces, "layout": {}})
    assert text.splitlines()[0] == "**Plotly figure**"
    assert "| 0 | scatter | 5 |" in text and "| … 2 more | | |" in text


def test_a_plotly_figure_is_a_png_where_plotly_can_export_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    exported: list[Any] = []

    def to_image(figure: Any, format: str) -> bytes:
        exported.append((figure, format))
        return _png((7, 5))

    monkeypatch.setattr(display_forms, "_kaleido_installed", lambda: True)
    monkeypatch.setattr(pio, "to_image", to_image)
    shown = {"application/vnd.plotly.v1+json": _figure().to_dict() | {"config": {}}}
    meta = codecs.serialize("__display__0", RawDisplay(shown), str(tmp_path), for_display=True)
    assert meta["content_type"] == "image/png" and (meta["width"], meta["height"]) == (7, 5)
    assert exported[0][1] == "png" and set(exported[0][0]) == {"data", "layout"}

    def no_browser(figure: Any, format: str) -> bytes:
        raise RuntimeError("Kaleido requires Google Chrome to be installed.")

    monkeypatch.setattr(pio, "to_image", no_browser)
    assert codecs.detect_content_type(_figure(), for_display=True) == "text/markdown"


def test_the_notebook_extra_has_what_rich_display_needs_and_dev_spells_it_out() -> None:
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    notebook = set(extras["notebook"])
    assert "nbformat>=5.9" in notebook  # plotly's fig.show() refuses to run without it
    dev = set(extras["dev"])
    assert notebook <= dev
