"""Mounts against a real S3-compatible server (moto, on loopback): no mocks of the store."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import fsspec  # type: ignore[import-untyped]
import pytest

from kernel_worker.errors import BadRequest, UpstreamFailed, WorkerError
from kernel_worker.mounts import materialize as mounts
from kernel_worker.mounts.cache import MountCache, Placement, Stopped
from kernel_worker.mounts.materialize import MaterializedMounts, materialize, sync_back
from kernel_worker.mounts.pins import PinnedListings, pin_key
from kernel_worker.mounts.probe import cached_bytes
from kernel_worker.mounts.specs import MountSpec, parse_mounts
from tests.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Server, _free_port

OBJECTS = {
    "data/a.csv": b"x,y\n1,2\n",
    "data/sub/b.txt": b"hello mounts",
    "data/sub/deeper/c.bin": bytes(range(256)) * 8,
    "elsewhere/d.txt": b"not under the prefix",
}
DATA_BYTES = sum(len(body) for key, body in OBJECTS.items() if key.startswith("data/"))


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture
def bucket(s3: S3Server) -> str:
    return s3.make_bucket(OBJECTS)


def make_cache(root: Path, s3: S3Server | None = None, **kwargs: object) -> MountCache:
    """A cache whose ``s3://`` mounts reach *s3* by default, as an operator configures it."""
    options: dict[str, object] = {"max_bytes": 1 << 30, "credentials": {}, "scheme_defaults": {}}
    if s3 is not None:
        options.update(credentials={"moto": s3.storage_options()}, scheme_defaults={"s3": "moto"})
    options.update(kwargs)
    return MountCache(root, **options)  # type: ignore[arg-type]


@pytest.fixture
def cache(s3: S3Server, tmp_path: Path) -> MountCache:
    return make_cache(tmp_path / "cache", s3)


def mount(uri: str, *, name: str = "data", mode: str = "ro", **extra: object) -> MountSpec:
    raw: dict[str, object] = {"name": name, "uri": uri, "mode": mode}
    raw.update(extra)
    (spec,) = parse_mounts([raw])
    return spec


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def file_names(root: Path) -> set[str]:
    return {p.name for p in root.rglob("*")}


def write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def scratch_dir(parent: Path) -> Path:
    """A directory of our own under *parent* (removed by the test)."""
    return Path(tempfile.mkdtemp(prefix="skw-mount-test-", dir=parent))


def other_filesystem(here: Path) -> bool:
    """Whether /dev/shm exists and is another filesystem than *here*'s."""
    shm = Path("/dev/shm")
    return shm.is_dir() and shm.stat().st_dev != here.stat().st_dev


def expected_view(prefix: str = "data/") -> dict[str, bytes]:
    return {k.removeprefix(prefix): v for k, v in OBJECTS.items() if k.startswith(prefix)}


# --- parse_mounts ---------------------------------------------------------------------


def test_parse_applies_the_reference_defaults() -> None:
    (spec,) = parse_mounts([{"name": "raw", "uri": "s3://bucket/prefix", "extra": 1}])
    assert spec == MountSpec("raw", "s3://bucket/prefix", "ro", None, {}, None)
    (spec,) = parse_mounts(
        [{"name": "out", "uri": "s3://b", "mode": "rw", "pin": "v1", "credential": "lab"}]
    )
    assert (spec.mode, spec.pin, spec.credential) == ("rw", "v1", "lab")


