"""Bad input over real HTTP: property-based fuzzing of everything a request can carry.

hypothesis drives malformed metadata envelopes (both push routes), multipart framing,
pull-model manifests and the URLs they name; schemathesis adds what the OpenAPI schema
describes. Every malformed request must be answered with a 4xx whose ``detail`` is a
non-empty string: never a 5xx, never a hang (every request has a client timeout), never a
dead worker. Malformed *data* inside a well-formed request (corrupt Arrow, a bad pickle,
invalid JSON, an unsafe tar) is the cell's failure: 200, ``success: false``, a clear error.

Nothing may be written outside the worker's run directory: the worker runs with ``HOME``
and ``TMPDIR`` inside a watched folder whose tree must not change (the pool's private
kernel directory excepted: kernels replaced after a timeout change it), every path-like
name in a request aims at :data:`CANARY` (which must appear nowhere), and the run
directory must be empty after each test.

The worker runs with ``STRATA_WORKER_ALLOW_LOCAL_HOSTS`` unset, so loopback and private
URLs must be refused, never fetched: a fake store listening on loopback records that
nothing reached it. Only ``store.invalid`` (``STRATA_WORKER_ALLOWED_HOSTS``) passes the
URL check, and it never resolves. ``FUZZ_EXAMPLES`` sets the examples per property.
"""

from __future__ import annotations

import io
import ipaddress
import json
import keyword
import math
import os
import pickle
import re
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
import schemathesis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.conftest import ROOT, WorkerProcess, start_worker
from tests.fake_store import FakeStore
from tests.wire import read_bundle

CANARY = "skw-fuzz-canary"
ALLOWED_HOST = "store.invalid"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "80"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.function_scoped_fixture],
)  # fmt: skip
REQUEST_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
ROUTES = ("/v1/execute", "/v1/notebook-execute")
JSON_PART = b'{"k": [1, 2]}'
FORMATS = {"arrow/ipc", "json/object", "pickle/object", "module/import", "module/cell",
           "module/cell-instance", "file/path", "dir/tar", "text/markdown", "application/x-r-rds"}  # fmt: skip
MOUNT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# ---- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The worker's HOME and TMPDIR."""
    root = tmp_path_factory.mktemp("fuzz-watched")
    for sub in ("home", "tmp"):
        (root / sub).mkdir()
    return root


@pytest.fixture(scope="module")
def store() -> Iterator[FakeStore]:
    fake = FakeStore()
    fake.blobs["x"] = b"data"
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def fuzz_worker(tmp_path_factory: pytest.TempPathFactory, watched: Path) -> Iterator[WorkerProcess]:
    env = {"HOME": str(watched / "home"), "TMPDIR": str(watched / "tmp"),
           "STRATA_WORKER_ALLOWED_HOSTS": ALLOWED_HOST}  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        for name in ("STRATA_WORKER_ALLOW_LOCAL_HOSTS", "STRATA_WORKER_TOKEN"):
            mp.delenv(name, raising=False)
        worker = start_worker(tmp_path_factory, "--pool-size", "1", "--spares", "1", env=env)
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def client(fuzz_worker: WorkerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_worker.url, timeout=REQUEST_TIMEOUT) as c:
        yield c


