"""What a cell sent is kept as it is, or its failure said: never silently made into something
else. A binary display format that holds no base64 stays the text it came as, and a value
that cannot be stored is a per-variable error, never an empty table.
"""

from __future__ import annotations

import base64
import io
import json

import httpx
import pytest
from PIL import Image

from kernel_worker.agent import codecs
from kernel_worker.agent.display_files import base64_bytes
from kernel_worker.runs.display_files import _mime_bytes
from tests.conftest import WorkerProcess
from tests.wire import execute, read_bundle


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (3, 2), "red").save(buffer, format="PNG")
    return buffer.getvalue()


# text that Python's lenient base64 decoding turns into bytes: it drops what is not in
# the alphabet (spaces, punctuation) and decodes the rest
NOT_BASE64 = ["just some text", "<em>note</em>", "ÿ-text-ÿ!"]


@pytest.mark.parametrize("text", NOT_BASE64)
def test_a_binary_format_that_holds_no_base64_is_kept_as_its_text(text: str) -> None:
    assert base64_bytes(text) is None
    assert _mime_bytes("image/png", text) == text.encode()


def test_base64_with_line_breaks_still_decodes() -> None:
    png = _png()
    wrapped = base64.encodebytes(png).decode("ascii")  # 76 columns, and a final line break
    assert "\n" in wrapped
    assert base64_bytes(wrapped) == png
    assert _mime_bytes("image/png", wrapped) == png
    assert _mime_bytes("image/png", base64.b64encode(png).decode()) == png


def test_a_display_of_text_as_png_keeps_the_text(worker: WorkerProcess) -> None:
    """Through a worker: the display's file holds the text the cell sent, byte for byte."""
    sent = {"image/png": NOT_BASE64[0], "image/jpeg": base64.b64encode(_png()).decode()}
    source = f"from IPython.display import display\ndisplay({json.dumps(sent)}, raw=True)"
    with httpx.Client(base_url=worker.url, timeout=60) as client:
        bundle = read_bundle(execute(client, source))
    assert bundle.manifest["success"] is True, bundle.manifest["error"]
    files = {d["content_type"]: bundle.members[d["file"]] for d in bundle.manifest["display"]}
    assert files["image/png"] == NOT_BASE64[0].encode()
    assert files["image/jpeg"] == _png()


# -- a value whose Arrow table cannot be built ------------------------------------------

UNSHOWABLE = """
import pandas as pd

class Unshowable:
    def __str__(self):
        raise RuntimeError("no text for this one")
    __repr__ = __str__

frame = pd.DataFrame({"a": [Unshowable(), 1]})
kept = 1
"""


def test_a_frame_that_neither_arrow_nor_the_json_table_takes_is_an_error(
    tmp_path: object,
) -> None:
    namespace: dict[str, object] = {}
    exec(UNSHOWABLE, namespace)
    meta = codecs.serialize("frame", namespace["frame"], str(tmp_path))
    assert meta.get("type") == "DataFrame" and "no text for this one" in str(meta.get("error"))
    assert "file" not in meta


def test_through_a_worker_the_variable_fails_and_the_cell_goes_on(worker: WorkerProcess) -> None:
    with httpx.Client(base_url=worker.url, timeout=60) as client:
        bundle = read_bundle(execute(client, UNSHOWABLE))
    frame = bundle.variables["frame"]
    assert "no text for this one" in frame.get("error", ""), frame
    assert "file" not in frame and "rows" not in frame
    assert bundle.variables["kept"]["preview"] == 1
