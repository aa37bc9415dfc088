"""The bundle plan from plain data: which members a bundle takes, the level it is written at,
and a stored bundle's length, decided once before any byte is written."""

from __future__ import annotations

import dataclasses
import io
import os
import tarfile
from pathlib import Path

import pytest

from kernel_worker.protocol.bundle import (
    ALWAYS_COMPRESS_BYTES,
    COMPRESS_UP_TO_BYTES,
    DEFLATE_LEVEL,
    BundlePlan,
    FoundFile,
    PlannedMember,
    choose_level,
    plan_bundle,
)
from kernel_worker.protocol.manifest import wanted_members
from tests.unit.test_bundle import outcome

ROOT = Path("/nonexistent-run")  # a plan from plain data never reads its root


def found(sizes: dict[str, int]) -> dict[str, FoundFile]:
    """``{member: size}`` as found in a run directory, each a file of its own."""
    return {name: FoundFile(size, (1, inode)) for inode, (name, size) in enumerate(sizes.items())}


def test_the_members_follow_member_order_and_leave_out_what_was_not_found() -> None:
    files = found({"files/x.json": 1, "files/f.pickle": 9, "display/1.html": 5})
    plan = BundlePlan.of(ROOT, outcome(), files, compresslevel=DEFLATE_LEVEL)
    assert [m.name for m in plan.members] == ["files/x.json", "files/f.pickle", "display/1.html"]
    assert [m.size for m in plan.members] == [1, 9, 5]
    assert "display/0.png" in wanted_members(outcome())  # referred to, but not there
    assert plan.payload == len("hi ✓\n") + len("warn\n") + 15


def test_a_display_file_that_is_a_variable_s_file_is_stored_once() -> None:
    files = found({"files/x.json": 4, "display/0.png": 4})
    files["display/0.png"] = files["files/x.json"]  # one inode: a hard link
    plan = BundlePlan.of(ROOT, outcome(), files, compresslevel=DEFLATE_LEVEL)
    assert plan.members[-1] == PlannedMember("display/0.png", 4, stored_in="files/x.json")
    assert b'"file": "files/x.json"' in plan.manifest
    assert b'"display/0.png"' not in plan.manifest


def test_the_manifest_is_decided_with_the_plan() -> None:
    plan = BundlePlan.of(ROOT, outcome(), found({"files/x.json": 1}), compresslevel=DEFLATE_LEVEL)
    assert b'"f": {"error": "The output file of variable' in plan.manifest


@pytest.mark.parametrize("level", [1, DEFLATE_LEVEL, 9])
def test_only_a_stored_bundle_knows_its_length(level: int) -> None:
    plan = BundlePlan.of(ROOT, outcome(), found({"files/x.json": 1}), compresslevel=level)
    assert plan.length is None
    stored = BundlePlan.of(ROOT, outcome(), found({"files/x.json": 1}), compresslevel=0)
    assert stored.length is not None and stored.length > 0


def test_the_level_is_chosen_by_size_before_any_sample() -> None:
    def never() -> bytes:
        raise AssertionError("the size decides: no sample is read")

    assert choose_level(ALWAYS_COMPRESS_BYTES, never) == DEFLATE_LEVEL
    assert choose_level(COMPRESS_UP_TO_BYTES + 1, never) == 0


def test_between_the_sizes_a_sample_decides() -> None:
    payload = ALWAYS_COMPRESS_BYTES + 1
    assert choose_level(payload, lambda: b"abc" * 5000) == DEFLATE_LEVEL
    assert choose_level(payload, lambda: os.urandom(16 * 1024)) == 0
    assert choose_level(payload, lambda: b"") == DEFLATE_LEVEL  # nothing to measure


def test_the_sample_comes_from_the_largest_member() -> None:
    sampled: list[str] = []

    def sample(member: PlannedMember) -> bytes:
        sampled.append(member.name)
        return os.urandom(1024)

    files = found({"files/x.json": 10, "files/f.pickle": 200_000, "display/1.html": 30})
    plan = BundlePlan.of(ROOT, outcome(), files, sample=sample)
    assert sampled == ["files/f.pickle"]
    assert plan.compresslevel == 0
    assert plan.length is not None


def test_a_plan_is_written_as_planned(tmp_path: Path) -> None:
    """From a run directory: the stored length is what is written, and every writing of
    the plan gives the same bytes."""
    (tmp_path / "files").mkdir()
    (tmp_path / "display").mkdir()
    (tmp_path / "files" / "x.json").write_bytes(b"2")
    (tmp_path / "display" / "1.html").write_bytes(b"<b>")
    for level in (0, DEFLATE_LEVEL):
        plan = plan_bundle(tmp_path, outcome(), level)
        out = io.BytesIO()
        assert plan.write(out) == len(out.getvalue())
        assert plan.to_bytes() == out.getvalue()
        if level == 0:
            assert plan.length == len(out.getvalue())
        with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
            assert tar.getnames()[-1] == "manifest.json"
            assert {"files/x.json", "display/1.html"} <= set(tar.getnames())


def test_a_member_changed_after_planning_is_an_error_not_a_bundle_that_lies(
    tmp_path: Path,
) -> None:
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "x.json").write_bytes(b"1234")
    plan = plan_bundle(tmp_path, dataclasses.replace(outcome(), mime_displays=[]), 0)
    (tmp_path / "files" / "x.json").write_bytes(b"1")
    with pytest.raises(OSError, match="unexpected end of data"):
        plan.write(io.BytesIO())