@pytest.fixture(autouse=True)
def nothing_escapes(
    watched: Path, fuzz_worker: WorkerProcess, client: httpx.Client, store: FakeStore
) -> Iterator[None]:
    """After each test: worker alive and healthy, no file outside the run dir, no fetch."""
    before = tree(watched)
    yield
    assert fuzz_worker.proc.poll() is None, "the worker crashed"
    deadline = time.monotonic() + 10  # run dirs go in a background task after the answer
    while list(fuzz_worker.run_dir.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(fuzz_worker.run_dir.iterdir()), "run directory not emptied"
    assert tree(watched) == before, sorted(tree(watched) ^ before)
    places = [watched, *fuzz_worker.run_dir.parents, ROOT, Path("/tmp")]
    assert not [p for p in places if (p / CANARY).exists()], "a canary file was written"
    assert not (store.fetched or store.uploads or store.finalized or store.logs), "store reached"
    assert client.get("/health").json()["status"] == "healthy"
    fuzz_worker.remember_kernels()


def tree(root: Path) -> set[str]:
    """Every path under *root*, but the pool's private kernel directory's contents."""
    found: set[str] = set()
    for folder, dirs, files in os.walk(root):
        rel = Path(folder).relative_to(root)
        if (
            rel.parts[:1] == ("tmp",)
            and len(rel.parts) > 1
            and rel.parts[1].startswith("kernel-pool-")
        ):
            dirs.clear()
            continue
        found.update(str(rel / name) for name in [*dirs, *files])
    return found


# ---- wire helpers -------------------------------------------------------------------------------


def assert_refused(response: httpx.Response, status: int | None = 400) -> str:
    """A 4xx (exactly *status* unless None) with a non-empty string ``detail``."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    if status is not None:
        assert response.status_code == status, (response.status_code, response.text[:500])
    body = response.json()
    assert isinstance(body, dict), body
    detail = body.get("detail")
    assert isinstance(detail, str) and detail.strip(), body
    return detail


def file_part(field: str, data: bytes, filename: str = f"../../{CANARY}") -> tuple[bytes, bytes]:
    disposition = f'form-data; name="{field}"; filename="{filename}"'
    return (
        f"Content-Disposition: {disposition}\r\nContent-Type: application/octet-stream".encode(),
        data,
    )


def encode(parts: list[tuple[bytes, bytes]], boundary: bytes) -> bytes:
    out = bytearray()
    for headers, data in parts:
        out += b"--" + boundary + b"\r\n" + headers + b"\r\n\r\n" + data + b"\r\n"
    return bytes(out + b"--" + boundary + b"--\r\n")


def post_form(client: httpx.Client, route: str, parts: list[tuple[bytes, bytes]]) -> httpx.Response:
    boundary = b"fuzz-boundary-7d1e"
    headers = {"content-type": "multipart/form-data; boundary=" + boundary.decode()}
    return client.post(route, content=encode(parts, boundary), headers=headers)


def post_metadata(client: httpx.Client, route: str, metadata: bytes) -> httpx.Response:
    return post_form(
        client, route, [file_part("metadata", metadata), file_part("cfg.json", JSON_PART)]
    )


def dumps(value: object) -> bytes:
    return json.dumps(value).encode()  # NaN/Infinity as JS literals, which json.loads reads


# ---- the envelopes and their mutations ----------------------------------------------------------


def base(route: str) -> dict[str, Any]:
    """A valid envelope with one JSON input (its part is always sent as ``cfg.json``)."""
    if route == "/v1/execute":
        params = {"source": "x = 1", "timeout_seconds": 20}
        return {"protocol_version": "v1", "transform": {"ref": "notebook_cell@v1", "params": params},
                "inputs": [{"name": "cfg", "format": "json/object", "file": "cfg.json"}]}  # fmt: skip
    return {"protocol_version": "notebook-cell-v1", "source": "x = 1", "timeout_seconds": 20,
            "inputs": {"cfg": {"content_type": "json/object", "file": "cfg.json"}}}  # fmt: skip


Mutation = Callable[[str, dict[str, Any]], None]


def set_param(key: str, value: object) -> Mutation:
    def apply(route: str, meta: dict[str, Any]) -> None:
        (meta["transform"]["params"] if route == "/v1/execute" else meta)[key] = value

    return apply


def set_input(key: str, value: object) -> Mutation:
    def apply(route: str, meta: dict[str, Any]) -> None:
        if route == "/v1/execute":
            meta["inputs"][0]["format" if key == "content_type" else key] = value
        elif key == "name":
            meta["inputs"] = {value: meta["inputs"]["cfg"]}
        else:
            meta["inputs"]["cfg"][key] = value

    return apply


def set_top(key: str, value: object) -> Mutation:
    def apply(route: str, meta: dict[str, Any]) -> None:
        meta[key] = value

    return apply


def drop(*path: str | int) -> Mutation:
    def apply(route: str, meta: dict[str, Any]) -> None:
        parent: Any = meta
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]

    return apply


def add_input(descriptor: dict[str, Any]) -> Mutation:
    def apply(route: str, meta: dict[str, Any]) -> None:
        if route == "/v1/execute":
            meta["inputs"].append(descriptor)
        else:
            spec = {"content_type" if k == "format" else k: v for k, v in descriptor.items()}
            meta["inputs"][str(spec.pop("name"))] = spec

    return apply


scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
not_string = json_values.filter(lambda v: not isinstance(v, str))
not_object_or_null = json_values.filter(lambda v: v is not None and not isinstance(v, dict))
not_null = json_values.filter(lambda v: v is not None)  # null is a field left out: its default


def is_name(text: str) -> bool:
    return text.isidentifier() and not keyword.iskeyword(text)


def timeout_accepted(value: object) -> bool:
    """The documented rule: a finite number above 0 (or numeric string); null is default."""
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return False
    try:
        seconds = float(value)
    except (ValueError, OverflowError):
        return False
    return math.isfinite(seconds) and seconds > 0


path_like = st.sampled_from([
    f"../{CANARY}", f"../../{CANARY}", f"../../../{CANARY}", f"/tmp/{CANARY}", f"sub/{CANARY}",
    f"..\\{CANARY}", f"{CANARY}\x00.json", "..", ".", f"  ../{CANARY}  ", f"~/{CANARY}",
    f"__part_0001{CANARY}", f"__inj_0_0{CANARY}", CANARY * 20,
]) | st.builds(lambda a, sep, b: f"{a}{sep}{CANARY}{b}", st.text(max_size=5), st.sampled_from("/\\\x00"),
               st.text(max_size=5))  # fmt: skip


def refused_file(file: str) -> bool:
    """Whether the worker refuses *file*: only a path's last component counts (as in the
    reference), and that must be a plain name, not reserved, at most 255 bytes."""
    last = file.strip().rsplit("/", 1)[-1]
    return (
        last in ("", ".", "..")
        or any(c in last for c in "\\\x00")
        or last.startswith(("__part_", "__inj_"))
        or len(last.encode("utf-8", "surrogatepass")) > 255
    )


bad_files = path_like.filter(refused_file)
bad_names = st.sampled_from(
    [
        "",
        "   ",
        "1abc",
        "a-b",
        "a b",
        "class",
        "None",
        f"../{CANARY}",
        "a.b",
        "é-x",
        "\x00",
        "x\u200b",
    ]
) | st.text(max_size=10).filter(lambda s: not is_name(s.strip()))
bad_timeouts = st.one_of(
    st.floats(max_value=-1e-300) | st.integers(max_value=-1),
    st.sampled_from([math.nan, math.inf, -math.inf, "nan", "inf", "-1", "1e999", "soon", "", "0x10",
                     True, False, [], {}, [5], {"s": 5}, 10**400]),
    json_values.filter(lambda v: not timeout_accepted(v)),
)  # fmt: skip
env_key = st.text(min_size=1, max_size=8).filter(lambda k: "=" not in k and "\x00" not in k)
bad_env = st.one_of(
    not_object_or_null,
    st.dictionaries(st.sampled_from(["", "A=B", "=", "A\x00B", "\ud800"]), st.text(max_size=4), min_size=1),
    st.dictionaries(env_key, st.none() | st.lists(scalars, max_size=2) | st.dictionaries(st.text(max_size=3), scalars, max_size=2), min_size=1),
    st.dictionaries(env_key, st.sampled_from(["a\x00b", "\udc80"]), min_size=1),
)  # fmt: skip
S3 = "s3://bucket/key"
bad_mount_names = st.sampled_from(["", " m", "1m", "m-1", "é", "a.b"]) | st.text(max_size=8).filter(
    lambda n: not MOUNT_NAME.fullmatch(n)
)
bad_mount = st.one_of(
    json_values.filter(lambda v: not isinstance(v, dict)),
    st.fixed_dictionaries({"name": bad_mount_names | not_string, "uri": st.just(S3)}),
    st.fixed_dictionaries({"name": st.just("m"), "uri": not_string | st.just("")}),
    st.fixed_dictionaries({"name": st.just("m"), "uri": st.sampled_from([
        "file:///etc/passwd", f"file:///tmp/{CANARY}", f"/tmp/{CANARY}", f"../{CANARY}", "ftp://b/k",
        "foo://b/k", "s3://", "s3:///key", "http://127.0.0.1/x", "https://169.254.169.254/", ":"])}),
    st.fixed_dictionaries({"name": st.just("m"), "uri": st.just(S3), "mode": not_null.filter(lambda v: v not in ("ro", "rw"))}),
    st.fixed_dictionaries({"name": st.just("m"), "uri": st.just(S3), "options": not_object_or_null}),
    st.fixed_dictionaries({"name": st.just("m"), "uri": st.just(S3), "pin": not_string.filter(lambda v: v is not None)}),
    st.fixed_dictionaries({"name": st.just("m"), "uri": st.just(S3), "credential": not_string.filter(lambda v: v is not None)}),
)  # fmt: skip
bad_mounts = not_object_or_null.filter(lambda v: not isinstance(v, list)) | st.lists(bad_mount, min_size=1, max_size=3) | st.just([{"name": "m", "uri": S3}] * 2)  # fmt: skip
unknown_formats = st.text(max_size=15).filter(lambda f: f not in FORMATS) | not_string.filter(
    lambda v: v is not None
)


def invalid_mutations(route: str) -> st.SearchStrategy[Mutation]:
    """One change that makes the valid envelope of *route* invalid (always a 400)."""
    v1 = route == "/v1/execute"
    inputs_type = list if v1 else dict
    common = [
        # null is left out: the default on the v1 route, refused where the field is required
        st.builds(
            set_top,
            st.just("protocol_version"),
            json_values.filter(
                lambda v: v != ("v1" if v1 else "notebook-cell-v1") and (v is not None or not v1)
            ),
        ),
        st.builds(
            set_top, st.just("inputs"), json_values.filter(lambda v: not isinstance(v, inputs_type))
        ),
        st.builds(set_top, st.just("build_id"), not_string.filter(lambda v: v is not None)),
        st.builds(set_param, st.just("source"), not_string.filter(lambda v: v is not None)),
        st.builds(set_param, st.just("source"), st.sampled_from(["\ud800", "x = '\udfff'"])),
        st.builds(set_param, st.just("timeout_seconds"), bad_timeouts),
        st.builds(set_param, st.just("env"), bad_env),
        st.builds(set_param, st.just("mounts"), bad_mounts),
        st.builds(
            set_param,
            st.just("mutation_defines"),
            not_object_or_null.filter(
                lambda v: not (isinstance(v, list) and all(isinstance(x, str) for x in v))
            ),
        ),
        st.builds(
            set_param,
            st.just("tables"),
            not_object_or_null
            | st.dictionaries(
                st.text(max_size=4),
                json_values.filter(
                    lambda v: not (isinstance(v, dict) and isinstance(v.get("uri"), str))
                ),
                min_size=1,
            ),
        ),
        st.builds(
            set_param,
            st.just("language"),
            st.sampled_from(["R", "julia", "Python", 1, True, False, 0, [], ["python"]]),
        ),
        st.builds(set_input, st.just("name"), bad_names),
        st.builds(set_input, st.just("content_type"), unknown_formats),
        st.builds(
            set_input, st.just("file"), bad_files | not_string.filter(lambda v: v is not None)
        ),
        st.builds(
            set_input, st.just("injected"), json_values.filter(lambda v: v is not None and v != {})
        ),
        st.builds(
            add_input,
            st.fixed_dictionaries(
                {
                    "name": st.just("other"),
                    "format": st.just("json/object"),
                    "file": st.just("cfg.json"),
                }
            ),
        ),
        st.builds(
            add_input,
            st.fixed_dictionaries(
                {"name": st.just("missing"), "format": st.sampled_from(sorted(FORMATS))}
            ),
        ),
        st.builds(
            add_input,
            st.fixed_dictionaries(
                {
                    "name": st.just("cell"),
                    "format": st.just("module/cell"),
                    "injected": not_object_or_null,
                }
            ),
        ),
    ]
    only_v1 = [
        st.sampled_from([drop("transform"), drop("transform", "ref"), drop("inputs", 0, "name")]),
        st.builds(
            set_top, st.just("transform"), json_values.filter(lambda v: not isinstance(v, dict))
        ),
        st.builds(
            add_input,
            st.fixed_dictionaries({"name": st.just("cfg"), "format": st.just("json/object")}),
        ),
        st.builds(set_top, st.just("inputs"), st.lists(not_object_or_null, min_size=1, max_size=2)),
    ]
    only_flat = [st.just(drop("protocol_version"))]
    return st.one_of(*common, *(only_v1 if v1 else only_flat))  # fmt: skip


def mutate(route: str, *mutations: Mutation) -> bytes:
    meta = base(route)
    for mutation in mutations:
        mutation(route, meta)
    return dumps(meta)


# ---- envelopes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
def test_the_unmutated_envelopes_run(client: httpx.Client, route: str) -> None:
    """The base every mutation starts from is valid, so the mutation is what gets refused."""
    bundle = read_bundle(post_metadata(client, route, mutate(route)))
    assert bundle.manifest["success"] is True, bundle.manifest


@pytest.mark.parametrize("route", ROUTES)
@FUZZ
@given(data=st.data())
def test_invalid_envelope_fields_are_400(
    client: httpx.Client, route: str, data: st.DataObject
) -> None:
    mutation = data.draw(invalid_mutations(route))
    assert_refused(post_metadata(client, route, mutate(route, mutation)))


@pytest.mark.parametrize("route", ROUTES)
@FUZZ
@given(environment=json_values.filter(lambda v: v is not None))
def test_a_malformed_locked_environment_is_the_references_500(
    client: httpx.Client, route: str, environment: object
) -> None:
    """Anything but a spec whose key matches its lock: 500 ``locked environment: ...``, as
    the reference answers it (Strata shows that text), never a crash."""
    response = post_metadata(client, route, mutate(route, set_param("environment", environment)))
    assert response.status_code == 500, response.text[:300]
    body = response.json()
    assert body["success"] is False and body["error"].startswith("locked environment: ")
    assert body["detail"] == body["error"]


@pytest.mark.parametrize("route", ROUTES)
@FUZZ
@given(metadata=st.one_of(
    st.binary(max_size=64),
    st.builds(dumps, not_object_or_null),
    st.builds(lambda v: dumps(v)[:-1], json_values.filter(lambda v: isinstance(v, dict | list))),
))  # fmt: skip
def test_metadata_that_is_not_a_json_object_is_400(
    client: httpx.Client, route: str, metadata: bytes
) -> None:
    try:
        if isinstance(json.loads(metadata), dict):
            return  # st.binary drew a JSON object: not this property's case
    except ValueError:
        pass
    assert_refused(post_metadata(client, route, metadata))


def paths(value: object, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from paths(inner, (*prefix, index))


@pytest.mark.parametrize("route", ROUTES)
@FUZZ
@given(data=st.data())
def test_arbitrary_values_anywhere_never_5xx(
    client: httpx.Client, route: str, data: st.DataObject
) -> None:
    """Any JSON at any place (the source only as a non-string): a 4xx, or a real bundle."""
    meta = base(route)
    huge = st.sampled_from([1e308, 10**308, 2**63, 5e-324, 0, "1e308", " 7 "])
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from([p for p in paths(meta) if p]))
        *parent_path, last = path
        parent: Any = meta
        for key in parent_path:
            parent = parent[key]
        if last == "source":
            parent[last] = data.draw(not_string)
        elif data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[last]
        else:
            parent[last] = data.draw(huge if last == "timeout_seconds" else json_values)
    response = post_metadata(client, route, dumps(meta))
    event(f"status {response.status_code}")
    if response.status_code == 200:
        read_bundle(response)
    else:
        assert_refused(response, status=None)


@pytest.mark.parametrize("source", ["", " ", "\n\t"], ids=repr)
@pytest.mark.parametrize("route", ROUTES)
def test_a_blank_cell_succeeds(client: httpx.Client, route: str, source: str) -> None:
    meta = base(route)
    set_param("source", source)(route, meta)
    manifest = read_bundle(post_metadata(client, route, dumps(meta))).manifest
    assert (manifest["success"], manifest["error"], manifest["variables"]) == (True, None, {})


# ---- the mount-cache probe ---------------------------------------------------------------------


probe_spec = st.fixed_dictionaries(
    {"name": st.just("m"), "uri": st.sampled_from([S3, "s3://b", "gs://b/p", "file:///etc", "x"])},
    optional={"mode": st.sampled_from(["ro", "rw", "x"]), "credential": st.text(max_size=5) | st.none(),
              "options": st.dictionaries(st.text(max_size=5), scalars, max_size=2)},
)  # fmt: skip
probe_entry = st.fixed_dictionaries(
    {"key": st.text(max_size=12) | not_string},
    optional={"size": st.integers(-5, 10**12) | not_string, "etag": json_values, "mtime": json_values},
)  # fmt: skip
probe_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"mounts": st.lists(st.fixed_dictionaries(
        {"spec": probe_spec | json_values, "entries": st.lists(probe_entry, max_size=3) | json_values}
    ), max_size=3) | json_values}),
)  # fmt: skip


@FUZZ
@given(body=probe_bodies)
def test_mount_cache_probe_answers_a_list_or_422(client: httpx.Client, body: object) -> None:
    """A body of the wrong shape is 422, as the reference's model validation answers."""
    response = client.post("/v1/mount-cache/cached", content=dumps(body))
    event(f"status {response.status_code}")
    if response.status_code == 200:
        cached = response.json()["cached_bytes"]
        assert isinstance(cached, list) and all(v is None or isinstance(v, int) for v in cached)
    else:
        assert_refused(response, status=422)


