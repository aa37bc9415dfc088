"""A display reaches Strata in a form it shows: Markdown or PNG where the value has one.

Strata's notebook shows a display as Markdown, an image, a table or its preview's text,
never as HTML. An HTML display that also has a Markdown or a PNG form is sent as that form;
a bundle displayed raw (plotly's ``fig.show()``) is recorded when it holds one; a plotly
figure without an image exporter becomes a Markdown summary of its traces. Jupyter's own
view (``display[]``) keeps every format as the kernel sent it.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.conftest import WorkerProcess
from tests.wire import Bundle, execute, read_bundle, run_ok

INTEROP_PYTHON = os.environ.get("STRATA_INTEROP_PYTHON")
CHECK = Path(__file__).parents[1] / "interop" / "reference_bundle_check.py"


@pytest.fixture(scope="module")
def client(worker: WorkerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=worker.url, timeout=120) as c:
        yield c


def _png_base64(size: tuple[int, int] = (3, 2)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, "red").save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _shown(bundle: Bundle) -> list[dict[str, Any]]:
    return list(bundle.manifest["displays"])


def _jupyter_types(bundle: Bundle) -> set[str]:
    return {d["content_type"] for d in bundle.manifest["display"]}


# -- HTML with another form, and without -----------------------------------------------------

HTML_AND_FORMS = f"""
class Both:
    def _repr_html_(self):
        return '<b>both</b>'
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {{'text/html': '<b>both</b>', 'text/markdown': '**both**'}}

class Picture:
    def _repr_html_(self):
        return '<img>'
    def _repr_markdown_(self):
        return None  # no Markdown form after all
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {{'text/html': '<img>', 'image/png': {_png_base64()!r}}}, {{}}

