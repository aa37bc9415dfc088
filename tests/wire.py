"""Test helpers that speak the wire format: build execute requests, read bundles.

Every bundle a test reads through :func:`read_bundle` (or the fake store's
``open_bundle``) is read the way a stream reader reads it, once with ``tarfile`` in stream
mode and once with ``tar`` from a pipe, and its seed-page index is checked against its
members: a bundle only a seeking reader could read fails the test that made it.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx


def v1_metadata(
    source: str, inputs: list[dict[str, Any]] | None = None, **params: Any
) -> dict[str, Any]:
    return {
        "protocol_version": "v1",
        "transform": {"ref": "notebook_cell@v1", "params": {"source": source, **params}},
        "inputs": inputs or [],
    }


@dataclass
class Bundle:
    status: int
    headers: httpx.Headers
    manifest: dict[str, Any]
    members: dict[str, bytes]

    @property
    def variables(self) -> dict[str, Any]:
        return self.manifest["variables"]

    def stdout(self) -> str:
        return self.members["stdout.txt"].decode()

    def stderr(self) -> str:
        return self.members["stderr.txt"].decode()

    def file(self, name: str) -> bytes:
        return self.members[self.variables[name]["file"]]


def read_bundle(response: httpx.Response) -> Bundle:
    assert response.status_code == 200, response.text
    members = stream_members(response.content)
    manifest = json.loads(members["manifest.json"])
    check_seed_index(manifest, members)
    return Bundle(response.status_code, response.headers, manifest, members)


def stream_members(data: bytes) -> dict[str, bytes]:
    """The members of the gzipped bundle *data*, read in one pass as a stream reader does
    (``tarfile``'s ``r|gz``: no seeking back, so no link could be resolved). Each must be a
    regular file with its own bytes, named once; GNU ``tar -xzf - -O`` reading *data* from
    a pipe must succeed and give the same bytes, member after member."""
    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|gz") as tar:
        for info in tar:
            assert info.isreg(), f"bundle member {info.name} is not a regular file ({info.type!r})"
            assert info.name not in members, f"bundle member {info.name} appears twice"
            extracted = tar.extractfile(info)
            assert extracted is not None
            members[info.name] = extracted.read()
            assert len(members[info.name]) == info.size, info.name
    assert _TAR is not None, "tar is needed to check that bundles read from a pipe"
    piped = subprocess.run(
        [_TAR, "-xzf", "-", "-O"], input=data, capture_output=True, timeout=60, check=False
    )
    assert piped.returncode == 0, piped.stderr.decode(errors="replace")
    assert piped.stdout == b"".join(members.values()), "tar from a pipe read other bytes"
    return members


_TAR = shutil.which("tar")


def check_seed_index(manifest: dict[str, Any], members: dict[str, bytes]) -> None:
    """The seed page's index (``outputs[]``, ``display[]``, ``console``) names members that
    are there, with the sizes it gives; each output's member is its variable's own file."""
    for output in manifest.get("outputs", []):
        assert len(members[output["file"]]) == output["bytes"], output
        assert output["file"] == manifest["variables"][output["name"]]["file"], output
    for display in manifest.get("display", []):
        assert len(members[display["file"]]) == display["bytes"], display
    assert manifest.get("console", "console.json") in members


def execute(
    client: httpx.Client,
    source: str,
    inputs: list[tuple[dict[str, Any], bytes]] | None = None,
    *,
    route: str = "/v1/execute",
    metadata: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    **params: Any,
) -> httpx.Response:
    """POST a cell; ``inputs`` are (descriptor, bytes) pairs, parts named by the file name."""
    descriptors = [d for d, _ in inputs or []]
    meta = metadata if metadata is not None else v1_metadata(source, descriptors, **params)
    files: list[tuple[str, tuple[str, bytes, str]]] = [
        ("metadata", ("metadata.json", json.dumps(meta).encode(), "application/json"))
    ]
    for descriptor, data in inputs or []:
        part = descriptor.get("file") or descriptor["name"]
        files.append((part, (part, data, "application/octet-stream")))
    return client.post(route, files=files, headers=headers or {})


def run_ok(client: httpx.Client, source: str, *args: Any, **kwargs: Any) -> Bundle:
    bundle = read_bundle(execute(client, source, *args, **kwargs))
    assert bundle.manifest["success"], bundle.manifest
    return bundle


def first_block_stored(gz: bytes) -> bool:
    """Whether a gzip stream (no optional header fields) starts with a stored deflate block:
    its BTYPE bits are 00, where a deflated stream has 01 or 10."""
    assert gz[:2] == b"\x1f\x8b" and gz[3] == 0, "a gzip stream without optional fields"
    return (gz[10] >> 1) & 0b11 == 0


class Background:
    """A cell sent from a thread (``execute``'s arguments); :meth:`response` waits for it."""

    def __init__(self, client: httpx.Client, source: str, **kwargs: Any) -> None:
        self._answer: list[httpx.Response] = []
        self._thread = threading.Thread(
            target=lambda: self._answer.append(execute(client, source, **kwargs))
        )
        self._thread.start()

    def response(self, seconds: float = 30.0) -> httpx.Response:
        self._thread.join(seconds)
        assert self._answer, "the request in the background never got its answer"
        return self._answer[0]


def running_cell(source: str, build_id: str) -> dict[str, Any]:
    """A cell's metadata that prints ``running`` first (see :func:`wait_running`)."""
    return v1_metadata(f"print('running', flush=True)\n{source}") | {"build_id": build_id}


def wait_running(
    client: httpx.Client,
    build_id: str,
    seconds: float = 15.0,
    headers: dict[str, str] | None = None,
) -> None:
    """Wait (bounded) until the cell of ``build_id`` (sent with :func:`running_cell`'s
    metadata) runs on its kernel: its console shows the line it printed first."""
    deadline = time.monotonic() + seconds
    while True:
        console = client.get(f"/v1/executions/{build_id}/console", headers=headers or {})
        if console.status_code == 200 and "running" in console.json()["stdout"]["text"]:
            return
        assert time.monotonic() < deadline, f"the cell never ran: {console.text}"
        time.sleep(0.02)


def wait_active(client: httpx.Client, count: int = 1, seconds: float = 10.0) -> None:
    """Wait (bounded) until the worker has ``count`` executions admitted."""
    deadline = time.monotonic() + seconds
    while client.get("/health").json()["active_executions"] < count:
        assert time.monotonic() < deadline, "the execution was never admitted"
        time.sleep(0.02)