# ---- multipart framing --------------------------------------------------------------------------


def valid_parts() -> list[tuple[bytes, bytes]]:
    return [file_part("metadata", mutate("/v1/execute")), file_part("cfg.json", JSON_PART)]


framing_cases = st.one_of(
    # (description, content type, body)
    st.builds(lambda b: ("boundary mismatch", "multipart/form-data; boundary=other", encode(valid_parts(), b)),
              st.binary(min_size=1, max_size=20).filter(lambda b: not b.startswith(b"other") and b"\r" not in b and b"\n" not in b)),
    st.builds(lambda cut: ("truncated", None, encode(valid_parts(), b"fz")[:cut]),
              st.integers(0, len(encode(valid_parts(), b"fz")) - 4)),
    st.builds(lambda ct: ("content type", ct, encode(valid_parts(), b"fz")), st.sampled_from([
        "", "multipart/form-data", "multipart/form-data; boundary=", "multipart/form-data; boundary=\"\"",
        "multipart/mixed; boundary=fz", "application/json", "text/plain; boundary=fz",
        "application/x-www-form-urlencoded"])),
    st.builds(lambda body: ("garbage body", None, body), st.binary(max_size=300)),
    st.builds(lambda p: ("duplicate part", None, encode([*valid_parts(), valid_parts()[p]], b"fz")), st.integers(0, 1)),
    st.builds(lambda h: ("part headers", None, encode([(h, mutate("/v1/execute")), valid_parts()[1]], b"fz")), st.sampled_from([
        b'Content-Disposition: form-data; filename="m.json"', b'Content-Disposition: form-data; name=""; filename="m"',
        b'Content-Disposition: attachment; name="metadata"; filename="m"', b"Content-Type: application/json",
        b'Content-Disposition: form-data; name="metadata"', b"no colon here", b'Content-Disposition: form-data; name="\xff\xfe"; filename="m"',
    ])),
    st.builds(lambda: ("no metadata", None, encode([valid_parts()[1]], b"fz"))),
    st.builds(lambda: ("non-file input", None, encode([valid_parts()[0], (b'Content-Disposition: form-data; name="cfg.json"', JSON_PART)], b"fz"))),
    st.builds(lambda extra: ("unused part", None, encode([*valid_parts(), file_part(extra, b"1")], b"fz")),
              st.text(min_size=1, max_size=10).filter(lambda n: n not in ("metadata", "cfg.json", "cfg") and '"' not in n and "\r" not in n and "\n" not in n)),
)  # fmt: skip