@pytest.mark.parametrize(
    ("mounts", "detail"),
    [
        ([{"name": "1x", "uri": "s3://b/p"}], "mount 0 needs a name that is an identifier"),
        ([{"name": "a-b", "uri": "s3://b/p"}], "mount 0 needs a name that is an identifier"),
        ([{"uri": "s3://b/p"}], "mount 0 needs a name that is an identifier"),
        ([{"name": "m"}], "Mount 'm' needs a uri"),
        ([{"name": "m", "uri": ""}], "Mount 'm' needs a uri"),
        ([{"name": "m", "uri": "s3://b", "mode": "RW"}], "Mount 'm' mode must be 'ro' or 'rw'"),
        (
            [{"name": "m", "uri": "file:///etc"}],
            "Remote execution does not support file:// mount 'm'",
        ),
        ([{"name": "m", "uri": "/data/x"}], "Remote execution does not support file:// mount 'm'"),
        ([{"name": "m", "uri": "bucket/x"}], "Remote execution does not support file:// mount 'm'"),
        ([{"name": "m", "uri": "s3:///nobucket"}], "Mount 'm' uri names no bucket"),
        ([{"name": "m", "uri": "s3://b", "options": []}], "Mount 'm' options must be an object"),
        ([{"name": "m", "uri": "s3://b", "pin": 3}], "Mount 'm' pin must be a string or null"),
        (
            [{"name": "m", "uri": "s3://a"}, {"name": "m", "uri": "s3://b"}],
            "Mount name 'm' is used more than once",
        ),
        (["s3://b"], "mount 0 must be an object"),
    ],
)
def test_parse_refuses_bad_specs(mounts: list[Mapping[str, object]], detail: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_mounts(mounts)
    assert caught.value.detail == detail


# what moves where the worker's identity goes: an endpoint, a proxy, a credential, a profile
REFUSED_OPTIONS: list[tuple[str, dict[str, object]]] = [
    ("s3", {"endpoint_url": "http://attacker.example"}),
    ("s3", {"client_kwargs": {"endpoint_url": "http://attacker.example"}}),
    ("s3", {"client_kwargs": {"region_name": "eu-west-1"}}),  # nested: replaces the operator's
    ("s3", {"config_kwargs": {"proxies": {"https": "http://attacker.example:3128"}}}),
    ("s3", {"key": "AKIA-worker-key-id"}),
    ("s3", {"secret": "s3cr3t-value"}),
    ("s3", {"token": "session-token-value"}),
    ("s3", {"profile": "prod"}),
    ("s3", {"username": "someone", "password": "pa55word-value"}),
    ("s3", {"use_ssl": False}),
    ("s3", {"s3_additional_kwargs": {"SSEKMSKeyId": "arn:aws:kms:attacker"}}),
    ("s3", {"session": "a-session-object"}),
    ("s3", {"skip_instance_cache": False}),
    ("gs", {"endpoint_url": "http://attacker.example"}),
    ("gcs", {"session_kwargs": {"proxy": "http://attacker.example"}}),
    ("gs", {"project": "someone-else"}),
    ("gs", {"access": "full_control"}),
    ("az", {"account_name": "attacker"}),
    ("azure", {"account_host": "attacker.example"}),
    ("az", {"sas_token": "sv=2024&sig=abcdef"}),
    ("az", {"connection_string": "BlobEndpoint=http://attacker.example"}),
    ("az", {"credential": "a-token-credential"}),
    ("az", {"client_id": "client-id-value", "client_secret": "client-s3cr3t"}),
]  # fmt: skip


@pytest.mark.parametrize(("scheme", "options"), REFUSED_OPTIONS)
def test_parse_refuses_options_that_move_the_workers_identity(
    scheme: str, options: dict[str, object]
) -> None:
    raw = {"name": "m", "uri": f"{scheme}://bucket/x", "options": options}
    with pytest.raises(BadRequest) as caught:
        parse_mounts([raw])
    first = next(iter(options))
    assert caught.value.detail.startswith(f"Mount 'm' option '{first}' may not be set by a request")
    assert "STRATA_NOTEBOOK_CREDENTIALS" in caught.value.detail
    assert not [v for v in options.values() if str(v) in caught.value.detail]  # may be secret


@pytest.mark.parametrize(
    ("scheme", "options", "detail"),
    [
        ("s3", {"anon": "yes"}, "Mount 'm' option 'anon' must be true or false"),
        ("s3", {"requester_pays": 1}, "Mount 'm' option 'requester_pays' must be true or false"),
        ("gs", {"token": "google_default"}, "Mount 'm' option 'token' must be 'anon'"),
        ("gs", {"token": {"type": "service_account"}}, "Mount 'm' option 'token' must be 'anon'"),
        ("gs", {"consistency": "sha1"},
         "Mount 'm' option 'consistency' must be 'none' or 'size' or 'md5' or 'crc32c'"),
    ],
)  # fmt: skip
def test_parse_refuses_an_allowed_option_with_another_value(
    scheme: str, options: dict[str, object], detail: str
) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_mounts([{"name": "m", "uri": f"{scheme}://bucket/x", "options": options}])
    assert caught.value.detail == detail


def test_parse_takes_the_options_a_notebook_needs() -> None:
    options = {"anon": True, "requester_pays": False, "version_aware": True}
    (spec,) = parse_mounts([{"name": "m", "uri": "s3://bucket/x", "options": options}])
    assert spec.options == options


def test_parse_names_an_unsupported_scheme() -> None:
    with pytest.raises(BadRequest) as caught:
        parse_mounts([{"name": "m", "uri": "ftp://host/x"}])
    assert "'ftp'" in caught.value.detail and "'m'" in caught.value.detail


def test_parse_refuses_a_mounts_value_that_is_not_a_list() -> None:
    with pytest.raises(BadRequest, match="mounts must be a list"):
        parse_mounts({"name": "m"})  # type: ignore[arg-type]


def test_parse_names_the_backend_package_to_install() -> None:
    missing = [
        (s, p) for s, p in (("gs", "gcsfs"), ("az", "adlfs")) if not importlib.util.find_spec(p)
    ]
    if not missing:
        pytest.skip("gcsfs and adlfs are both installed here")
    scheme, package = missing[0]
    with pytest.raises(BadRequest) as caught:
        parse_mounts([{"name": "m", "uri": f"{scheme}://bucket/x"}])
    assert f"pip install {package}" in caught.value.detail


# --- read-only mounts -----------------------------------------------------------------


async def test_ro_mount_is_a_view_downloaded_once(
    s3: S3Server, bucket: str, cache: MountCache, tmp_path: Path
) -> None:
    spec = mount(f"s3://{bucket}/data")
    first = await materialize([spec], tmp_path / "run1", cache)
    assert first.paths == {"data": str(tmp_path / "run1" / "mounts" / "data")}
    assert read_tree(Path(first.paths["data"])) == expected_view()
    assert first.mount_bytes == {"data": DATA_BYTES}

    second = await materialize([spec], tmp_path / "run2", cache)  # a fresh run directory
    assert read_tree(Path(second.paths["data"])) == expected_view()
    assert second.mount_bytes == {"data": 0}
    a1, a2 = (Path(m.paths["data"]) / "a.csv" for m in (first, second))
    assert a1.stat().st_ino == a2.stat().st_ino  # both views share the cached file


async def test_ro_mount_of_one_object(
    s3: S3Server, bucket: str, cache: MountCache, tmp_path: Path
) -> None:
    result = await materialize([mount(f"s3://{bucket}/data/a.csv")], tmp_path / "run", cache)
    assert read_tree(Path(result.paths["data"])) == {"a.csv": OBJECTS["data/a.csv"]}


async def test_ro_view_files_cannot_be_written(
    s3: S3Server, bucket: str, cache: MountCache, tmp_path: Path
) -> None:
    result = await materialize([mount(f"s3://{bucket}/data")], tmp_path / "run", cache)
    view_file = Path(result.paths["data"]) / "a.csv"
    assert stat.S_IMODE(view_file.stat().st_mode) & 0o222 == 0  # for anyone
    if os.geteuid() != 0:  # root ignores mode bits; writes are caught as tampering instead
        with pytest.raises(PermissionError):
            view_file.open("ab")
    assert view_file.read_bytes() == OBJECTS["data/a.csv"]


async def test_a_view_on_another_filesystem_gets_read_only_copies(
    s3: S3Server, bucket: str, cache: MountCache, tmp_path: Path
) -> None:
    if not other_filesystem(tmp_path):
        pytest.skip("no second filesystem to put the run directory on")
    run_root = scratch_dir(Path("/dev/shm"))
    try:
        spec = mount(f"s3://{bucket}/data")
        first = await materialize([spec], run_root / "run1", cache)
        second = await materialize([spec], run_root / "run2", cache)
        assert (first.mount_bytes, second.mount_bytes) == ({"data": DATA_BYTES}, {"data": 0})
        view_file = Path(second.paths["data"]) / "a.csv"
        assert view_file.read_bytes() == OBJECTS["data/a.csv"]
        assert stat.S_IMODE(view_file.stat().st_mode) & 0o222 == 0
    finally:
        shutil.rmtree(run_root)


async def test_a_view_file_written_anyway_is_fetched_again(
    s3: S3Server, bucket: str, cache: MountCache, tmp_path: Path
) -> None:
    spec = mount(f"s3://{bucket}/data")
    first = await materialize([spec], tmp_path / "run1", cache)
    victim = Path(first.paths["data"]) / "sub" / "b.txt"
    victim.chmod(0o644)  # what a cell owning the file (or root) can do
    victim.write_bytes(b"poisoned!!!!")  # same size as the original
    second = await materialize([spec], tmp_path / "run2", cache)
    assert read_tree(Path(second.paths["data"])) == expected_view()
    assert second.mount_bytes == {"data": len(OBJECTS["data/sub/b.txt"])}


async def test_an_object_changed_on_the_server_is_downloaded_again(
    s3: S3Server, bucket: str, cache: MountCache, tmp_path: Path
) -> None:
    spec = mount(f"s3://{bucket}/data")
    await materialize([spec], tmp_path / "run1", cache)
    s3.put(bucket, "data/a.csv", b"x,y\n3,4\n5,6\n")
    second = await materialize([spec], tmp_path / "run2", cache)
    assert (Path(second.paths["data"]) / "a.csv").read_bytes() == b"x,y\n3,4\n5,6\n"
    assert second.mount_bytes == {"data": len(b"x,y\n3,4\n5,6\n")}  # only the changed object


@pytest.mark.parametrize("key", ["data/../../escaped", "data//rooted", "data/./dot"])
async def test_a_path_traversal_name_rejects_the_mount(
    s3: S3Server, cache: MountCache, tmp_path: Path, key: str
) -> None:
    bucket = s3.make_bucket({"data/ok.txt": b"fine", key: b"evil"})
    run_root = tmp_path / "deep" / "run"
    with pytest.raises(UpstreamFailed) as caught:
        await materialize([mount(f"s3://{bucket}/data")], run_root, cache)
    assert "path traversal" in caught.value.detail
    assert str(tmp_path) not in caught.value.detail
    assert not {"escaped", "rooted", "dot"} & file_names(tmp_path)


async def test_eviction_keeps_the_cache_bounded_and_views_intact(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    small = make_cache(tmp_path / "cache", s3, max_bytes=len(OBJECTS["data/sub/deeper/c.bin"]))
    spec = mount(f"s3://{bucket}/data")
    first = await materialize([spec], tmp_path / "run1", small)
    blobs = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in blobs) <= small.max_bytes
    assert read_tree(Path(first.paths["data"])) == expected_view()  # links outlive eviction
    second = await materialize([spec], tmp_path / "run2", small)
    assert 0 < second.mount_bytes["data"] <= DATA_BYTES


async def test_an_unreachable_store_is_an_upstream_failure(tmp_path: Path) -> None:
    secret = "s3cr3t-that-must-not-leak"
    unreachable = {
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{_free_port()}"},
        "key": "k",
        "secret": secret,
        "config_kwargs": {"retries": {"max_attempts": 1}},  # fail fast: no backoff
    }
    cache = make_cache(tmp_path / "cache", credentials={"gone": unreachable})
    (spec,) = parse_mounts([{"name": "data", "uri": "s3://bucket/data", "credential": "gone"}])
    with pytest.raises(UpstreamFailed) as caught:
        await materialize([spec], tmp_path / "run", cache)
    detail = caught.value.detail
    assert detail.startswith("Mount 'data' (s3://bucket/data): could not list the mount")
    assert secret not in detail and str(tmp_path) not in detail and "127.0.0.1" not in detail


async def test_a_missing_bucket_is_an_upstream_failure(
    s3: S3Server, cache: MountCache, tmp_path: Path
) -> None:
    with pytest.raises(UpstreamFailed, match="does not exist"):
        await materialize([mount("s3://no-such-bucket-here/data")], tmp_path / "run", cache)


# --- credentials ----------------------------------------------------------------------


def credential_environ(s3: S3Server, tmp_path: Path, **extra: str) -> dict[str, str]:
    lab = {"key": "${LAB_KEY}", "secret": "${LAB_SECRET}", "endpoint_url": "${LAB_ENDPOINT}"}
    broken = {"key": "nope", "secret": "nope", "endpoint_url": "http://127.0.0.1:9"}
    return {
        "STRATA_NOTEBOOK_CREDENTIALS": json.dumps({"lab": lab, "broken": broken}),
        "STRATA_NOTEBOOK_MOUNT_CACHE_DIR": str(tmp_path / "cache"),
        "LAB_KEY": ACCESS_KEY,
        "LAB_SECRET": SECRET_KEY,
        "LAB_ENDPOINT": s3.endpoint_url,
        "AWS_DEFAULT_REGION": REGION,
        **extra,
    }


async def test_a_named_credential_resolves_references_from_the_given_environ(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    cache = MountCache.from_environ(credential_environ(s3, tmp_path))
    assert cache.root == tmp_path / "cache"
    (spec,) = parse_mounts([{"name": "data", "uri": f"s3://{bucket}/data", "credential": "lab"}])
    result = await materialize([spec], tmp_path / "run", cache)
    assert read_tree(Path(result.paths["data"])) == expected_view()


async def test_a_named_credential_is_laid_over_the_scheme_default(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    defaults = json.dumps({"s3": "broken"})
    cache = MountCache.from_environ(
        credential_environ(s3, tmp_path, STRATA_NOTEBOOK_MOUNT_CREDENTIALS=defaults)
    )
    over_default = [{"name": "data", "uri": f"s3://{bucket}/data", "credential": "lab"}]
    result = await materialize(parse_mounts(over_default), tmp_path / "run1", cache)
    assert read_tree(Path(result.paths["data"])) == expected_view()


def test_a_requests_options_fill_in_what_the_operator_left_unset_never_override_it() -> None:
    operator = {"key": "k", "secret": "s", "endpoint_url": "http://store.internal", "anon": False}
    cache = make_cache(Path("/nonexistent"), credentials={"op": operator},
                       scheme_defaults={"s3": "op"})  # fmt: skip
    merged = cache.storage_options("m", "s3", None, {"anon": True, "requester_pays": True})
    assert merged == {**operator, "requester_pays": True}
    with pytest.raises(BadRequest, match="option 'endpoint_url' may not be set by a request"):
        cache.storage_options("m", "s3", None, {"endpoint_url": "http://attacker"})


async def test_credential_problems(s3: S3Server, tmp_path: Path) -> None:
    env = credential_environ(s3, tmp_path)
    del env["LAB_SECRET"]
    cache = MountCache.from_environ(env)
    unknown = parse_mounts([{"name": "data", "uri": "s3://b/data", "credential": "who"}])
    with pytest.raises(BadRequest, match="credential 'who' is not defined on this worker"):
        await materialize(unknown, tmp_path / "run", cache)
    unset = parse_mounts([{"name": "data", "uri": "s3://b/data", "credential": "lab"}])
    with pytest.raises(WorkerError) as caught:
        await materialize(unset, tmp_path / "run", cache)
    assert not isinstance(caught.value, BadRequest) and "${LAB_SECRET}" in caught.value.detail
    assert not (tmp_path / "run").exists()  # refused before any I/O


@pytest.mark.parametrize(
    "environ",
    [
        {"STRATA_NOTEBOOK_CREDENTIALS": "{not json"},
        {"STRATA_NOTEBOOK_CREDENTIALS": '["a"]'},
        {"STRATA_NOTEBOOK_CREDENTIALS": '{"a": "b"}'},
        {"STRATA_NOTEBOOK_MOUNT_CREDENTIALS": '{"s3": "undefined"}'},
    ],
)
def test_from_environ_refuses_bad_credential_config(environ: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="STRATA_NOTEBOOK_"):
        MountCache.from_environ(environ)


def test_from_environ_defaults(tmp_path: Path) -> None:
    cache = MountCache.from_environ(
        {"HOME": str(tmp_path), "STRATA_NOTEBOOK_MOUNT_CACHE_MAX_BYTES": "-3"}
    )
    assert cache.root == tmp_path / ".strata" / "mount_cache"
    assert cache.max_bytes == 20 * 1024**3
    assert (
        MountCache.from_environ({"STRATA_NOTEBOOK_MOUNT_CACHE_MAX_BYTES": "1000"}).max_bytes == 1000
    )


# --- read-write mounts ----------------------------------------------------------------


async def test_rw_mount_stages_and_syncs_back_what_the_cell_wrote(
    s3: S3Server, bucket: str, cache: MountCache, tmp_path: Path
) -> None:
    uri = f"s3://{bucket}/data"
    spec = mount(uri, name="out", mode="rw")
    result = await materialize([spec], tmp_path / "run", cache)
    digest = hashlib.sha256(uri.encode()).hexdigest()[:12]
    staging = tmp_path / "run" / "mount_cache" / f"out_{digest}" / "staging"
    assert result.paths == {"out": str(staging)} and result.mount_bytes == {}
    assert read_tree(staging) == expected_view()

    (staging / "new" / "made.txt").parent.mkdir()
    (staging / "new" / "made.txt").write_bytes(b"written by the cell")
    (staging / "a.csv").write_bytes(b"x,y\n9,9\n")
    (staging / "sub" / "b.txt").unlink()  # deletions are not propagated
    (staging / "link.txt").symlink_to(staging / "a.csv")  # links are skipped
    writes = await sync_back([spec], result)

    def entry(path: str, body: bytes) -> dict[str, object]:
        return {"path": path, "size": len(body), "sha256": hashlib.sha256(body).hexdigest()}

    assert writes == [
        {
            "mount": "out",
            "uri": uri,
            "files": [entry("a.csv", b"x,y\n9,9\n"), entry("new/made.txt", b"written by the cell")],
        }
    ]
    assert s3.get(bucket, "data/new/made.txt") == b"written by the cell"
    assert s3.get(bucket, "data/a.csv") == b"x,y\n9,9\n"
    assert s3.get(bucket, "data/sub/b.txt") == OBJECTS["data/sub/b.txt"]
    assert "data/link.txt" not in s3.keys(bucket)


async def test_rw_mount_folder_the_cell_swapped_for_a_link_syncs_nothing_from_there(
    s3: S3Server, bucket: str, cache: MountCache, tmp_path: Path
) -> None:
    """The cell can write where its copy lives: a link it puts in place of the copy (to a
    folder only the worker may read) is not followed, so nothing from there is uploaded."""
    spec = mount(f"s3://{bucket}/data", name="out", mode="rw")
    result = await materialize([spec], tmp_path / "run", cache)
    _swap_for_link(Path(result.paths["out"]), tmp_path)
    assert await sync_back([spec], result) == []
    assert s3.keys(bucket) == set(OBJECTS)


def _swap_for_link(folder: Path, scratch: Path) -> None:
    """What a cell can do: move its folder away and put a link to another in its place."""
    elsewhere = scratch / "elsewhere"
    elsewhere.mkdir()
    write(elsewhere / "secret.txt", b"not the cell's")
    folder.rename(scratch / "moved")
    folder.symlink_to(elsewhere)


async def test_rw_writes_stay_local_without_sync_back(
    s3: S3Server, bucket: str, cache: MountCache, tmp_path: Path
) -> None:
    spec = mount(f"s3://{bucket}/data", name="out", mode="rw")
    result = await materialize([spec], tmp_path / "run", cache)
    write(Path(result.paths["out"], "a.csv"), b"changed")
    write(Path(result.paths["out"], "fresh.txt"), b"new")
    assert s3.keys(bucket) == set(OBJECTS)
    assert s3.get(bucket, "data/a.csv") == OBJECTS["data/a.csv"]


async def test_rw_mount_of_a_new_prefix_and_nothing_written(
    s3: S3Server, bucket: str, cache: MountCache, tmp_path: Path
) -> None:
    spec = mount(f"s3://{bucket}/results", name="out", mode="rw")
    result = await materialize([spec], tmp_path / "run", cache)
    assert read_tree(Path(result.paths["out"])) == {}
    assert await sync_back([spec], result) == []
    assert await sync_back([spec], MaterializedMounts(paths={}, mount_bytes={})) == []


async def test_rw_mount_must_name_a_folder(
    s3: S3Server, bucket: str, cache: MountCache, tmp_path: Path
) -> None:
    with pytest.raises(BadRequest, match="must name a folder"):
        await materialize([mount(f"s3://{bucket}/data/a.csv", mode="rw")], tmp_path / "run", cache)


# --- the cache probe ------------------------------------------------------------------


def listing_entries(s3: S3Server, uri: str) -> list[dict[str, object]]:
    """What the orchestrator sends: its own s3fs listing, as the reference encodes it."""
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3.storage_options())
    found = fs.find(uri, withdirs=False, detail=True)
    return [
        {
            "key": key,
            "name": info["name"],
            "etag": str(info.get("ETag", info.get("etag", ""))),
            "mtime": str(info.get("LastModified", info.get("mtime", ""))),
            "size": info["size"],
        }
        for key, info in found.items()
    ]


async def test_cached_bytes_reports_what_this_machine_holds(
    s3: S3Server, bucket: str, cache: MountCache, tmp_path: Path
) -> None:
    uri = f"s3://{bucket}/data"
    spec = mount(uri)
    raw_spec = {"name": "data", "uri": uri}
    before = listing_entries(s3, uri)
    assert await cached_bytes({"mounts": [{"spec": spec, "entries": before}]}, cache) == [0]

    await materialize([spec], tmp_path / "run", cache)
    s3.put(bucket, "data/added.txt", b"not cached yet")
    after = listing_entries(s3, uri)
    other_scope = {**raw_spec, "options": {"requester_pays": False}}
    body = {
        "mounts": [
            {"spec": spec, "entries": before},  # fully cached
            {"spec": raw_spec, "entries": after},  # partly cached
            {"spec": other_scope, "entries": before},  # other options: another cache partition
            {"spec": {**raw_spec, "mode": "rw"}, "entries": before},
            {"spec": {"name": "local", "uri": "file:///data"}, "entries": before},
            {"spec": {**raw_spec, "credential": "unknown"}, "entries": before},
            {"spec": {**raw_spec, "options": {"endpoint_url": "http://x"}}, "entries": before},
        ]
    }
    assert await cached_bytes(body, cache) == [DATA_BYTES, DATA_BYTES, 0, None, None, None, None]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"mounts": {}},
        {"mounts": [{"spec": {"name": "m", "uri": "s3://b"}}]},
        {"mounts": [{"spec": {"name": "m", "uri": "s3://b"}, "entries": [{"size": 1}]}]},
    ],
)
async def test_cached_bytes_refuses_a_malformed_body(
    body: dict[str, object], cache: MountCache
) -> None:
    with pytest.raises(BadRequest):
        await cached_bytes(body, cache)


