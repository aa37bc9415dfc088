"""Streaming multipart bodies (as httpx encodes them) into a run directory, and binding."""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernel_worker.errors import BadRequest, PayloadTooLarge
from kernel_worker.http import staging
from kernel_worker.http.staging import StagedForm, bind_inputs, stage_multipart
from kernel_worker.protocol.envelopes import parse_execute_v1

METADATA = json.dumps({"transform": {"ref": "notebook_cell@v1"}}).encode()
FileSpec = tuple[str, tuple[str, bytes, str]]


def encode(files: list[FileSpec], data: dict[str, str] | None = None) -> tuple[bytes, str]:
    """A multipart body and its content type, exactly as httpx (the real client) sends."""
    request = httpx.Request("POST", "http://worker/v1/execute", files=files, data=data)
    return request.read(), request.headers["content-type"]


def part(field: str, content: bytes, filename: str | None = None) -> FileSpec:
    return (field, (filename or field, content, "application/octet-stream"))


def meta(content: bytes = METADATA) -> FileSpec:
    return ("metadata", ("metadata.json", content, "application/json"))


class Body:
    """Feeds a body in chunks whose sizes come from *size*; records how much was read."""

    def __init__(self, body: bytes, size: Callable[[], int]) -> None:
        self.body = body
        self.size = size
        self.consumed = 0

    async def chunks(self) -> AsyncIterator[bytes]:
        while self.consumed < len(self.body):
            n = max(1, self.size())
            chunk = self.body[self.consumed : self.consumed + n]
            self.consumed += len(chunk)
            yield chunk


def fixed(n: int) -> Callable[[], int]:
    return lambda: n


def randomly(low: int, high: int, seed: int = 7) -> Callable[[], int]:
    rng = random.Random(seed)
    return lambda: rng.randint(low, high)


async def stage(
    body: bytes,
    content_type: str,
    inputs_dir: Path,
    size: Callable[[], int] | None = None,
    **kw: Any,
) -> StagedForm:
    kw.setdefault("max_part_bytes", 1 << 30)
    feeder = Body(body, size or fixed(4096))
    return await stage_multipart(feeder.chunks(), content_type, inputs_dir, **kw)


async def detail_of(body: bytes, content_type: str, inputs_dir: Path, **kw: Any) -> str:
    with pytest.raises(BadRequest) as info:
        await stage(body, content_type, inputs_dir, **kw)
    return info.value.detail


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def same_file(a: Path, b: Path) -> bool:
    return os.path.samefile(a, b)


def contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


@pytest.fixture
def inputs_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run" / "inputs"
    path.mkdir(parents=True)
    return path


# ---- streaming -----------------------------------------------------------------------

PAYLOAD = random.Random(1).randbytes(200_000)
TRICKY = b"--\r\n--boundary\r\n\r\n--" * 50 + b"\r\n"


@pytest.mark.parametrize(
    "size",
    [fixed(1), fixed(3), randomly(1, 100), randomly(1, 70_000, seed=3), fixed(1 << 24)],
    ids=["1-byte", "3-bytes", "random-small", "random-large", "whole"],
)
@pytest.mark.parametrize("direct", [False, True], ids=["batched", "direct"])
async def test_stages_every_part(inputs_dir: Path, size: Callable[[], int], direct: bool) -> None:
    body, content_type = encode(
        [meta(), part("df.arrow", PAYLOAD), part("empty.json", b""), part("t.bin", TRICKY)]
    )
    staged = await stage(body, content_type, inputs_dir, size, direct=direct)
    assert staged.metadata == METADATA
    assert list(staged.parts) == ["df.arrow", "empty.json", "t.bin"]
    assert [p.name for p in staged.parts.values()] == ["__part_0001", "__part_0002", "__part_0003"]
    assert all(p.parent == inputs_dir for p in staged.parts.values())
    assert staged.parts["df.arrow"].read_bytes() == PAYLOAD
    assert staged.parts["empty.json"].read_bytes() == b""
    assert staged.parts["t.bin"].read_bytes() == TRICKY
    assert tree(inputs_dir) == ["__part_0001", "__part_0002", "__part_0003"]