@FUZZ
@given(case=framing_cases)
def test_malformed_multipart_framing_is_400(
    client: httpx.Client, case: tuple[str, str | None, bytes]
) -> None:
    _what, content_type, body = case
    headers = {
        "content-type": content_type
        if content_type is not None
        else "multipart/form-data; boundary=fz"
    }
    assert_refused(client.post("/v1/execute", content=body, headers=headers))


def test_too_many_parts_is_400(client: httpx.Client) -> None:
    parts = [*valid_parts(), *(file_part(f"p{i}", b"1") for i in range(1100))]
    assert "Too many form parts" in assert_refused(post_form(client, "/v1/execute", parts))


# ---- pull model: manifests and URLs -------------------------------------------------------------


def private_ipv4() -> st.SearchStrategy[str]:
    networks = ["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
                "100.64.0.0/10", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4", "198.18.0.0/15",
                "192.0.2.0/24", "192.0.0.0/29"]  # fmt: skip
    return st.sampled_from(networks).flatmap(
        lambda net: st.integers(0, ipaddress.ip_network(net).num_addresses - 1).map(
            lambda i: str(ipaddress.ip_network(net)[i])
        )
    )


def refused_hosts(store_port: int) -> st.SearchStrategy[str]:
    v4 = private_ipv4()
    v6 = st.one_of(
        st.sampled_from(["[::1]", "[::]", "[fe80::1]", "[fc00::1]", "[fd12:3456::1]", "[ff02::1]"]),
        v4.map(lambda a: f"[::ffff:{a}]"),
        v4.map(lambda a: f"[64:ff9b::{a}]"),
        v4.map(lambda a: "[2002:{:02x}{:02x}:{:02x}{:02x}::1]".format(*map(int, a.split(".")))),
    )
    loopback = st.sampled_from(["localhost", "LOCALHOST", "127.1", "0x7f000001", "2130706433",
                                "0177.0.0.1", "0", "[::ffff:7f00:1]"])  # fmt: skip
    return (v4 | v6 | loopback).flatmap(
        lambda h: st.sampled_from([h, f"{h}:{store_port}", f"{ALLOWED_HOST}@{h}:{store_port}"])
    )


