"""A shown figure is drawn once per run: the reference's display and Jupyter's ``image/png``
output are the same image, re-rendered only when the figure changed after it was shown."""

from __future__ import annotations

import io
from collections.abc import Iterator

import httpx
import pytest
from matplotlib.figure import Figure
from PIL import Image

from kernel_worker.agent import figures
from tests.conftest import WorkerProcess
from tests.wire import Bundle, run_ok


@pytest.fixture(scope="module")
def client(worker: WorkerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=worker.url, timeout=120) as c:
        yield c


def _pngs(bundle: Bundle) -> tuple[list[bytes], list[bytes]]:
    """The reference's display images, and Jupyter's ``image/png`` outputs, in order."""
    manifest = bundle.manifest
    shown = [bundle.members[d["file"]] for d in manifest["displays"]]
    jupyter = [
        bundle.members[d["file"]] for d in manifest["display"] if d["content_type"] == "image/png"
    ]
    return shown, jupyter


def _size(png: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(png)) as image:
        return image.size


def test_a_render_is_kept_while_the_figure_is_unchanged() -> None:
    fig = Figure()
    ax = fig.subplots()
    draws: list[object] = []
    fig.canvas.mpl_connect("draw_event", draws.append)
    try:
        ax.plot([1, 2, 3])
        first = figures.figure_png(fig)
        assert figures.figure_png(fig) is first and len(draws) == 1
        ax.set_title("changed")  # any artist change marks the figure stale
        second = figures.figure_png(fig)
        assert second != first and len(draws) == 2
        figures.forget_renders()
        assert figures.figure_png(fig) == second and len(draws) == 3  # a new run draws anew
    finally:
        figures.forget_renders()


def test_both_displays_of_a_shown_figure_are_one_image(client: httpx.Client) -> None:
    source = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3, 4], [1, 4, 9, 16])\n"
        "plt.show()\n"
        "del plt\n"
    )
    shown, jupyter = _pngs(run_ok(client, source))
    assert len(shown) == 1 and jupyter == shown  # the same bytes: drawn once
    assert _size(shown[0]) == (640, 480)  # figsize x dpi, as the reference renders it


def test_a_figure_changed_after_it_was_shown_is_drawn_again(client: httpx.Client) -> None:
    source = (
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\n"
        "ax.plot([1, 2, 3])\n"
        "display(fig)\n"
        "ax.set_title('final')\n"
        "display(fig)\n"
        "plt.close(fig)\n"
        "del plt, fig, ax\n"
    )
    shown, jupyter = _pngs(run_ok(client, source))
    assert len(jupyter) == 2 and jupyter[0] != jupyter[1]  # Jupyter's: a snapshot each time
    assert shown == [jupyter[1], jupyter[1]]  # the reference's: the figure as the cell left it


def test_a_users_inline_printer_settings_are_kept(client: httpx.Client) -> None:
    source = (
        "import matplotlib.pyplot as plt\n"
        "get_ipython().run_line_magic('config', "
        "\"InlineBackend.print_figure_kwargs = {'bbox_inches': None, 'dpi': 50}\")\n"
        "try:\n"
        "    plt.plot([1, 2, 3])\n"
        "    plt.show()\n"
        "finally:\n"
        "    get_ipython().run_line_magic('config', "
        "\"InlineBackend.print_figure_kwargs = {'bbox_inches': 'tight'}\")\n"
        "del plt\n"
    )
    shown, jupyter = _pngs(run_ok(client, source))
    assert _size(jupyter[0]) == (320, 240)  # the user's dpi for Jupyter's output
    assert _size(shown[0]) == (640, 480)  # the reference's display is savefig's, as before
