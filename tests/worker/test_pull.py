"""The pull model over real HTTP: a real worker, real kernels, a fake store on loopback."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

from tests.conftest import WorkerProcess, start_worker
from tests.fake_store import FakeStore

TOKEN = "pull-s3cret"
CAP = 4096
OUTPUT_FORMAT = {"output_format": "notebook-output-bundle@v1"}


@pytest.fixture(scope="module")
def store() -> Iterator[FakeStore]:
    fake = FakeStore()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def puller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    env = {
        "STRATA_WORKER_ALLOW_LOCAL_HOSTS": "1",
        "STRATA_WORKER_MAX_INPUT_BYTES": str(CAP),
        "STRATA_WORKER_TOKEN": TOKEN,
    }
    w = start_worker(tmp_path_factory, "--pool-size", "2", env=env)
    yield w
    w.stop()


@pytest.fixture
def client(puller: WorkerProcess) -> Iterator[httpx.Client]:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=puller.url, timeout=120, headers=auth) as c:
        yield c
    deadline = time.monotonic() + 5  # removed right after the answer has been sent
    while list(puller.run_dir.glob("skw-run-*")):
        assert time.monotonic() < deadline, "a run directory outlived its request"
        time.sleep(0.02)


@pytest.fixture
def key() -> str:
    return uuid.uuid4().hex[:12]


def manifest(
    store: FakeStore,
    key: str,
    source: str,
    inputs: dict[str, tuple[dict[str, Any], bytes]] | None = None,
    *,
    route: str = "blob",
    output: dict[str, Any] | None = None,
    finalize: str = "finalize",
    **extra: Any,
) -> dict[str, Any]:
    """A manifest as the orchestrator sends it; inputs are served by *store* at *route*."""
    entries: list[dict[str, Any]] = []
    specs: dict[str, dict[str, Any]] = {}
    for var, (spec, data) in (inputs or {}).items():
        artifact = f"art-{key}-{var}"
        store.blobs[artifact] = data
        url = f"{store.url}/{route}/{artifact}?X-Signature=abc"
        entries.append({"url": url, "artifact_id": artifact, "version": 3, "expires_at": 2e9})
        specs[var] = {"uri": f"strata://artifact/{artifact}@v=3", **spec}
    params = {"source": source, "timeout_seconds": 60.0, "mounts": [], "env": {},
              "input_specs": specs, "output_format": "notebook-output-bundle@v1",
              "_dispatch_mode": "external"}  # fmt: skip
    params.update(extra.pop("params", {}))
    raw_post = {"url": f"{store.url}/upload/{key}", "max_bytes": 1 << 30, "expires_at": 2e9}
    body = {
        "build_id": f"nbbuild-{key}",
        "metadata": {
            "build_id": f"nbbuild-{key}",
            "artifact_id": f"nb_remote_{key}",
            "version": 1,
            "executor_ref": "notebook_cell@v1",
            "params": params,
            "notebook_id": "nb",
            "cell_id": "c1",
        },
        "inputs": entries,
        "output": output or raw_post,
        "finalize_url": f"{store.url}/{finalize}/{key}?sig=1",
    }
    body.update(extra)
    return body


def arrow_stream(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def detail(response: httpx.Response) -> str:
    value = response.json()["detail"]
    assert isinstance(value, str)
    return value


# -- the happy paths ------------------------------------------------------------------------------


def test_health_advertises_the_pull_model(client: httpx.Client) -> None:
    assert client.get("/health").json()["capabilities"]["features"]["pull_model"] is True


def test_json_input_round_trip(client: httpx.Client, store: FakeStore, key: str) -> None:
    body = manifest(
        store, key, "result = value + 1", {"value": ({"content_type": "json/object"}, b"2")}
    )
    response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    upload = store.uploads[key]
    assert answer == {
        "success": True,
        "build_id": f"nbbuild-{key}",
        "byte_size": len(upload.body),
        "protocol_version": "notebook-build-manifest@v1",
        "finalize": {"build_id": key, "state": "ready", "artifact_uri": f"strata://{key}"},
    }
    finalized = store.finalized[key]
    assert finalized.body == OUTPUT_FORMAT and finalized.problem is None
    assert upload.method == "POST" and upload.form == "raw"
    assert upload.headers["content-type"] == "application/x-tar"
    assert upload.headers["content-length"] == str(len(upload.body))
    bundle = store.bundle(key)
    assert bundle.manifest["success"] is True
    assert bundle.manifest["variables"]["result"]["preview"] == 3


def test_arrow_input(client: httpx.Client, store: FakeStore, key: str) -> None:
    table = pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    inputs = {"df": ({"content_type": "arrow/ipc"}, arrow_stream(table))}
    source = "n = len(df)\ntotal = int(df['a'].sum())\nlabels = ''.join(df['b'])"
    response = client.post("/v1/execute-manifest", json=manifest(store, key, source, inputs))
    assert response.status_code == 200, response.text
    variables = store.bundle(key).manifest["variables"]
    assert variables["n"]["preview"] == 3
    assert variables["total"]["preview"] == 6
    assert variables["labels"]["preview"] == "xyz"


def test_injected_value_of_a_module_cell_is_downloaded_by_its_own_uri(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    module = {"module_name": f"nb_test_cell_scaled_{key}", "symbol_name": "scaled",
              "kind": "function", "source": "def scaled(x):\n    return x * factor\n",
              "provenance_hash": "abc"}  # fmt: skip
    store.blobs[f"inj-{key}"] = b"10"
    spec = {"content_type": "module/cell", "injected": {"factor": {
        "content_type": "json/object", "uri": f"strata://artifact/inj-{key}@v=1"}}}  # fmt: skip
    body = manifest(store, key, "y = scaled(4)", {"scaled": (spec, json.dumps(module).encode())})
    body["inputs"].append(
        {"url": f"{store.url}/blob/inj-{key}", "artifact_id": f"inj-{key}", "version": 1}
    )
    response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 200, response.text
    bundle = store.bundle(key)
    assert bundle.manifest["success"], bundle.manifest
    assert bundle.manifest["variables"]["y"]["preview"] == 40
    assert f"/blob/inj-{key}" in store.fetched


def test_presigned_multipart_upload(client: httpx.Client, store: FakeStore, key: str) -> None:
    fields = {"key": f"builds/{key}.tar", "policy": "eyJ4IjoxfQ==", "x-amz-signature": "f00d"}
    output = {"url": f"{store.url}/form/{key}", "fields": fields, "method": "POST"}
    response = client.post(
        "/v1/execute-manifest", json=manifest(store, key, "x = 7", output=output)
    )
    assert response.status_code == 200, response.text
    upload = store.uploads[key]
    assert upload.form == "multipart" and upload.fields == fields
    assert upload.filename == "bundle.tar" and upload.file_type == "application/x-tar"
    assert response.json()["byte_size"] == len(upload.body)
    assert store.finalized[key].problem is None
    assert store.bundle(key).manifest["variables"]["x"]["preview"] == 7


def test_put_upload_with_headers(client: httpx.Client, store: FakeStore, key: str) -> None:
    output = {"url": f"{store.url}/upload/{key}", "method": "PUT",
              "headers": {"x-ms-blob-type": "BlockBlob", "Content-Type": "text/plain"}}  # fmt: skip
    response = client.post(
        "/v1/execute-manifest", json=manifest(store, key, "x = 8", output=output)
    )
    assert response.status_code == 200, response.text
    upload = store.uploads[key]
    assert upload.method == "PUT" and upload.form == "raw"
    assert upload.headers["x-ms-blob-type"] == "BlockBlob"
    assert upload.headers["content-type"] == "application/x-tar"  # ours wins, sent once
    assert upload.headers["content-length"] == str(len(upload.body))
    assert store.finalized[key].problem is None


def test_cell_exception_is_uploaded_and_finalized(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    source = "print('before')\nraise ValueError('boom')"
    response = client.post("/v1/execute-manifest", json=manifest(store, key, source))
    assert response.status_code == 200, response.text
    assert response.json()["success"] is True
    assert store.finalized[key].problem is None
    bundle = store.bundle(key)
    assert bundle.manifest["success"] is False
    assert "boom" in bundle.manifest["error"]
    assert bundle.members["stdout.txt"] == b"before\n"


def test_alias_route_takes_a_body_without_content_type(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    body = json.dumps(manifest(store, key, "x = 5")).encode()
    response = client.post("/execute", content=body)
    assert response.status_code == 200, response.text
    assert response.json()["build_id"] == f"nbbuild-{key}"
    assert store.bundle(key).manifest["variables"]["x"]["preview"] == 5


# -- the live console -----------------------------------------------------------------------------


def test_log_url_receives_ordered_chunks(client: httpx.Client, store: FakeStore, key: str) -> None:
    source = (
        "import sys, time\n"
        "for i in range(4):\n"
        "    print(f'line {i}', flush=True)\n"
        "    time.sleep(0.2)\n"
        "sys.stderr.write('warned\\n'); sys.stderr.flush()\n"
    )
    body = manifest(store, key, source, log_url=f"{store.url}/log/{key}?token=t")
    response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 200, response.text
    chunks = store.logs[key]
    stdout = [(seq, text) for stream, seq, text in chunks if stream == "stdout"]
    stderr = [(seq, text) for stream, seq, text in chunks if stream == "stderr"]
    assert [seq for seq, _ in stdout] == list(range(len(stdout))) and len(stdout) >= 2
    assert [seq for seq, _ in stderr] == list(range(len(stderr))) and stderr
    bundle = store.bundle(key)
    assert "".join(text for _, text in stdout) == bundle.members["stdout.txt"].decode()
    assert "".join(text for _, text in stderr) == bundle.members["stderr.txt"].decode()
    assert bundle.members["stdout.txt"] == b"line 0\nline 1\nline 2\nline 3\n"


@pytest.mark.slow
def test_slow_log_server_drops_chunks_but_never_the_bundle(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    # 300 lines 10 ms apart: they reach the worker as separate chunks even on a busy
    # machine (a tight loop's lines can arrive merged into fewer chunks than the queue
    # holds), while the log server takes 50 ms per chunk.
    source = "import time\nfor i in range(300):\n    print(i, flush=True)\n    time.sleep(0.01)\n"
    body = manifest(store, key, source, log_url=f"{store.url}/slow-log/{key}")
    response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 200, response.text
    expected = "".join(f"{i}\n" for i in range(300))
    assert store.bundle(key).members["stdout.txt"].decode() == expected
    seqs = [seq for stream, seq, _ in store.logs.get(key, []) if stream == "stdout"]
    assert seqs == sorted(seqs) and seqs[:1] == [0]
    # the queue is bounded: chunks were dropped, each still using its seq number
    assert len(seqs) < seqs[-1] + 1, "expected gaps in seq where chunks were dropped"


# -- failures -------------------------------------------------------------------------------------


def test_timeout_is_408_with_nothing_uploaded(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    body = manifest(store, key, "import time\ntime.sleep(30)", params={"timeout_seconds": 1})
    response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 408, response.text
    assert key not in store.uploads and key not in store.finalized


def test_declared_input_beyond_the_cap_is_413(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    inputs = {"big": ({"content_type": "pickle/object"}, b"x" * (CAP + 1))}
    response = client.post("/v1/execute-manifest", json=manifest(store, key, "y = 1", inputs))
    assert response.status_code == 413
    uri = f"strata://artifact/art-{key}-big@v=3"
    assert (
        detail(response) == f"Notebook input {uri} declared {CAP + 1} bytes, exceeds {CAP}-byte cap"
    )
    assert key not in store.uploads


def test_streamed_input_beyond_the_cap_is_413(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    inputs = {"big": ({"content_type": "pickle/object"}, b"x" * (CAP * 3))}
    body = manifest(store, key, "y = 1", inputs, route="chunked")
    response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 413
    uri = f"strata://artifact/art-{key}-big@v=3"
    assert detail(response) == f"Notebook input {uri} exceeds {CAP}-byte cap during download"


def test_missing_input_is_502(client: httpx.Client, store: FakeStore, key: str) -> None:
    inputs = {"gone": ({"content_type": "json/object"}, b"1")}
    body = manifest(store, key, "y = gone", inputs, route="missing")
    response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 502
    uri = f"strata://artifact/art-{key}-gone@v=3"
    assert detail(response) == f"Failed to download notebook input {uri}: 404"
    assert response.json()["success"] is False
    assert key not in store.uploads


def test_redirected_input_is_refused_not_followed(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    inputs = {"moved": ({"content_type": "json/object"}, b"1")}
    body = manifest(store, key, "y = moved", inputs, route="redirect")
    response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 502
    uri = f"strata://artifact/art-{key}-moved@v=3"
    assert (
        detail(response)
        == f"Failed to download notebook input {uri}: 302 (redirects are not followed)"
    )
    assert f"/blob/art-{key}-moved" not in store.fetched


def test_a_cancel_once_the_bundle_is_on_its_way_cancels_nothing_and_says_so(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    output = {"url": f"{store.url}/upload-slow/{key}", "max_bytes": 1 << 30, "expires_at": 2e9}
    body = manifest(store, key, "x = 1", output=output)
    answered: dict[str, httpx.Response] = {}
    run = threading.Thread(
        target=lambda: answered.update(r=client.post("/v1/execute-manifest", json=body))
    )
    run.start()
    deadline = time.monotonic() + 30
    while key not in store.uploads_started:
        assert time.monotonic() < deadline, "the bundle never reached the store"
        time.sleep(0.02)
    cancel = client.post(f"/v1/executions/nbbuild-{key}/cancel")
    assert cancel.json() == {"build_id": f"nbbuild-{key}", "cancelled": False}
    run.join(60)
    assert answered["r"].status_code == 200, answered["r"].text
    assert key in store.finalized


def test_a_run_fetching_its_inputs_is_provisioning_not_queued(
    tmp_path_factory: pytest.TempPathFactory, store: FakeStore, key: str
) -> None:
    env = {"STRATA_WORKER_ALLOW_LOCAL_HOSTS": "1"}
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--queue-wait", "0.3", "--queue-depth", "1", env=env
    )
    try:
        inputs = {"v": ({"content_type": "json/object"}, b"[" + b"1, " * 1000 + b"1]")}
        body = manifest(store, key, "n = len(v)", inputs, route="slow")
        with httpx.Client(base_url=w.url, timeout=60) as c:
            accepted = c.post("/v1/execute-manifest", json=body)
            assert accepted.status_code == 202, accepted.text
            # a kernel is free: the run is fetching its input, not waiting in line
            assert accepted.json()["state"] == "provisioning"
            assert "position" not in accepted.json()
            assert c.get("/health").json()["queue_depth"] == 0
            # but it will wait for a kernel next: it holds a place against --queue-depth
            other = manifest(store, key + "b", "n = len(v)", inputs, route="slow")
            full = c.post("/v1/execute-manifest", json=other)
            assert full.status_code == 503, full.text
            assert "queue is full" in full.json()["detail"]
            deadline = time.monotonic() + 30
            while (poll := c.get(accepted.json()["job_url"]).json())["state"] != "finished":
                assert poll["state"] in {"provisioning", "queued", "running"}, poll
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert poll["status_code"] == 200 and poll["result"]["success"] is True
        assert store.bundle(key).manifest["variables"]["n"]["preview"] == 1001
    finally:
        w.stop()


def test_failed_upload_is_502_and_not_finalized(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    output = {"url": f"{store.url}/upload-fail/{key}", "method": "POST"}
    response = client.post(
        "/v1/execute-manifest", json=manifest(store, key, "x = 1", output=output)
    )
    assert response.status_code == 502
    assert detail(response) == "Failed to upload notebook bundle output: 500 (store is down)"
    assert key not in store.finalized


def test_redirected_upload_is_502(client: httpx.Client, store: FakeStore, key: str) -> None:
    output = {"url": f"{store.url}/redirect/{key}", "method": "PUT"}
    response = client.post(
        "/v1/execute-manifest", json=manifest(store, key, "x = 1", output=output)
    )
    assert response.status_code == 502
    assert detail(response) == (
        "Failed to upload notebook bundle output: 307 (redirects are not followed)"
    )


def test_refused_finalize_is_502(client: httpx.Client, store: FakeStore, key: str) -> None:
    body = manifest(store, key, "x = 1", finalize="finalize-fail")
    response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 502
    assert detail(response) == "Failed to finalize notebook bundle build: 400 (build was cancelled)"
    assert store.finalized[key].body == OUTPUT_FORMAT  # it was asked, with the exact body


def test_unreachable_finalize_is_a_transfer_failure(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/finalize"
        body = manifest(store, key, "x = 1", finalize_url=dead)
        response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 502
    assert detail(response).startswith("Notebook bundle transfer failed: ")


# -- validation (spec §3.4 step 1, in the reference's order) ---------------------------------------


def _bad(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    target = body
    *parents, last = path.split(".")
    for name in parents:
        target = target[name]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return body


BAD_FIELDS: list[tuple[str, Any, str]] = [
    ("metadata", [], "Manifest metadata must be an object"),
    ("metadata.executor_ref", "other@v2", "Unsupported executor ref: other@v2. Expected: notebook_cell@v1"),
    ("metadata.executor_ref", KeyError, "Unsupported executor ref: . Expected: notebook_cell@v1"),
    ("metadata.params", "x", "Manifest params must be an object"),
    ("inputs", {}, "Manifest inputs must be a list"),
    ("inputs", ["x"], "Manifest input entry must be an object"),
    ("inputs", [{"artifact_id": "a", "url": "http://h/x"}], "Manifest input entry is incomplete"),
    ("inputs", [{"artifact_id": "a", "url": "http://h/x", "version": "1"}], "Manifest input entry is incomplete"),
    ("inputs", [{"artifact_id": "", "url": "http://h/x", "version": 1}], "Manifest input entry is incomplete"),
    ("inputs", [{"artifact_id": "a", "url": "ftp://h/x", "version": 1}],
     "Manifest input[a@v=1] URL uses disallowed scheme 'ftp'; only ['http', 'https'] are accepted."),
    ("output", [], "Manifest output must be an object"),
    ("output.url", "", "Manifest is missing upload/finalize URLs"),
    ("finalize_url", KeyError, "Manifest is missing upload/finalize URLs"),
    ("output.url", "http:///x", "Manifest output.url URL is missing a host: 'http:///x'"),
    ("finalize_url", "file:///etc/passwd",
     "Manifest finalize_url URL uses disallowed scheme 'file'; only ['http', 'https'] are accepted."),
    ("log_url", "javascript:alert(1)",
     "Manifest log_url URL uses disallowed scheme 'javascript'; only ['http', 'https'] are accepted."),
    ("output_file_url", "gopher://h/",
     "Manifest output_file_url URL uses disallowed scheme 'gopher'; only ['http', 'https'] are accepted."),
    ("metadata.params.input_specs", [], "inputs must be an object"),
    ("metadata.params.mounts", "x", "mounts must be a list"),
    ("metadata.params.input_specs", {"v": {"content_type": "json/object"}}, "Manifest input spec for v is missing uri"),
    ("metadata.params.input_specs", {"v": {"uri": "strata://artifact/zz@v=9"}},
     "Manifest does not include a signed URL for strata://artifact/zz@v=9"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "value", "expected"), BAD_FIELDS)
def test_invalid_manifests_are_400(
    client: httpx.Client, store: FakeStore, key: str, path: str, value: Any, expected: str
) -> None:
    body = _bad(manifest(store, key, "x = 1"), path, value)
    response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 400, response.text
    assert detail(response) == expected
    assert key not in store.uploads and key not in store.finalized


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"{not json", "Invalid manifest payload: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (b"", "Invalid manifest payload: Expecting value: line 1 column 1 (char 0)"),
        (b"[1, 2]", "Manifest payload must be an object"),
    ],
)  # fmt: skip
def test_unparsable_manifests_are_400(client: httpx.Client, raw: bytes, expected: str) -> None:
    response = client.post("/v1/execute-manifest", content=raw)
    assert response.status_code == 400
    assert detail(response) == expected


def test_without_allow_local_a_loopback_url_is_refused(
    worker: WorkerProcess, store: FakeStore, key: str
) -> None:
    inputs = {"value": ({"content_type": "json/object"}, b"1")}
    body = manifest(store, key, "y = value", inputs)
    with httpx.Client(base_url=worker.url, timeout=60) as plain:
        response = plain.post("/v1/execute-manifest", json=body)
    assert response.status_code == 400
    assert detail(response) == (
        f"Manifest input[art-{key}-value@v=3] URL host '127.0.0.1' resolves to "
        "non-routable address 127.0.0.1; refusing to fetch"
    )
    assert not [path for path in store.fetched if key in path]


# -- the token gate -------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/v1/execute-manifest", "/execute"])
def test_token_gate_on_both_routes(
    puller: WorkerProcess, store: FakeStore, key: str, route: str
) -> None:
    body = manifest(store, key, "x = 1")
    with httpx.Client(base_url=puller.url, timeout=60) as anonymous:
        missing = anonymous.post(route, json=body)
        wrong = anonymous.post(route, json=body, headers={"Authorization": "Bearer nope"})
    assert missing.status_code == 401 and wrong.status_code == 401
    assert detail(missing) == "Missing or malformed Authorization header (expected Bearer token)"
    assert detail(wrong) == "Invalid worker token"
    assert key not in store.uploads


def test_output_dir_files_stream_to_output_file_url(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    store.refuse_paths.add("refused.txt")
    source = (
        "# @output_dir plots\n# @output_dir empty\n"
        "(plots / 'a.txt').write_text('alpha')\n"
        "(plots / 'refused.txt').write_text('kept in the bundle')\n"
        "(plots / 'sub').mkdir()\n(plots / 'sub' / 'b.bin').write_bytes(b'12345')\n"
    )
    body = manifest(store, key, source, output_file_url=f"{store.url}/output-file/{key}?sig=2")
    response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 200, response.text
    assert store.output_files[key] == {
        ("plots", "a.txt"): b"alpha",
        ("plots", "sub/b.bin"): b"12345",
    }
    bundle = store.bundle(key)
    manifest_json = bundle.manifest
    # every declared folder is named, an empty one with no paths (as the reference lists it)
    assert manifest_json["output_dirs_streamed"] == {"empty": [], "plots": ["a.txt", "sub/b.bin"]}
    assert manifest_json["output_dirs"] == {"empty": {}, "plots": {"refused.txt": 18}}
    assert bundle.members["dirs/plots/refused.txt"] == b"kept in the bundle"
    assert "dirs/plots/a.txt" not in bundle.members


def test_an_output_folder_swapped_for_a_link_streams_nothing(
    client: httpx.Client, store: FakeStore, key: str, tmp_path: Path
) -> None:
    """The output folder is the cell's: a link it puts in its place (to a folder only the
    worker may read) is not followed, so nothing from there is uploaded or bundled."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.txt").write_text("not the cell's")
    source = (
        f"# @output_dir plots\nimport os\nos.rmdir(plots)\nos.symlink({str(elsewhere)!r}, plots)\n"
    )
    body = manifest(store, key, source, output_file_url=f"{store.url}/output-file/{key}?sig=2")
    response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 200, response.text
    assert store.output_files.get(key, {}) == {}
    bundle = store.bundle(key)
    assert bundle.manifest["output_dirs"] == {"plots": {}}
    assert not [name for name in bundle.members if name.startswith("dirs/")]