async def test_large_part_is_written_in_batches_off_the_event_loop(
    inputs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[tuple[int, bool]] = []
    perform = staging._Write.perform
    loop_thread = threading.get_ident()

    def spy(self: staging._Write) -> None:
        writes.append((len(self.data), threading.get_ident() == loop_thread))
        perform(self)

    monkeypatch.setattr(staging._Write, "perform", spy)
    content = random.Random(2).randbytes(14_000_000)
    body, content_type = encode([meta(), part("big.bin", content)])
    staged = await stage(body, content_type, inputs_dir, fixed(65_536))
    assert staged.parts["big.bin"].read_bytes() == content
    assert len(writes) >= 3
    assert max(n for n, _ in writes) <= staging._FLUSH_BYTES + 65_536
    assert not any(on_loop for _, on_loop in writes)


@pytest.mark.parametrize("direct", [False, True], ids=["batched", "direct"])
async def test_part_over_the_cap_stops_the_read(inputs_dir: Path, direct: bool) -> None:
    body, content_type = encode(
        [
            meta(),
            part("ok.bin", b"x" * 100),
            part("big.bin", b"y" * 5_000),
            part("z", b"z" * 50_000),
        ]
    )
    feeder = Body(body, fixed(100))
    with pytest.raises(PayloadTooLarge) as info:
        await stage_multipart(
            feeder.chunks(), content_type, inputs_dir, max_part_bytes=1_000, direct=direct
        )
    assert info.value.detail == "Input 'big.bin' exceeds the 1000-byte cap"
    assert feeder.consumed < body.index(b"y" * 5_000) + 1_200
    # What was written stays for the caller to remove with the directory.
    assert (inputs_dir / "__part_0001").read_bytes() == b"x" * 100


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_direct_mode_writes_as_data_arrives_and_closes_every_file(
    inputs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a memory filesystem: no batches, no thread; nothing left open, even when cut short."""
    monkeypatch.setattr(staging._Write, "perform", lambda self: pytest.fail("a batch was used"))
    content = random.Random(2).randbytes(3_000_000)
    body, content_type = encode([meta(), part("big.bin", content), part("b.bin", b"b" * 10)])
    before = open_fds()
    staged = await stage(body, content_type, inputs_dir, fixed(65_536), direct=True)
    assert staged.parts["big.bin"].read_bytes() == content
    assert staged.parts["b.bin"].read_bytes() == b"b" * 10
    assert open_fds() == before
    # cut short in the middle of a part: its file is closed all the same
    other = inputs_dir.parent / "other"
    other.mkdir()
    with pytest.raises(BadRequest):
        await stage(body[: len(body) // 2], content_type, other, fixed(65_536), direct=True)
    assert open_fds() == before
    assert 0 < (other / "__part_0001").stat().st_size < len(content)


async def test_part_exactly_at_the_cap(inputs_dir: Path) -> None:
    body, content_type = encode([meta(), part("a.bin", b"a" * 1_000)])
    staged = await stage(body, content_type, inputs_dir, fixed(7), max_part_bytes=1_000)
    assert staged.parts["a.bin"].stat().st_size == 1_000


async def test_metadata_over_its_cap(inputs_dir: Path) -> None:
    body, content_type = encode([meta(b"{" + b" " * 100 + b"}")])
    with pytest.raises(PayloadTooLarge) as info:
        await stage(body, content_type, inputs_dir, max_metadata_bytes=50)
    assert info.value.detail == "The metadata part exceeds the 50-byte cap"


async def test_metadata_is_not_capped_by_the_part_cap(inputs_dir: Path) -> None:
    body, content_type = encode([meta()])
    staged = await stage(body, content_type, inputs_dir, max_part_bytes=1)
    assert staged.metadata == METADATA


async def test_epilogue_is_ignored(inputs_dir: Path) -> None:
    body, content_type = encode([meta(), part("a", b"1")])
    staged = await stage(body + b"\r\n" + b"e" * 200_000, content_type, inputs_dir)
    assert staged.parts["a"].read_bytes() == b"1"


# ---- refusals ------------------------------------------------------------------------


async def test_missing_metadata(inputs_dir: Path) -> None:
    body, content_type = encode([part("df.arrow", b"1")])
    assert await detail_of(body, content_type, inputs_dir) == "Missing metadata"


async def test_metadata_must_be_a_file_part(inputs_dir: Path) -> None:
    body, content_type = encode([part("df.arrow", b"1")], data={"metadata": "{}"})
    assert await detail_of(body, content_type, inputs_dir) == "Missing metadata"


async def test_inputs_must_be_file_parts(inputs_dir: Path) -> None:
    body, content_type = encode([meta()], data={"x": "1"})
    assert await detail_of(body, content_type, inputs_dir) == (
        "Form field 'x' must be a file part (it has no filename)"
    )


@pytest.mark.parametrize("field", ["df.arrow", "metadata"])
async def test_duplicate_field(inputs_dir: Path, field: str) -> None:
    files = [meta(), part("df.arrow", b"1"), part(field, b"2")]
    body, content_type = encode(files)
    assert await detail_of(body, content_type, inputs_dir) == f"Duplicate form field {field!r}"


@pytest.mark.parametrize(
    ("content_type", "detail"),
    [
        (
            "application/json",
            "Expected a multipart/form-data body, got content type 'application/json'",
        ),
        ("", "Expected a multipart/form-data body, got content type 'none'"),
        (
            "multipart/mixed; boundary=x",
            "Expected a multipart/form-data body, got content type 'multipart/mixed'",
        ),
        ("multipart/form-data", "The multipart/form-data content type has no boundary"),
        ("multipart/form-data; boundary=", "The multipart/form-data content type has no boundary"),
    ],
)
async def test_content_type_refusals(inputs_dir: Path, content_type: str, detail: str) -> None:
    body, _ = encode([meta()])
    assert await detail_of(body, content_type, inputs_dir) == detail


async def test_boundary_too_long(inputs_dir: Path) -> None:
    content_type = "multipart/form-data; boundary=" + "b" * 300
    detail = await detail_of(b"", content_type, inputs_dir)
    assert detail.startswith("Malformed multipart body: Boundary length")


async def test_garbage_body(inputs_dir: Path) -> None:
    _, content_type = encode([meta()])
    detail = await detail_of(b"this is not multipart at all", content_type, inputs_dir)
    assert detail.startswith("Malformed multipart body: Expected boundary character")


@pytest.mark.parametrize("cut", [3, 10, 200])
async def test_truncated_body(inputs_dir: Path, cut: int) -> None:
    body, content_type = encode([meta(), part("a.bin", b"a" * 150)])
    assert await detail_of(body[:-cut], content_type, inputs_dir) == (
        "Malformed multipart body: it ended before its closing boundary"
    )


async def test_empty_body(inputs_dir: Path) -> None:
    _, content_type = encode([meta()])
    assert await detail_of(b"", content_type, inputs_dir) == (
        "Malformed multipart body: it ended before its closing boundary"
    )


async def test_too_many_parts(inputs_dir: Path) -> None:
    body, content_type = encode([meta(), part("a", b"1"), part("b", b"2")])
    assert await detail_of(body, content_type, inputs_dir, max_parts=2) == (
        "Too many form parts (the limit is 2)"
    )
    assert (await stage(body, content_type, inputs_dir.parent, max_parts=3)).parts


def raw_body(*headers: bytes, content: bytes = b"{}") -> bytes:
    head = b"".join(h + b"\r\n" for h in headers)
    return b"--B\r\n" + head + b"\r\n" + content + b"\r\n--B--\r\n"


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ((b"Content-Type: text/plain",), "A form part has no Content-Disposition header"),
        (
            (b'Content-Disposition: form-data; filename="m.json"',),
            "A form part's Content-Disposition is not form-data with a name",
        ),
        (
            (b'Content-Disposition: attachment; name="metadata"; filename="m"',),
            "A form part's Content-Disposition is not form-data with a name",
        ),
        (
            (b'Content-Disposition: form-data; name="\xff\xfe"; filename="m"',),
            "A form field name is not valid UTF-8",
        ),
    ],
)
async def test_part_header_refusals(
    inputs_dir: Path, headers: tuple[bytes, ...], detail: str
) -> None:
    content_type = "multipart/form-data; boundary=B"
    assert await detail_of(raw_body(*headers), content_type, inputs_dir) == detail


async def test_utf8_field_names(inputs_dir: Path) -> None:
    body, content_type = encode([meta(), part("données.json", b"1")])
    staged = await stage(body, content_type, inputs_dir, fixed(1))
    assert staged.parts["données.json"].read_bytes() == b"1"


async def test_hostile_names_never_leave_the_inputs_dir(tmp_path: Path, inputs_dir: Path) -> None:
    hostile = ["../../evil", "/etc/passwd", "a/../../b", "..", ".", "x\\..\\y", "~root/z"]
    files = [meta()] + [
        part(name, name.encode(), filename=f"../../../{i}/{name}") for i, name in enumerate(hostile)
    ]
    body, content_type = encode(files)
    staged = await stage(body, content_type, inputs_dir, fixed(5))
    assert set(staged.parts) == set(hostile)
    for name, path in staged.parts.items():
        assert path.parent == inputs_dir and path.name.startswith("__part_")
        assert path.read_bytes() == name.encode()
    expected = sorted(f"run/inputs/__part_{i:04d}" for i in range(1, len(hostile) + 1))
    assert tree(tmp_path) == ["run", "run/inputs", *expected]


# ---- binding -------------------------------------------------------------------------


def envelope(inputs: list[dict[str, Any]]) -> bytes:
    return json.dumps({"transform": {"ref": "notebook_cell@v1"}, "inputs": inputs}).encode()


async def staged_form(inputs_dir: Path, parts: dict[str, bytes]) -> StagedForm:
    body, content_type = encode([meta(), *(part(k, v) for k, v in parts.items())])
    return await stage(body, content_type, inputs_dir)


async def test_bind_by_file_then_name_then_name_and_extension(inputs_dir: Path) -> None:
    request = parse_execute_v1(
        envelope(
            [
                {"name": "df", "format": "arrow/ipc", "file": "df.arrow"},
                {"name": "w"},
                {"name": "cfg", "format": "json/object", "file": "Cfg-1234.json"},
                {
                    "name": "helper",
                    "format": "module/cell",
                    "file": "helper.cell_module.json",
                    "injected": {
                        "n": {"content_type": "json/object", "file": "helper__inj__n.json"},
                        "k": {"content_type": "pickle/object", "file": "gone.pickle"},
                    },
                },
            ]
        )
    )
    staged = await staged_form(
        inputs_dir,
        {
            "df.arrow": b"A",
            "w.pickle": b"W",
            "cfg": b"C",
            "helper.cell_module.json": b"H",
            "helper__inj__n.json": b"N",
            "k.pickle": b"K",
        },
    )
    bind_inputs(request, staged, inputs_dir)
    assert contents(inputs_dir) == {
        "df.arrow": b"A",
        "w.pickle": b"W",
        "Cfg-1234.json": b"C",
        "helper.cell_module.json": b"H",
        "__inj_4_0.json": b"N",
        "__inj_4_1.pickle": b"K",
    }


async def test_file_name_is_preferred_over_variable_name(inputs_dir: Path) -> None:
    request = parse_execute_v1(envelope([{"name": "x", "format": "json/object", "file": "x.json"}]))
    staged = await staged_form(inputs_dir, {"x": b"by-name", "x.json": b"by-file"})
    with pytest.raises(BadRequest) as info:
        bind_inputs(request, staged, inputs_dir)
    assert info.value.detail == "Uploaded form parts match no input: 'x'"
    staged = await staged_form(inputs_dir.parent, {"x.json": b"by-file"})
    bind_inputs(request, staged, inputs_dir.parent)
    assert (inputs_dir.parent / "x.json").read_bytes() == b"by-file"


async def test_missing_upload(inputs_dir: Path) -> None:
    request = parse_execute_v1(envelope([{"name": "a"}, {"name": "df", "format": "arrow/ipc"}]))
    staged = await staged_form(inputs_dir, {"a": b"1"})
    with pytest.raises(BadRequest) as info:
        bind_inputs(request, staged, inputs_dir)
    assert info.value.detail == "Missing uploaded input file: df"
    assert tree(inputs_dir) == ["__part_0001"]  # nothing renamed before the check


async def test_missing_injected_upload(inputs_dir: Path) -> None:
    inputs = [{"name": "h", "format": "module/cell", "injected": {"n": {"file": "h__inj__n"}}}]
    staged = await staged_form(inputs_dir, {"h": b"1"})
    with pytest.raises(BadRequest) as info:
        bind_inputs(parse_execute_v1(envelope(inputs)), staged, inputs_dir)
    assert info.value.detail == "Missing uploaded input file: n"


async def test_unreferenced_parts_are_refused(inputs_dir: Path) -> None:
    request = parse_execute_v1(envelope([{"name": "a"}]))
    staged = await staged_form(inputs_dir, {"a": b"1", "zz.bin": b"2", "b.bin": b"3"})
    with pytest.raises(BadRequest) as info:
        bind_inputs(request, staged, inputs_dir)
    assert info.value.detail == "Uploaded form parts match no input: 'b.bin', 'zz.bin'"
    assert tree(inputs_dir) == ["__part_0001", "__part_0002", "__part_0003"]


async def test_many_unreferenced_parts_are_summarised(inputs_dir: Path) -> None:
    staged = await staged_form(inputs_dir, {f"p{i:02d}": b"" for i in range(13)})
    with pytest.raises(BadRequest) as info:
        bind_inputs(parse_execute_v1(envelope([])), staged, inputs_dir)
    assert info.value.detail.endswith("'p09' and 3 more")


async def test_one_upload_named_by_two_inputs(inputs_dir: Path) -> None:
    inputs: list[dict[str, Any]] = [
        {"name": "n", "format": "json/object", "file": "n.json"},
        {
            "name": "h",
            "format": "module/cell",
            "file": "h.cell_module.json",
            "injected": {"n": {"content_type": "json/object", "file": "n.json"}},
        },
    ]
    staged = await staged_form(inputs_dir, {"n.json": b"5", "h.cell_module.json": b"{}"})
    bind_inputs(parse_execute_v1(envelope(inputs)), staged, inputs_dir)
    assert contents(inputs_dir) == {
        "n.json": b"5",
        "__inj_2_0.json": b"5",
        "h.cell_module.json": b"{}",
    }
    assert same_file(inputs_dir / "n.json", inputs_dir / "__inj_2_0.json")


async def test_taken_file_name_is_refused_before_any_rename(inputs_dir: Path) -> None:
    (inputs_dir / "files").mkdir()
    inputs = [{"name": "a"}, {"name": "b", "file": "files"}]
    staged = await staged_form(inputs_dir, {"a": b"1", "files": b"2"})
    with pytest.raises(BadRequest) as info:
        bind_inputs(parse_execute_v1(envelope(inputs)), staged, inputs_dir)
    assert info.value.detail == "Input file name 'files' is already taken in the run directory"
    assert tree(inputs_dir) == ["__part_0001", "__part_0002", "files"]


async def test_cancelled_staging_leaves_no_write_behind(
    inputs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release = threading.Event(), threading.Event()
    perform = staging._Write.perform

    def slow(self: staging._Write) -> None:
        started.set()
        release.wait(5)
        perform(self)

    monkeypatch.setattr(staging._Write, "perform", slow)
    body, content_type = encode([meta(), part("a.bin", b"a" * 10)])
    task = asyncio.ensure_future(stage(body, content_type, inputs_dir, fixed(len(body) - 40)))
    await asyncio.to_thread(started.wait, 5)
    task.cancel()
    await asyncio.sleep(0)
    assert not task.done()  # the batch in flight is waited for, not abandoned
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tree(inputs_dir) == ["__part_0001"]