def refused_urls(store_port: int) -> st.SearchStrategy[str]:
    """URLs the worker must refuse (never empty or blank: those mean "absent")."""
    host = refused_hosts(store_port)
    path = st.sampled_from(["/blob/x", "/upload/k", "/finalize/k", "/log/k", "/", ""])
    scheme = st.sampled_from(["http", "https", "HTTP", "hTTps"])
    return st.one_of(
        st.builds(lambda s, h, p: f"{s}://{h}{p}", scheme, host, path),
        st.builds(lambda s, p: f"{s}://{ALLOWED_HOST}{p}",
                  st.sampled_from(["file", "ftp", "gopher", "ws", "dict", "ldap", "jar", "data"]), path),
        st.sampled_from([f"http://127.0.0.1:{store_port}#@{ALLOWED_HOST}/", f"http:///{ALLOWED_HOST}/x",
                         "http://", "http:///x", f"//{ALLOWED_HOST}/x", f"file:///tmp/{CANARY}",
                         f"{ALLOWED_HOST}/x", "javascript:alert(1)", f"http://[{ALLOWED_HOST}]/",
                         f"http://evil-{ALLOWED_HOST}/", "http://\x00/"]),
        st.text(min_size=1, max_size=30).filter(lambda t: t.strip() and "://" not in t and not t.strip().startswith("//")),
    )  # fmt: skip


