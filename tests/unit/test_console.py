"""The console as the worker keeps it: the cap, the marker, pieces held once, chunked bytes.

Pure: plain strings and outputs, no kernel.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from kernel_pool import STREAM_DROPPED_MSG_TYPE, Output
from kernel_worker.protocol.bundle import (
    CellOutcome,
    bundle_bytes,
    stored_bundle_length,
    write_bundle,
)
from kernel_worker.runs import console
from kernel_worker.runs.console import ConsoleBuffer, ConsoleText, truncation_marker
from kernel_worker.runs.messages import OutputReducer

# text that escapes and encodes every way there is: multi-byte and astral characters, a
# lone surrogate (written as "?"), quotes, backslashes, control and line separator characters
AWKWARD = 'a"\\\n\t\x00\x1f é€😀\ud800\u2028z'


def _old_console(text: str, cap: int) -> str:
    """What the worker's console was before: the first ``cap`` characters, then a marker."""
    kept, dropped = text[:cap], max(len(text) - cap, 0)
    return kept + (f"\n[output truncated: {dropped} more characters not kept]\n" if dropped else "")


@pytest.mark.parametrize("cap", [0, 1, 5, 7, 100])
def test_kept_text_and_marker_are_as_before(cap: int) -> None:
    writes = ["ab", "", "cde", "f" * 3, "ghij"]
    buffer = ConsoleBuffer(cap)
    kept = [buffer.add(piece) for piece in writes]
    whole = "".join(writes)
    assert str(buffer.text()) == _old_console(whole, cap)
    assert "".join(kept) == whole[:cap]  # what a live listener is given
    assert buffer.size == min(cap, len(whole))


def test_what_the_kernel_dropped_counts_toward_the_marker() -> None:
    buffer = ConsoleBuffer(4)
    buffer.add("abcdef")  # 2 past the cap here
    buffer.drop(1000)  # and 1000 the kernel never sent
    assert str(buffer.text()) == "abcd" + truncation_marker(1002)


def test_nothing_dropped_means_no_marker() -> None:
    buffer = ConsoleBuffer(10)
    buffer.add("0123456789")
    assert buffer.text() == ConsoleText(("0123456789",))


def test_a_large_piece_is_held_as_it_came() -> None:
    big = "x" * console.HELD
    buffer = ConsoleBuffer(4 * console.HELD)
    buffer.add("head")
    buffer.add(big)
    pieces = buffer.text().pieces
    assert pieces[0] == "head" and pieces[1] is big  # no copy of the large one


def test_many_tiny_pieces_are_joined_into_few() -> None:
    buffer = ConsoleBuffer(1 << 30)
    for n in range(200_000):
        buffer.add(str(n % 10))
    text = buffer.text()
    assert len(text.pieces) <= 2
    assert str(text) == "".join(str(n % 10) for n in range(200_000))


def test_console_text_is_str_like() -> None:
    text = ConsoleText(("ab", "c")) + "d"
    assert str(text) == "abcd" and len(text) == 4
    assert text + "" is text


def _long_awkward() -> ConsoleText:
    """Pieces of every size around a chunk, cut inside the awkward characters."""
    body = AWKWARD * (console.CHUNK // len(AWKWARD) + 7)
    return ConsoleText((body, body[3:] * 2, "", AWKWARD, body[: console.CHUNK + 1]))


def test_chunks_encode_exactly_as_the_whole_text() -> None:
    text = _long_awkward()
    whole = str(text)
    utf8 = whole.encode("utf-8", "replace")
    assert b"".join(console.utf8_chunks(text)) == utf8
    assert console.utf8_size(text) == len(utf8)
    quoted = json.dumps(whole).encode()
    assert b"".join(console.json_chunks(text)) == quoted
    assert console.json_size(text) == len(quoted)


def test_output_reducer_caps_each_stream_and_tells_only_what_it_kept() -> None:
    heard: list[tuple[str, str]] = []
    reducer = OutputReducer(5, lambda name, text: heard.append((name, text)))
    for name, text in [("stdout", "abc"), ("stderr", "12"), ("stdout", "defg"), ("stdout", "h")]:
        reducer.feed(Output("stream", {"name": name, "text": text}))
    reducer.feed(Output(STREAM_DROPPED_MSG_TYPE, {"stdout": 10, "stderr": 0, "other": 5}))
    assert str(reducer.stdout) == "abcde" + truncation_marker(3 + 10)
    assert str(reducer.stderr) == "12"
    assert heard == [("stdout", "abc"), ("stderr", "12"), ("stdout", "de")]


@pytest.mark.parametrize("content", [{"stdout": -5}, {"stdout": "9"}, {"stdout": True}, {}])
def test_a_malformed_drop_report_counts_nothing(content: dict[str, object]) -> None:
    reducer = OutputReducer(5)
    reducer.feed(Output("stream", {"name": "stdout", "text": "ok"}))
    reducer.feed(Output(STREAM_DROPPED_MSG_TYPE, content))
    assert str(reducer.stdout) == "ok"


def _outcome(stdout: console.Text, stderr: console.Text) -> CellOutcome:
    return CellOutcome(
        success=True, variables={}, displays=[], mime_displays=[], stdout=stdout,
        stderr=stderr, error=None, error_type=None, traceback=None, mutation_warnings=[],
        build_env="", hardware={}, duration_ms=1,
    )  # fmt: skip


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    for folder in ("files", "display"):
        (tmp_path / folder).mkdir()
    return tmp_path


@pytest.mark.parametrize("level", [0, 1])
def test_a_large_console_bundles_to_the_same_bytes_as_one_string(run_dir: Path, level: int) -> None:
    stdout = _long_awkward() + truncation_marker(123)
    stderr = ConsoleText(("warn ", AWKWARD * 3))
    in_pieces = _outcome(stdout, stderr)
    joined = dataclasses.replace(in_pieces, stdout=str(stdout), stderr=str(stderr))
    written, as_before = io.BytesIO(), io.BytesIO()
    write_bundle(run_dir, in_pieces, written, compresslevel=level)
    write_bundle(run_dir, joined, as_before, compresslevel=level)
    in_memory = bundle_bytes(run_dir, in_pieces, compresslevel=level)
    members = gzip.decompress(as_before.getvalue())  # the same members, byte for byte
    assert gzip.decompress(written.getvalue()) == gzip.decompress(in_memory) == members
    if level == 0:  # stored: the same stream too, of the length announced
        assert written.getvalue() == as_before.getvalue()
        assert stored_bundle_length(run_dir, in_pieces) == len(written.getvalue())
    with tarfile.open(fileobj=io.BytesIO(written.getvalue()), mode="r:gz") as tar:
        member = tar.extractfile("console.json")
        assert member is not None
        assert json.loads(member.read()) == {"stdout": str(stdout), "stderr": str(stderr)}


def test_a_small_console_is_written_as_before(run_dir: Path) -> None:
    pieces = _outcome(ConsoleText(("hi ", "✓\n")), ConsoleText(("warn\n",)))
    whole = _outcome("hi ✓\n", "warn\n")
    assert bundle_bytes(run_dir, pieces) == bundle_bytes(run_dir, whole)