display(Both())
display(Picture())
"""


def test_html_with_a_markdown_or_png_form_is_sent_as_that_form(client: httpx.Client) -> None:
    bundle = run_ok(client, HTML_AND_FORMS)
    markdown, png = _shown(bundle)
    assert markdown["content_type"] == "text/markdown"
    assert markdown["markdown_text"] == "**both**"
    assert bundle.members[markdown["file"]] == b"**both**"
    assert png["content_type"] == "image/png"
    assert (png["width"], png["height"]) == (3, 2)
    assert png["inline_data_url"] == "data:image/png;base64," + _png_base64()
    assert {"text/html", "text/markdown", "image/png"} <= _jupyter_types(bundle)


def test_html_alone_stays_a_value_with_its_html_in_jupyters_view(client: httpx.Client) -> None:
    source = "from IPython.display import HTML\ndisplay(HTML('<b>only html</b>'))\ndel HTML"
    bundle = run_ok(client, source)
    [entry] = _shown(bundle)
    assert entry["content_type"] == "pickle/object" and entry["preview"] == "<HTML object>"
    html = next(d for d in bundle.manifest["display"] if d["content_type"] == "text/html")
    assert bundle.members[html["file"]] == b"<b>only html</b>"


# -- raw bundles -------------------------------------------------------------------------------


def test_a_raw_bundle_with_a_form_strata_shows_is_a_display(client: httpx.Client) -> None:
    source = (
        "from IPython.display import display as shown\n"
        "shown({'text/html': '<i>md</i>', 'text/markdown': '*md*'}, raw=True)\n"
        "shown({'text/html': '<i>html only</i>'}, raw=True)\n"
        f"shown({{'image/png': {_png_base64((5, 4))!r}, 'text/plain': 'a picture'}}, raw=True)\n"
        "shown({'text/plain': 'no form'}, raw=True)\n"
        "del shown\n"
    )
    bundle = run_ok(client, source)
    kinds = [(d["content_type"], d.get("markdown_text")) for d in _shown(bundle)]
    assert kinds == [("text/markdown", "*md*"), ("image/png", None)]
    assert (_shown(bundle)[1]["width"], _shown(bundle)[1]["height"]) == (5, 4)
    # every raw display still reaches Jupyter's view, one output each
    assert len({d["index"] for d in bundle.manifest["display"]}) == 4


def test_raw_bundles_follow_updates_and_clears(client: httpx.Client) -> None:
    source = (
        "from IPython.display import display as shown, update_display, clear_output\n"
        "shown({'text/markdown': 'gone'}, raw=True)\n"
        "clear_output()\n"
        "shown({'text/markdown': 'first'}, raw=True, display_id='d')\n"
        "update_display({'text/markdown': 'second'}, raw=True, display_id='d')\n"
        "del shown, update_display, clear_output\n"
    )
    bundle = run_ok(client, source)
    assert [d.get("markdown_text") for d in _shown(bundle)] == ["second"]


# -- plotly ---------------------------------------------------------------------------------

PLOTLY_FIGURE = (
    "import plotly.graph_objects as go\n"
    "fig = go.Figure(go.Scatter(x=[1, 2, 3, 4], y=[1, 4, 9, 16], name='squares'))\n"
    "fig.add_trace(go.Bar(x=['a', 'b'], y=[3, 1]))\n"
    "fig.update_layout(title='Growth | 2024')\n"
)


def _assert_plotly_summary(entry: dict[str, Any]) -> None:
    assert entry["content_type"] == "text/markdown", entry
    text = entry["markdown_text"]
    assert text.startswith("**Plotly figure**: Growth \\| 2024\n")
    assert "| squares | scatter | 4 |" in text and "| 1 | bar | 2 |" in text


def test_plotly_show_is_a_markdown_summary_not_an_error(client: httpx.Client) -> None:
    response = execute(client, PLOTLY_FIGURE + "fig.show()\nkept = 1\ndel go, fig\n")
    bundle = read_bundle(response)
    assert bundle.manifest["success"] is True, bundle.manifest["error"]
    assert bundle.stderr() == ""
    [entry] = _shown(bundle)
    _assert_plotly_summary(entry)
    assert "application/vnd.plotly.v1+json" in _jupyter_types(bundle)  # Jupyter's view keeps it


def test_a_plotly_figure_as_the_last_expression_is_shown_once(client: httpx.Client) -> None:
    bundle = run_ok(client, PLOTLY_FIGURE + "del go\nfig")
    [entry] = _shown(bundle)  # the displayhook's raw bundle is not a second display
    _assert_plotly_summary(entry)
    assert bundle.variables["_"]["content_type"] == "text/markdown"
    assert bundle.variables["fig"]["content_type"] == "pickle/object"
    plotly = [d for d in bundle.manifest["display"] if "plotly" in d["content_type"]]
    assert [d["output_type"] for d in plotly] == ["display_data"]  # as Jupyter shows it


def test_display_of_a_plotly_figure_is_one_display(client: httpx.Client) -> None:
    bundle = run_ok(client, PLOTLY_FIGURE + "display(fig)\ndel go, fig\n")
    [entry] = _shown(bundle)
    _assert_plotly_summary(entry)


# -- through Strata's own bundle reader ------------------------------------------------------


@pytest.mark.interop
@pytest.mark.skipif(not INTEROP_PYTHON, reason="STRATA_INTEROP_PYTHON is not set")
def test_strata_reads_these_displays_as_ones_it_shows(client: httpx.Client, tmp_path: Path) -> None:
    source = HTML_AND_FORMS + PLOTLY_FIGURE + "fig.show()\ndel go, fig\n"
    response = execute(client, source)
    assert response.status_code == 200, response.text
    path = tmp_path / "bundle.tar.gz"
    path.write_bytes(response.content)
    (tmp_path / "expected.json").write_text("{}")
    assert INTEROP_PYTHON is not None
    checked = subprocess.run(
        [INTEROP_PYTHON, str(CHECK), str(path), str(tmp_path / "out"), str(tmp_path / "expected.json")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    displays = json.loads(checked.stdout)["result"]["displays"]
    assert [d["content_type"] for d in displays] == ["text/markdown", "image/png", "text/markdown"]
    # each as Strata's model of a display output holds it, with what its view renders
    model = (
        "import json, sys\n"
        "from strata.notebook.models import CellOutput\n"
        "for d in json.load(sys.stdin):\n"
        "    o = CellOutput.model_validate(d)\n"
        "    print(o.content_type, bool(o.markdown_text), bool(o.inline_data_url))\n"
    )
    shown = subprocess.run(
        [INTEROP_PYTHON, "-c", model], input=json.dumps(displays),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        "text/markdown True False",
        "image/png False True",
        "text/markdown True False",
    ]
    for entry in displays:
        assert (tmp_path / "out" / entry["file"]).is_file()