def allowed(path: str) -> str:
    return f"http://{ALLOWED_HOST}/{path}"


def valid_manifest() -> dict[str, Any]:
    """A manifest the worker would run (every URL on the allowed, never-resolving host)."""
    return {
        "build_id": "b1",
        "metadata": {"executor_ref": "notebook_cell@v1", "build_id": "b1", "params": {
            "source": "y = x", "timeout_seconds": 20,
            "input_specs": {"x": {"uri": "strata://artifact/a@v=1", "content_type": "json/object"}}}},
        "inputs": [{"artifact_id": "a", "version": 1, "url": allowed("blob/x")}],
        "output": {"url": allowed("upload/k"), "method": "POST"},
        "finalize_url": allowed("finalize/k"),
        "log_url": allowed("log/k"),
        "output_file_url": allowed("output-file/k"),
    }  # fmt: skip


URL_SLOTS = {
    "inputs": ("Manifest input[", lambda m, u: m["inputs"][0].__setitem__("url", u)),
    "output.url": ("Manifest output.url", lambda m, u: m["output"].__setitem__("url", u)),
    "finalize_url": ("Manifest finalize_url", lambda m, u: m.__setitem__("finalize_url", u)),
    "log_url": ("Manifest log_url", lambda m, u: m.__setitem__("log_url", u)),
    "output_file_url": (
        "Manifest output_file_url",
        lambda m, u: m.__setitem__("output_file_url", u),
    ),
}


