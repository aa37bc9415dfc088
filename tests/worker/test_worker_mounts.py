"""Mounts end to end: a real worker, a real S3-compatible server, real HTTP."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import WorkerProcess, start_worker
from tests.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Server
from tests.wire import Bundle, execute, read_bundle, run_ok


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
        env={"STRATA_NOTEBOOK_MOUNT_CACHE_DIR": str(cache), **_credentials(s3)},
    )  # fmt: skip
    yield w, s3
    w.stop()


def _credentials(s3: S3Server) -> dict[str, str]:
    """The worker's own way to *s3*, in both of s3fs's spellings: ``moto`` (the ``s3``
    default) names the endpoint in ``client_kwargs``, ``moto-top`` at the top level (its
    ``client_kwargs`` replace the default's whole, endpoint included)."""
    environ = s3.credential_environ("moto")
    named = json.loads(environ["STRATA_NOTEBOOK_CREDENTIALS"])
    named["moto-top"] = {"endpoint_url": s3.endpoint_url, "key": ACCESS_KEY, "secret": SECRET_KEY,
                         "client_kwargs": {"region_name": REGION}}  # fmt: skip
    return {**environ, "STRATA_NOTEBOOK_CREDENTIALS": json.dumps(named)}


def _mount(s3: S3Server, uri: str, mode: str = "ro", name: str = "data") -> dict[str, object]:
    """A mount of *s3*: the worker reaches it by its own credential (the scheme default)."""
    return {"name": name, "uri": uri, "mode": mode}


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
        probe = c.post(
            "/v1/mount-cache/cached", json={"mounts": [{"spec": mounts[0], "entries": []}]}
        )
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
        bundle = run_ok(
            c,
            "(results / 'new.txt').write_text('fresh')\nold = (results / 'keep.txt').read_text()",
            mounts=mounts,
        )
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


# a request's options that would send the worker's signed requests (or its network position)
# to a host of the request's choosing, or pick another identity on the worker's machine
ATTACKS = {
    "endpoint_url": lambda url: {"endpoint_url": url},
    "client_kwargs": lambda url: {"client_kwargs": {"endpoint_url": url}},
    "config_kwargs": lambda url: {"config_kwargs": {"proxies": {"http": url, "https": url}}},
    "key": lambda url: {"key": "attacker-key-id", "secret": "attacker-secret", "endpoint_url": url},
    "token": lambda url: {"token": "attacker-session-token", "endpoint_url": url},
    "profile": lambda url: {"profile": "default", "endpoint_url": url},
}


@pytest.fixture(scope="module")
def attacker() -> Iterator[S3Server]:
    """A second S3-compatible server: where a hostile request wants the worker to go."""
    with S3Server() as server:
        yield server


@pytest.mark.parametrize("credential", [None, "moto-top"])
@pytest.mark.parametrize("mode", ["ro", "rw"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_requests_options_never_send_the_workers_identity_elsewhere(
    mounted: tuple[WorkerProcess, S3Server],
    attacker: S3Server,
    attack: str,
    mode: str,
    credential: str | None,
) -> None:
    """Before a request's options were allow-listed none of these was refused: most reached
    *attacker* under one of the worker's credential spellings (its bucket listed, or staged,
    with the worker's signature; or the store reached through it as a proxy), and the rest
    failed later, in the store's client, as a 502."""
    worker, s3 = mounted
    bucket = attacker.make_bucket({"d/planted.txt": b"the attacker's"})  # a store that answers
    s3.make_bucket()  # the worker's own store is in use too
    already = attacker.requests_so_far()
    options = ATTACKS[attack](attacker.endpoint_url)
    mount = {"name": "data", "uri": f"s3://{bucket}/d", "mode": mode, "options": options,
             "credential": credential}  # fmt: skip
    meta = {"protocol_version": "notebook-cell-v1", "source": "x = 1", "inputs": {},
            "mounts": [mount]}  # fmt: skip
    with httpx.Client(base_url=worker.url, timeout=120) as c:
        responses = [
            execute(c, "x = 1", mounts=[mount]),
            execute(c, "", route="/v1/notebook-execute", metadata=meta),
        ]
    assert attacker.requests_so_far() == already  # nothing of the worker's reached it
    for response in responses:
        assert response.status_code == 400, response.text
        detail = response.json()["detail"]
        assert detail.startswith(f"Mount 'data' option '{attack}' may not be set by a request")
        assert attacker.endpoint_url not in detail


@pytest.mark.parametrize("kind", ["link", "file", "fifo"])
def test_a_mount_folder_the_cell_replaced_is_a_cell_error_and_syncs_nothing(
    mounted: tuple[WorkerProcess, S3Server], tmp_path: Path, kind: str
) -> None:
    """A read-write mount's copy replaced (after writing to it): nothing is synced back,
    nothing is read or written through a link, and the cell fails saying what it broke; a
    read-only mount's view replaced costs nothing and is a line in stderr."""
    worker, s3 = mounted
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.txt").write_text("not the cell's")
    bucket = s3.make_bucket({"out/keep.txt": b"old", "in/a.txt": b"a"})
    mounts = [
        _mount(s3, f"s3://{bucket}/out", mode="rw", name="results"),
        _mount(s3, f"s3://{bucket}/in", name="data"),
    ]
    source = (
        "import os, shutil\n(results / 'new.txt').write_text('fresh')\n"
        "for folder in (results, data):\n"
        "    shutil.rmtree(folder)\n"
        f"    if {kind!r} == 'link':\n        os.symlink({str(elsewhere)!r}, folder)\n"
        f"    elif {kind!r} == 'file':\n        folder.write_text('planted')\n"
        "    else:\n        os.mkfifo(folder)\n"
    )
    with httpx.Client(base_url=worker.url, timeout=120) as c:
        bundle = read_bundle(execute(c, source, mounts=mounts))
    assert bundle.manifest["success"] is False
    assert "read-write mount 'results' could not be synced back" in bundle.manifest["error"]
    assert "[strata-kernel-worker] The cell replaced mounts/data/ " in bundle.stderr()
    keys = {o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]}
    assert keys == {"out/keep.txt", "in/a.txt"}
    assert [p.name for p in elsewhere.iterdir()] == ["secret.txt"]
    assert not [name for name, data in bundle.members.items() if b"not the cell's" in data]