# --- plumbing -------------------------------------------------------------------------


async def test_nothing_to_mount() -> None:
    assert await materialize([], Path("/nonexistent"), make_cache(Path("/nonexistent"))) == (
        MaterializedMounts(paths={}, mount_bytes={})
    )


async def test_a_cancelled_materialize_waits_for_its_thread_to_stop() -> None:
    started, finished = threading.Event(), threading.Event()

    def work(stop: threading.Event) -> None:
        started.set()
        stop.wait(timeout=30)  # a download in flight, that checks stop when it is done
        finished.set()
        raise Stopped

    task = asyncio.ensure_future(mounts._off_loop(work))
    await asyncio.to_thread(started.wait, 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished.is_set()  # nothing of the run is still being written after cancel


async def test_a_materialize_cancelled_twice_still_waits_for_its_thread() -> None:
    """A second cancellation (a shutdown after a request's) while the thread finishes its
    transfer does not cut the wait short: the caller ends cancelled once the thread has."""
    stopping, finished = threading.Event(), threading.Event()

    def work(stop: threading.Event) -> None:
        stop.wait(timeout=30)
        stopping.set()
        time.sleep(0.3)  # the transfer in flight ends
        finished.set()
        raise Stopped

    task = asyncio.ensure_future(mounts._off_loop(work))
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.to_thread(stopping.wait, 30)
    task.cancel()  # again, while it waits for the thread
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished.is_set()


def test_pinned_listings_are_remembered_most_recent_first() -> None:
    pins = PinnedListings()
    listing = (Placement(rel="a.txt", remote="b/a.txt", key=None, size=1),)
    keys = [pin_key("s3", "scope", "b", f"v{i}") for i in range(257)]
    assert len(set(keys)) == 257 and pin_key("s3", "other", "b", "v0") != keys[0]
    assert pins.get(keys[0]) is None
    for key in keys[:256]:
        pins.remember(key, listing)
    assert pins.get(keys[0]) == listing  # used: now the most recent
    pins.remember(keys[256], listing)  # one too many: the least recent goes
    assert pins.get(keys[1]) is None
    assert pins.get(keys[0]) == listing and pins.get(keys[256]) == listing
    pins.forget(keys[0])
    assert pins.get(keys[0]) is None