@FUZZ
@given(data=st.data())
def test_ssrf_every_url_slot_refuses_local_and_odd_urls(
    client: httpx.Client, store: FakeStore, data: st.DataObject
) -> None:
    slot = data.draw(st.sampled_from(sorted(URL_SLOTS)))
    url = data.draw(refused_urls(int(store.url.rsplit(":", 1)[1])))
    label, put = URL_SLOTS[slot]
    manifest = valid_manifest()
    put(manifest, url)
    route = data.draw(st.sampled_from(["/v1/execute-manifest", "/execute"]))
    detail = assert_refused(client.post(route, content=dumps(manifest)))
    assert label in detail, (url, detail)


# Python < 3.11.10 / 3.12.4 counts most of 192.0.0.0/24 (IETF protocol assignments, not
# globally reachable) as global: the URL check must not trust that table alone.
@pytest.mark.parametrize(
    "address", ["192.0.0.8", "192.0.0.100", "192.0.0.255", "[::ffff:192.0.0.8]"]
)
def test_ietf_protocol_assignment_addresses_are_refused(client: httpx.Client, address: str) -> None:
    manifest = valid_manifest()
    manifest["finalize_url"] = f"http://{address}/finalize/k"
    detail = assert_refused(client.post("/v1/execute-manifest", content=dumps(manifest)))
    assert "Manifest finalize_url" in detail


@pytest.mark.parametrize("port", ["99999", "65536", "-1"])
@pytest.mark.parametrize("slot", ["inputs", "finalize_url"])
def test_url_with_an_out_of_range_port_is_400(client: httpx.Client, slot: str, port: str) -> None:
    manifest = valid_manifest()
    URL_SLOTS[slot][1](manifest, f"http://{ALLOWED_HOST}:{port}/x")
    assert URL_SLOTS[slot][0] in assert_refused(
        client.post("/v1/execute-manifest", content=dumps(manifest))
    )


@FUZZ
@given(data=st.data())
def test_random_manifests_are_refused_and_nothing_is_fetched(
    client: httpx.Client, store: FakeStore, data: st.DataObject
) -> None:
    """Random structure, every URL a refused one: 4xx, whatever else is wrong."""
    url = refused_urls(int(store.url.rsplit(":", 1)[1]))
    manifest = valid_manifest()
    for slot in URL_SLOTS.values():
        slot[1](manifest, data.draw(url))
    for _ in range(data.draw(st.integers(0, 3))):
        path = data.draw(st.sampled_from([p for p in paths(manifest) if p]))
        *parent_path, last = path
        parent: Any = manifest
        for key in parent_path:
            parent = parent[key]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[last]
        else:
            parent[last] = data.draw(json_values | url)
    body = data.draw(st.sampled_from(["json", "raw"]))
    content = dumps(manifest) if body == "json" else data.draw(st.binary(max_size=200))
    headers = data.draw(
        st.sampled_from([{}, {"content-type": "application/json"}, {"content-type": "text/plain"}])
    )
    route = data.draw(st.sampled_from(["/v1/execute-manifest", "/execute"]))
    assert_refused(client.post(route, content=content, headers=headers), status=None)


