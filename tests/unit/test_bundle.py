"""The output bundle: members, both manifests in one, stream readers, and hostile run dirs."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from kernel_worker.protocol.bundle import (
    CellOutcome,
    MimeDisplay,
    build_manifest,
    bundle_bytes,
    stored_bundle_length,
    write_bundle,
)
from tests.wire import check_seed_index, stream_members

X_META = {"content_type": "json/object", "file": "x.json", "bytes": 1, "preview": 2}
REAL_KEYS = {
    "schema_version",
    "success",
    "variables",
    "displays",
    "stdout_file",
    "stderr_file",
    "error",
    "traceback",
    "mutation_warnings",
    "build_env",
    "hardware",
    "output_dirs",
}
SEED_KEYS = {"protocol_version", "executor_ref", "duration_ms", "outputs", "display", "console"}


def outcome(**changes: Any) -> CellOutcome:
    base = CellOutcome(
        success=True,
        variables={
            "x": X_META,
            "_": X_META,
            "f": {"content_type": "pickle/object", "file": "f.pickle", "codec": "cloudpickle"},
            "lock": {"error": "cannot pickle '_thread.lock' object", "type": "lock"},
        },
        displays=[X_META],
        mime_displays=[
            MimeDisplay("0.png", "image/png", 0, "display_data"),
            MimeDisplay("0.txt", "text/plain", 0, "display_data"),
            MimeDisplay("1.html", "text/html", 1, "execute_result"),
        ],
        stdout="hi ✓\n",
        stderr="warn\n",
        error=None,
        error_type=None,
        traceback=None,
        mutation_warnings=[{"var_name": "df", "message": "m", "suggestion": "s"}],
        build_env="cpython-3.11-linux-x86_64",
        hardware={"cpus": 2, "memory_mb": 1024},
        duration_ms=42,
    )
    return dataclasses.replace(base, **changes)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "files").mkdir(parents=True)
    (run / "display").mkdir()
    (run / "files" / "x.json").write_bytes(b"2")
    (run / "files" / "f.pickle").write_bytes(b"\x80\x05pickled")
    (run / "display" / "0.png").write_bytes(b"\x89PNG....")
    (run / "display" / "0.txt").write_bytes(b"2")
    (run / "display" / "1.html").write_bytes(b"<b>2</b>")
    return run


def bundle(run_dir: Path, result: CellOutcome) -> tuple[bytes, tarfile.TarFile]:
    buffer = io.BytesIO()
    written = write_bundle(run_dir, result, buffer)
    data = buffer.getvalue()
    assert written == len(data)
    stream_members(data)  # every member whole to a stream reader too
    return data, tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")


def manifest_of(tar: tarfile.TarFile) -> dict[str, Any]:
    extracted = tar.extractfile("manifest.json")
    assert extracted is not None
    raw = extracted.read()
    document: dict[str, Any] = json.loads(raw)
    assert raw.decode() == json.dumps(document, sort_keys=True)  # one line, keys sorted
    return document


def read(tar: tarfile.TarFile, name: str) -> bytes:
    extracted = tar.extractfile(name)
    assert extracted is not None
    return extracted.read()


def test_success_members_in_order(run_dir: Path) -> None:
    data, tar = bundle(run_dir, outcome())
    assert data[:2] == b"\x1f\x8b"
    assert tar.getnames() == [
        "stdout.txt",
        "stderr.txt",
        "console.json",
        "files/x.json",
        "files/f.pickle",
        "display/0.png",
        "display/0.txt",
        "display/1.html",
        "manifest.json",
    ]
    assert read(tar, "stdout.txt").decode() == "hi ✓\n"
    assert read(tar, "stderr.txt") == b"warn\n"
    assert json.loads(read(tar, "console.json")) == {"stdout": "hi ✓\n", "stderr": "warn\n"}
    assert read(tar, "files/f.pickle") == b"\x80\x05pickled"
    assert read(tar, "display/1.html") == b"<b>2</b>"


def test_every_member_is_a_regular_file(run_dir: Path) -> None:
    """No links: a stream reader (tarfile's r|gz, Go's or Node's tar) cannot resolve one."""
    _, tar = bundle(run_dir, outcome())
    assert all(member.isreg() for member in tar.getmembers())


def test_a_seed_reader_finds_each_output_through_the_manifest(run_dir: Path) -> None:
    """The seed page's reader, in one pass over a stream: it keeps the members, then reads
    ``outputs[]`` and ``display[]``, whose files are the members holding the bytes."""
    data, _ = bundle(run_dir, outcome())
    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|gz") as stream:
        for info in stream:
            extracted = stream.extractfile(info)
            assert extracted is not None
            members[info.name] = extracted.read()
    manifest = json.loads(members["manifest.json"])
    outputs = {o["name"]: members[o["file"]] for o in manifest["outputs"]}
    assert outputs == {"_": b"2", "f": b"\x80\x05pickled", "x": b"2"}
    shown = {d["file"]: members[d["file"]] for d in manifest["display"]}
    assert shown["display/0.png"] == b"\x89PNG...."
    check_seed_index(manifest, members)


def test_generated_and_copied_members_are_normalised(run_dir: Path) -> None:
    os.chmod(run_dir / "files" / "x.json", 0o600)
    _, tar = bundle(run_dir, outcome())
    for member in tar.getmembers():
        assert (member.mode, member.uid, member.gid, member.mtime) == (0o644, 0, 0, 0)
        assert (member.uname, member.gname) == ("", "")


def test_bundle_bytes_are_deterministic(run_dir: Path) -> None:
    first, _ = bundle(run_dir, outcome())
    second, _ = bundle(run_dir, outcome())
    assert first == second
    header = gzip.GzipFile(fileobj=io.BytesIO(first))
    header.read()
    assert header.mtime == 0


def test_manifest_has_both_readers_keys(run_dir: Path) -> None:
    _, tar = bundle(run_dir, outcome())
    manifest = manifest_of(tar)
    assert set(manifest) == REAL_KEYS | SEED_KEYS
    assert manifest["schema_version"] == manifest["protocol_version"] == "notebook-output-bundle@v1"
    assert manifest["executor_ref"] == "notebook_cell@v1"
    assert (manifest["stdout_file"], manifest["stderr_file"]) == ("stdout.txt", "stderr.txt")
    assert manifest["console"] == "console.json"
    assert manifest["duration_ms"] == 42
    assert manifest["success"] is True and manifest["error"] is None
    assert manifest["hardware"] == {"cpus": 2, "memory_mb": 1024}
    assert manifest["mutation_warnings"] == [{"var_name": "df", "message": "m", "suggestion": "s"}]
    assert manifest["variables"]["x"] == {**X_META, "file": "files/x.json"}
    assert manifest["variables"]["_"]["file"] == "files/x.json"
    assert manifest["variables"]["lock"] == {
        "error": "cannot pickle '_thread.lock' object",
        "type": "lock",
    }
    assert manifest["displays"] == [{**X_META, "file": "files/x.json"}]
    assert manifest["output_dirs"] == {}
    assert manifest["outputs"] == [
        {"name": "_", "content_type": "json/object", "file": "files/x.json", "bytes": 1},
        {"name": "f", "content_type": "pickle/object", "file": "files/f.pickle", "bytes": 9},
        {"name": "x", "content_type": "json/object", "file": "files/x.json", "bytes": 1},
    ]
    assert manifest["display"] == [
        {
            "file": "display/0.png",
            "content_type": "image/png",
            "bytes": 8,
            "index": 0,
            "output_type": "display_data",
        },
        {
            "file": "display/0.txt",
            "content_type": "text/plain",
            "bytes": 1,
            "index": 0,
            "output_type": "display_data",
        },
        {
            "file": "display/1.html",
            "content_type": "text/html",
            "bytes": 8,
            "index": 1,
            "output_type": "execute_result",
        },
    ]


def test_failure_bundle(run_dir: Path) -> None:
    failed = outcome(
        success=False,
        variables={},
        displays=[],
        mime_displays=[],
        error="model not loaded",
        error_type="RuntimeError",
        traceback="Traceback (most recent call last):\n  ...\nRuntimeError: model not loaded",
        build_env="",
        hardware={},
    )
    _, tar = bundle(run_dir, failed)
    assert tar.getnames() == [
        "stdout.txt",
        "stderr.txt",
        "console.json",
        "error.json",
        "manifest.json",
    ]
    assert json.loads(read(tar, "error.json")) == {
        "type": "RuntimeError",
        "message": "model not loaded",
        "traceback": failed.traceback,
        "exit_code": 1,
    }
    manifest = manifest_of(tar)
    assert manifest["success"] is False
    assert manifest["error"] == "model not loaded"
    assert manifest["traceback"] == failed.traceback
    assert manifest["outputs"] == [] and manifest["display"] == []
    assert "hardware" not in manifest  # as the reference: absent, not an empty machine


def test_failure_without_a_type(run_dir: Path) -> None:
    _, tar = bundle(run_dir, outcome(success=False, error=None, error_type=None, variables={}))
    assert json.loads(read(tar, "error.json")) == {
        "type": "Error",
        "message": "",
        "traceback": "",
        "exit_code": 1,
    }


def test_output_dirs(run_dir: Path) -> None:
    folder = run_dir / "dirs" / "ckpt"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.bin").write_bytes(b"m" * 1000)
    (folder / "sub" / "log.txt").write_bytes(b"log")
    (folder / "evil").symlink_to("/etc/passwd")
    dirs = {
        "ckpt": {"model.bin": 1, "sub/log.txt": 3, "gone.txt": 9, "evil": 5, "../up": 1},
        "not-an-identifier": {"a": 1},
        "empty": {},
    }
    _, tar = bundle(run_dir, outcome(output_dirs=dirs))
    names = tar.getnames()
    assert names.index("dirs/ckpt/model.bin") < names.index("files/x.json")
    assert [n for n in names if n.startswith("dirs/")] == [
        "dirs/ckpt/model.bin",
        "dirs/ckpt/sub/log.txt",
    ]
    # Sizes are what was written, not what the outcome claimed.
    assert manifest_of(tar)["output_dirs"] == {
        "ckpt": {"model.bin": 1000, "sub/log.txt": 3},
        "empty": {},
    }


def test_each_file_once(run_dir: Path) -> None:
    shared = {"content_type": "json/object", "file": "x.json"}
    _, tar = bundle(run_dir, outcome(variables={"x": shared, "y": shared, "_": shared}))
    names = tar.getnames()
    assert names.count("files/x.json") == 1
    assert {o["file"] for o in manifest_of(tar)["outputs"]} == {"files/x.json"}


@pytest.mark.parametrize("kind", ["missing", "symlink", "fifo", "directory"])
def test_unsafe_or_missing_file_becomes_an_error_entry(run_dir: Path, kind: str) -> None:
    target = run_dir / "files" / "bad.json"
    if kind == "symlink":
        target.symlink_to("/etc/hostname")
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    variables = {"x": X_META, "bad": {"content_type": "json/object", "file": "bad.json"}}
    _, tar = bundle(run_dir, outcome(variables=variables))
    assert "files/bad.json" not in tar.getnames()
    assert manifest_of(tar)["variables"]["bad"] == {
        "error": "The output file of variable 'bad' was not produced",
        "type": "MissingOutputFile",
    }


def test_symlinked_files_directory_is_not_followed(run_dir: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "x.json").write_bytes(b"secret")
    for child in (run_dir / "files").iterdir():
        child.unlink()
    (run_dir / "files").rmdir()
    (run_dir / "files").symlink_to(secret)
    _, tar = bundle(run_dir, outcome())
    assert not [n for n in tar.getnames() if n.startswith("files/")]
    assert "error" in manifest_of(tar)["variables"]["x"]


def test_missing_mime_file_is_left_out(run_dir: Path) -> None:
    (run_dir / "display" / "0.txt").unlink()
    _, tar = bundle(run_dir, outcome())
    assert "display/0.txt" not in tar.getnames()
    assert [d["file"] for d in manifest_of(tar)["display"]] == ["display/0.png", "display/1.html"]


def test_large_file_is_streamed_whole(run_dir: Path) -> None:
    content = os.urandom(5_000_000)
    (run_dir / "files" / "big.pickle").write_bytes(content)
    variables = {"big": {"content_type": "pickle/object", "file": "big.pickle"}}
    _, tar = bundle(run_dir, outcome(variables=variables, displays=[]))
    assert read(tar, "files/big.pickle") == content


def test_compresslevel(run_dir: Path) -> None:
    (run_dir / "files" / "x.json").write_bytes(b"0" * 100_000)
    fast, best = io.BytesIO(), io.BytesIO()
    write_bundle(run_dir, outcome(), fast, compresslevel=0)
    write_bundle(run_dir, outcome(), best, compresslevel=9)
    assert len(best.getvalue()) < len(fast.getvalue())


# ---- build_manifest (pure) -----------------------------------------------------------


def test_build_manifest_rewrites_to_basenames() -> None:
    result = outcome(
        variables={"x": {"content_type": "json/object", "file": "deep/x.json"}},
        displays=[{"content_type": "json/object", "file": "x.json"}, {"content_type": "none"}],
        mime_displays=[],
    )
    manifest = build_manifest(result, {"files/x.json": 7})
    assert manifest["variables"] == {"x": {"content_type": "json/object", "file": "files/x.json"}}
    assert manifest["displays"] == [
        {"content_type": "json/object", "file": "files/x.json"},
        {"content_type": "none"},  # a display without a file passes through
    ]
    assert manifest["outputs"] == [
        {"name": "x", "content_type": "json/object", "file": "files/x.json", "bytes": 7}
    ]


@pytest.mark.parametrize("file", [None, "", ".", "..", "a\\b", "x\x00", 5, "dir/"])
def test_build_manifest_unusable_file_names(file: object) -> None:
    variables = {"v": {"content_type": "pickle/object", "file": file, "type": "Thing"}}
    manifest = build_manifest(outcome(variables=variables, displays=[]), {"files/v": 1})
    assert manifest["variables"] == {
        "v": {"error": "The output file of variable 'v' was not produced", "type": "Thing"}
    }
    assert manifest["outputs"] == []


def test_build_manifest_missing_display_file() -> None:
    displays = [{"content_type": "image/png", "file": "__display__0.png"}]
    manifest = build_manifest(outcome(variables={}, displays=displays), {})
    assert manifest["displays"] == [
        {"error": "The output file of display 0 was not produced", "type": "MissingOutputFile"}
    ]


@pytest.mark.parametrize("level", [1, 0])
def test_in_memory_bundle_holds_the_same_tar(run_dir: Path, level: int) -> None:
    """Small bundles are built in memory and deflated in one call: the same tar inside."""
    streamed = io.BytesIO()
    write_bundle(run_dir, outcome(), streamed, compresslevel=level)
    in_memory = bundle_bytes(run_dir, outcome(), compresslevel=level)
    assert gzip.decompress(in_memory) == gzip.decompress(streamed.getvalue())
    assert in_memory[:2] == b"\x1f\x8b" and in_memory[8] == (4 if level == 1 else 0)


@pytest.mark.parametrize(
    "shape", ["in-memory deflated", "in-memory stored", "streamed deflated", "streamed stored"]
)
def test_every_shape_reads_as_a_stream(run_dir: Path, shape: str) -> None:
    """Small bundles built in memory and large ones written while sent, deflated or stored,
    each with a large output, an output folder and a name that needs a PAX header: every
    member is whole to tarfile's stream mode and to tar reading a pipe."""
    big = os.urandom(2 * 0xFFFF + 3)
    (run_dir / "files" / "big.bin").write_bytes(big)
    folder = run_dir / "dirs" / "ckpt"
    folder.mkdir(parents=True)
    (folder / ("long-name-" * 12 + ".bin")).write_bytes(b"m" * 700)
    variables = {**outcome().variables, "big": {"content_type": "pickle/object", "file": "big.bin"}}
    result = outcome(variables=variables, output_dirs={"ckpt": {"long-name-" * 12 + ".bin": 0}})
    level = 0 if shape.endswith("stored") else 2
    if shape.startswith("in-memory"):
        data = bundle_bytes(run_dir, result, compresslevel=level)
    else:
        out = io.BytesIO()
        write_bundle(run_dir, result, out, compresslevel=level)
        data = out.getvalue()
    members = stream_members(data)
    manifest = json.loads(members["manifest.json"])
    check_seed_index(manifest, members)
    assert members[manifest["variables"]["big"]["file"]] == big
    assert members["dirs/ckpt/" + "long-name-" * 12 + ".bin"] == b"m" * 700


def test_a_stored_bundles_length_is_known_before_it_is_written(run_dir: Path) -> None:
    """What the response announces up front is exactly what write_bundle then writes."""
    (run_dir / "files" / "big.bin").write_bytes(os.urandom(3 * 0xFFFF + 11))
    folder = run_dir / "dirs" / "ckpt"
    folder.mkdir(parents=True)
    (folder / ("long-name-" * 12 + ".bin")).write_bytes(b"m" * 700)  # a PAX header
    variables = {
        "x": {"content_type": "json/object", "file": "x.json"},
        "big": {"content_type": "pickle/object", "file": "big.bin"},
        "gone": {"content_type": "json/object", "file": "missing.json"},
    }
    dirs = {"ckpt": {"long-name-" * 12 + ".bin": 700}}
    for case in (outcome(), outcome(variables=variables, output_dirs=dirs), outcome(success=False)):
        written = io.BytesIO()
        write_bundle(run_dir, case, written, compresslevel=0)
        assert stored_bundle_length(run_dir, case) == len(written.getvalue())


def _strict(raw: bytes) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(raw, parse_constant=refuse)


def test_non_finite_previews_are_written_as_null(run_dir: Path) -> None:
    """The reference's harness writes NaN and infinite previews as null: NaN is not JSON."""
    nan = float("nan")
    odd = {**X_META, "preview": {"a": nan, "b": [1.0, float("inf"), -float("inf")], "c": (nan,)}}
    _, tar = bundle(run_dir, outcome(variables={"x": odd, "_": odd}, displays=[odd]))
    manifest = _strict(read(tar, "manifest.json"))
    assert manifest["variables"]["x"]["preview"] == {"a": None, "b": [1.0, None, None], "c": [None]}
    assert manifest["displays"][0]["preview"]["a"] is None
    assert read(tar, "files/x.json") == b"2"  # the file itself is the cell's, untouched


def test_the_stream_check_refuses_a_hard_link() -> None:
    """The check every test's bundles go through fails on the layout stream readers cannot
    read: a hard link, which they hand back empty (or, as tarfile's r|gz, refuse)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("files/x.json")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"2"))
        link = tarfile.TarInfo("outputs/x.json")
        link.type, link.linkname = tarfile.LNKTYPE, "files/x.json"
        tar.addfile(link)
    with pytest.raises(AssertionError, match=r"outputs/x\.json is not a regular file"):
        stream_members(raw.getvalue())


def test_a_display_file_that_is_a_files_member_is_stored_once(run_dir: Path) -> None:
    """The agent makes a reference display's file and the same Jupyter image one file (a hard
    link): the image is stored once, and its ``display[]`` entry names the ``files/`` member.
    A display file linked to an output folder's file is stored itself (only ``files/`` holds
    what ``display[]`` may name)."""
    image = b"\x89PNG" + os.urandom(50_000)
    (run_dir / "files" / "__display__0.png").write_bytes(image)
    os.link(run_dir / "files" / "__display__0.png", run_dir / "display" / "s0.png")
    (run_dir / "dirs" / "out").mkdir(parents=True)
    (run_dir / "dirs" / "out" / "a.bin").write_bytes(b"folder file")
    os.link(run_dir / "dirs" / "out" / "a.bin", run_dir / "display" / "s1.bin")
    result = outcome(
        displays=[{"content_type": "image/png", "file": "__display__0.png", "bytes": len(image)}],
        mime_displays=[
            MimeDisplay("s0.png", "image/png", 0, "display_data"),
            MimeDisplay("s1.bin", "application/octet-stream", 1, "display_data"),
        ],
        output_dirs={"out": {"a.bin": 11}},
    )
    data, tar = bundle(run_dir, result)
    assert "display/s0.png" not in tar.getnames() and "display/s1.bin" in tar.getnames()
    assert len(data) < len(image) + 20_000  # the image once (deflate cannot shrink it)
    assert list(stream_members(bundle_bytes(run_dir, result))) == tar.getnames()
    stored = bundle_bytes(run_dir, result, compresslevel=0)
    assert len(stored) == stored_bundle_length(run_dir, result)  # measured as it is written
    manifest = manifest_of(tar)
    shown = [(d["file"], d["bytes"]) for d in manifest["display"]]
    assert shown == [("files/__display__0.png", len(image)), ("display/s1.bin", 11)]
    check_seed_index(manifest, {name: read(tar, name) for name in tar.getnames()})


def test_a_dropped_display_is_marked_in_its_entry(run_dir: Path) -> None:
    dropped = {"bytes": 9_000_000, "cap": 8_000_000, "limit": "--max-display-bytes"}
    result = outcome(mime_displays=[MimeDisplay("0.txt", "text/plain", 0, "display_data", dropped)])
    _, tar = bundle(run_dir, result)
    [entry] = manifest_of(tar)["display"]
    assert entry["file"] == "display/0.txt" and entry["dropped"] == dropped
