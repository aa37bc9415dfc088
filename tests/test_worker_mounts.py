"""Mounts end to end: a real worker, a real S3-compatible server, real HTTP."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import WorkerProcess, start_worker
from .s3_server import S3Server
from .wire import Bundle, execute, read_bundle, run_ok


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mount-cache")


@pytest.fixture(scope="module")
def mounted(
    tmp_path_factory: pytest.TempPathFactory, s3: S3Server, cache_dir: Path
) -> Iterator[tuple[WorkerProcess, S3Server]]:
    cache = cache_dir
    w = start_worker(
        tmp_path_factory, "--pool-size", "1",
        env={"STRATA_NOTEBOOK_MOUNT_CACHE_DIR": str(cache)},
    )  # fmt: skip
    yield w, s3
    w.stop()


def _mount(s3: S3Server, uri: str, mode: str = "ro", name: str = "data") -> dict[str, object]:
    return {"name": name, "uri": uri, "mode": mode, "options": s3.storage_options()}


def test_read_only_mount_is_a_path_and_cached_across_runs(
    mounted: tuple[WorkerProcess, S3Server],
) -> None:
    worker, s3 = mounted
    bucket = s3.make_bucket({"in/a.csv": b"x,y\n1,2\n", "in/sub/b.txt": b"bee"})
    source = (
        "names = sorted(p.relative_to(data).as_posix() for p in data.rglob('*') if p.is_file())\n"
        "text = (data / 'sub' / 'b.txt').read_text()\nkind = type(data).__name__"
    )
    mounts = [_mount(s3, f"s3://{bucket}/in")]
    with httpx.Client(base_url=worker.url, timeout=120) as c:
        first = run_ok(c, source, mounts=mounts)
        assert first.variables["names"]["preview"] == ["a.csv", "sub/b.txt"]
        assert first.variables["text"]["preview"] == "bee"
        assert "data" not in first.variables
        assert first.manifest["mount_bytes"] == {"data": 11}
        second = run_ok(c, source, mounts=mounts)
        assert second.manifest["mount_bytes"] == {"data": 0}  # served from the cache
        probe = c.post("/v1/mount-cache/cached", json={"mounts": [{"spec": mounts[0], "entries": []}]})
        assert probe.status_code == 200 and len(probe.json()["cached_bytes"]) == 1


def test_pinned_mount_keeps_the_contents_it_was_first_listed_with(
    mounted: tuple[WorkerProcess, S3Server],
) -> None:
    worker, s3 = mounted
    bucket = s3.make_bucket({"snap/a.txt": b"one"})
    source = "names = sorted(p.name for p in data.iterdir())\ntext = (data / 'a.txt').read_text()"
    unpinned = _mount(s3, f"s3://{bucket}/snap")
    pinned = {**unpinned, "pin": "v1"}

    def seen(bundle: Bundle) -> tuple[list[str], str]:
        return bundle.variables["names"]["preview"], bundle.variables["text"]["preview"]

    with httpx.Client(base_url=worker.url, timeout=120) as c:
        assert seen(run_ok(c, source, mounts=[pinned])) == (["a.txt"], "one")
        s3.client().put_object(Bucket=bucket, Key="snap/a.txt", Body=b"two")
        s3.client().put_object(Bucket=bucket, Key="snap/b.txt", Body=b"bee")
        again = run_ok(c, source, mounts=[pinned])
        assert seen(again) == (["a.txt"], "one")  # the pinned snapshot, not re-listed
        assert again.manifest["mount_bytes"] == {"data": 0}
        assert seen(run_ok(c, source, mounts=[unpinned])) == (["a.txt", "b.txt"], "two")
        assert seen(run_ok(c, source, mounts=[{**pinned, "pin": "v2"}])) == (
            ["a.txt", "b.txt"],
            "two",
        )


def test_pinned_listing_that_can_no_longer_be_placed_is_listed_again(
    mounted: tuple[WorkerProcess, S3Server], cache_dir: Path
) -> None:
    worker, s3 = mounted
    bucket = s3.make_bucket({"p/old.txt": b"old"})
    pinned = {**_mount(s3, f"s3://{bucket}/p"), "pin": "release-1"}
    source = "names = sorted(p.name for p in data.iterdir())"
    with httpx.Client(base_url=worker.url, timeout=120) as c:
        assert run_ok(c, source, mounts=[pinned]).variables["names"]["preview"] == ["old.txt"]
        # the store drops the object and the cache is swept: the pinned listing is stale
        s3.client().delete_object(Bucket=bucket, Key="p/old.txt")
        s3.client().put_object(Bucket=bucket, Key="p/new.txt", Body=b"new")
        shutil.rmtree(cache_dir / "blobs")
        failed = execute(c, source, mounts=[pinned])
        assert failed.status_code == 502 and "Mount 'data'" in failed.json()["detail"]
        again = run_ok(c, source, mounts=[pinned])  # listed anew, not stuck failing
        assert again.variables["names"]["preview"] == ["new.txt"]


def test_read_write_mount_syncs_back_only_on_success(
    mounted: tuple[WorkerProcess, S3Server],
) -> None:
    worker, s3 = mounted
    bucket = s3.make_bucket({"out/keep.txt": b"old"})
    mounts = [_mount(s3, f"s3://{bucket}/out", mode="rw", name="results")]
    with httpx.Client(base_url=worker.url, timeout=120) as c:
        failed = read_bundle(execute(
            c, "(results / 'lost.txt').write_text('no')\nraise RuntimeError('stop')", mounts=mounts
        ))  # fmt: skip
        assert failed.manifest["success"] is False
        bundle = run_ok(c, "(results / 'new.txt').write_text('fresh')\nold = (results / 'keep.txt').read_text()", mounts=mounts)
    assert bundle.variables["old"]["preview"] == "old"
    writes = bundle.manifest["mount_writes"]
    assert writes[0]["mount"] == "results"
    assert [f["path"] for f in writes[0]["files"]] == ["new.txt"]
    keys = {o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]}
    assert keys == {"out/keep.txt", "out/new.txt"}


def test_mount_errors_are_clear(mounted: tuple[WorkerProcess, S3Server]) -> None:
    worker, s3 = mounted
    with httpx.Client(base_url=worker.url, timeout=120) as c:
        local = execute(c, "x = 1", mounts=[{"name": "d", "uri": "file:///etc"}])
        assert local.status_code == 400
        assert local.json()["detail"] == "Remote execution does not support file:// mount 'd'"
        missing = execute(c, "x = 1", mounts=[_mount(s3, "s3://no-such-bucket-here/x")])
        assert missing.status_code == 502
        assert "no-such-bucket-here" in missing.json()["detail"]
        # read-write, as the reference: an empty folder; only writing there fails
        unread = _mount(s3, "s3://no-such-bucket-here/x", mode="rw", name="out")
        untouched = read_bundle(execute(c, "seen = sorted(p.name for p in out.iterdir())",
                                        mounts=[unread]))  # fmt: skip
        assert untouched.manifest["success"] and untouched.variables["seen"]["preview"] == []
        written = execute(c, "(out / 'w.txt').write_text('hi')", mounts=[unread])
        assert written.status_code == 502
        assert "no-such-bucket-here" in written.json()["detail"]