# ---- malformed data in a well-formed request ----------------------------------------------------


def tar_with(*members: tarfile.TarInfo) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.addfile(tarfile.TarInfo("ok.txt"), io.BytesIO(b""))
        for member in members:
            archive.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, (1 if kind == tarfile.REGTYPE else 0)
    return info


def arrow_bytes() -> bytes:
    sink = io.BytesIO()
    table = pa.table({"a": list(range(100))})
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def bad_envelope() -> bytes:
    wrapped = {"__strata_object_codec__": "strata.notebook.object_codec.v1", "codec": "cloudpickle",
               "payload": b"\x80\x05not a pickle"}  # fmt: skip
    return pickle.dumps(wrapped)


MALFORMED_DATA = [
    ("arrow/ipc", b"not arrow at all", "Error deserializing"),
    ("arrow/ipc", arrow_bytes()[:-40], "Error deserializing"),
    ("arrow/ipc", b"", "Error deserializing"),
    ("pickle/object", b"\x80\x05garbage", "Error deserializing"),
    ("pickle/object", pickle.dumps({"a": list(range(50))})[:-7], "Error deserializing"),
    ("pickle/object", bad_envelope(), "Error deserializing"),
    ("json/object", b"{not json", "Error deserializing"),
    ("json/object", b"\xff\xfe\x00", "Error deserializing"),
    ("json/object", b"", "Error deserializing"),
    ("dir/tar", tar_with(member(f"../{CANARY}")), "Refusing to unpack"),
    ("dir/tar", tar_with(member(f"a/../../{CANARY}")), "Refusing to unpack"),
    ("dir/tar", tar_with(member(f"/../{CANARY}")), "Refusing to unpack"),
    ("dir/tar", tar_with(member("link", tarfile.SYMTYPE, "/etc/passwd")), "Refusing to unpack"),
    ("dir/tar", tar_with(member("link", tarfile.SYMTYPE, f"../../{CANARY}")), "Refusing to unpack"),
    ("dir/tar", tar_with(member("hard", tarfile.LNKTYPE, f"../{CANARY}")), "Refusing to unpack"),
    ("dir/tar", tar_with(member("fifo", tarfile.FIFOTYPE)), "Refusing to unpack"),
    ("dir/tar", b"this is not a tar", "Error deserializing"),
]


@pytest.mark.parametrize(("fmt", "data", "error"), MALFORMED_DATA, ids=lambda v: str(v)[:30])
def test_malformed_data_is_a_clear_cell_error(
    client: httpx.Client, fmt: str, data: bytes, error: str
) -> None:
    metadata = dumps({
        "protocol_version": "v1",
        "transform": {"ref": "notebook_cell@v1", "params": {"source": "y = 1", "timeout_seconds": 20}},
        "inputs": [{"name": "value", "format": fmt, "file": "value.bin"}],
    })  # fmt: skip
    started = time.monotonic()
    response = post_form(
        client, "/v1/execute", [file_part("metadata", metadata), file_part("value.bin", data)]
    )
    assert time.monotonic() - started < 20, "malformed data took too long"
    manifest = read_bundle(response).manifest
    assert manifest["success"] is False, manifest
    assert manifest["error"].startswith("Error deserializing value:"), manifest["error"]
    assert error in manifest["error"], manifest["error"]
    assert manifest["traceback"].rstrip().endswith(f"InputError: {manifest['error']}")
    assert manifest["variables"] == {}


# ---- schemathesis: what the OpenAPI schema describes --------------------------------------------


# schemathesis's pytest integration (from_fixture) does not run under pytest 9, so its
# strategies are driven by hypothesis directly, one property over every operation.
@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_openapi_operations_never_5xx(fuzz_worker: WorkerProcess, mode: GenerationMode) -> None:
    api = schemathesis.openapi.from_url(fuzz_worker.url + "/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    labels = {f"{op.method.upper()} {op.path}" for op in operations}
    assert {"POST /v1/execute", "POST /v1/notebook-execute", "POST /v1/execute-manifest"} <= labels
    strategy = st.one_of(*(op.as_strategy(generation_mode=mode) for op in operations))

    @settings(FUZZ, max_examples=2 * EXAMPLES)
    @given(case=strategy)
    def call(case: Any) -> None:
        response = case.call(base_url=fuzz_worker.url, timeout=60)
        event(f"{case.method} {case.path} {response.status_code}")
        where = (case.method, case.formatted_path, response.status_code, response.text[:300])
        assert response.status_code < 500, where
        if response.status_code >= 400:
            detail = response.json().get("detail")
            assert isinstance(detail, str) and detail.strip(), where

    call()
