"""A fake object store and orchestrator for the pull model, served over real HTTP.

It serves input blobs (with a Content-Length, or chunked), takes bundle uploads in the
three forms a manifest can ask for (raw POST, presigned multipart POST with fields, PUT
with headers), finalizes builds by validating the uploaded bundle, records console
chunks, and fails on demand (404 input, redirect, 500 upload, 400 finalize, slow log, slow upload).
Everything it receives is recorded for the tests to assert on.

Runs uvicorn on 127.0.0.1 in a background thread; the listening socket is bound before
the thread starts, so clients may connect at once (the backlog holds them).
"""

from __future__ import annotations

import asyncio
import json
import socket
import tarfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from .wire import check_seed_index, stream_members

SCHEMA_VERSION = "notebook-output-bundle@v1"


@dataclass
class Upload:
    method: str
    form: str  # "raw" or "multipart"
    headers: dict[str, str]
    body: bytes
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    file_type: str | None = None


@dataclass
class Finalize:
    key: str
    body: Any
    problem: str | None  # why the stored bundle is invalid, or None


@dataclass
class StoredBundle:
    manifest: dict[str, Any]
    members: dict[str, bytes]


def open_bundle(data: bytes) -> StoredBundle:
    """The manifest and members of a gzipped bundle, read as a stream reader reads it (a
    member that is not a regular file with its own bytes fails the test)."""
    members = stream_members(data)
    manifest = json.loads(members["manifest.json"])
    check_seed_index(manifest, members)
    return StoredBundle(manifest, members)


def bundle_problem(data: bytes) -> str | None:
    """Why *data* is not a valid bundle (what a store's finalize checks), or None."""
    try:
        bundle = open_bundle(data)
    except (tarfile.TarError, KeyError, ValueError, AssertionError) as exc:
        return f"unreadable bundle: {exc!r}"
    if bundle.manifest.get("schema_version") != SCHEMA_VERSION:
        return f"schema_version is {bundle.manifest.get('schema_version')!r}"
    for name, entry in bundle.manifest.get("variables", {}).items():
        if "file" in entry and entry["file"] not in bundle.members:
            return f"variable {name}: member {entry['file']} is missing"
    return None


class FakeStore:
    """Start with :meth:`start`, stop with :meth:`stop` (or use it as a context manager);
    ``url`` is its base URL."""

    def __init__(self, *, slow_log_seconds: float = 0.05) -> None:
        self.blobs: dict[str, bytes] = {}
        self.fetched: list[str] = []  # paths of input GETs
        self.hosts: list[str] = []  # their Host headers
        self.uploads: dict[str, Upload] = {}
        self.finalized: dict[str, Finalize] = {}
        self.logs: dict[str, list[tuple[str, int, str]]] = {}
        # output-folder files: key -> {(folder, path): body}; names in refuse_paths get 403
        self.output_files: dict[str, dict[tuple[str, str], bytes]] = {}
        self.refuse_paths: set[str] = set()
        self.slow_log_seconds = slow_log_seconds
        self.slow_upload_seconds = 3.0
        self.slow_blob_seconds = 3.0
        self.uploads_started: set[str] = set()  # keys whose slow upload has arrived
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app(), lifespan="off", ws="none", log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]})
        self._thread.start()

    def stop(self) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "fake store did not stop"

    def __enter__(self) -> FakeStore:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def bundle(self, key: str) -> StoredBundle:
        return open_bundle(self.uploads[key].body)

    # -- the app ---------------------------------------------------------------------------

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/blob/{name}", self._blob, methods=["GET"]),
                Route("/chunked/{name}", self._chunked, methods=["GET"]),
                Route("/slow/{name}", self._slow_blob, methods=["GET"]),
                Route("/missing/{name}", self._missing, methods=["GET"]),
                Route("/redirect/{name}", self._redirect, methods=["GET", "POST", "PUT"]),
                Route("/upload/{key}", self._upload_raw, methods=["POST", "PUT"]),
                Route("/form/{key}", self._upload_form, methods=["POST"]),
                Route("/upload-fail/{key}", self._upload_fail, methods=["POST", "PUT"]),
                Route("/upload-slow/{key}", self._upload_slow, methods=["POST", "PUT"]),
                Route("/finalize/{key}", self._finalize, methods=["POST"]),
                Route("/finalize-fail/{key}", self._finalize_fail, methods=["POST"]),
                Route("/log/{key}", self._log, methods=["POST"]),
                Route("/output-file/{key}", self._output_file, methods=["POST"]),
                Route("/slow-log/{key}", self._slow_log, methods=["POST"]),
            ]
        )

    def _record_fetch(self, request: Request) -> None:
        with self._lock:
            self.fetched.append(request.url.path)
            self.hosts.append(request.headers.get("host", ""))

    async def _blob(self, request: Request) -> Response:
        self._record_fetch(request)
        name = request.path_params["name"]
        if name not in self.blobs:
            return JSONResponse({"detail": "no such blob"}, status_code=404)
        return Response(self.blobs[name], media_type="application/octet-stream")

    async def _slow_blob(self, request: Request) -> Response:
        """A blob sent in ten pieces over ``slow_blob_seconds``."""
        self._record_fetch(request)
        data = self.blobs[request.path_params["name"]]
        step = len(data) // 10 + 1

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(data), step):
                await asyncio.sleep(self.slow_blob_seconds / 10)
                yield data[start : start + step]

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    async def _chunked(self, request: Request) -> Response:
        self._record_fetch(request)
        data = self.blobs[request.path_params["name"]]

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(data), 1000):
                yield data[start : start + 1000]

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    async def _missing(self, request: Request) -> Response:
        self._record_fetch(request)
        return JSONResponse({"detail": "no such blob"}, status_code=404)

    async def _redirect(self, request: Request) -> Response:
        self._record_fetch(request)
        target = f"/blob/{request.path_params['name']}"
        return RedirectResponse(target, status_code=307 if request.method != "GET" else 302)

    async def _upload_raw(self, request: Request) -> Response:
        body = await request.body()
        upload = Upload(request.method, "raw", dict(request.headers), body)
        with self._lock:
            self.uploads[request.path_params["key"]] = upload
        return Response(status_code=201)

    async def _upload_slow(self, request: Request) -> Response:
        """An upload that is received at once and acknowledged ``slow_upload_seconds`` later."""
        body = await request.body()
        with self._lock:
            self.uploads_started.add(request.path_params["key"])
        await asyncio.sleep(self.slow_upload_seconds)
        with self._lock:
            self.uploads[request.path_params["key"]] = Upload(
                request.method, "raw", dict(request.headers), body
            )
        return Response(status_code=201)

    async def _upload_form(self, request: Request) -> Response:
        fields: dict[str, str] = {}
        upload = Upload("POST", "multipart", dict(request.headers), b"")
        async with request.form(max_part_size=1024 * 1024) as form:
            for name, value in form.multi_items():
                if isinstance(value, UploadFile):
                    assert name == "file", name
                    upload.body = await value.read()
                    upload.filename = value.filename
                    upload.file_type = value.content_type
                else:
                    fields[name] = value
        upload.fields = fields
        with self._lock:
            self.uploads[request.path_params["key"]] = upload
        return Response(status_code=204)

    async def _upload_fail(self, request: Request) -> Response:
        await request.body()
        return JSONResponse({"detail": "store is down"}, status_code=500)

    async def _finalize(self, request: Request) -> Response:
        key = request.path_params["key"]
        body = await request.json()
        with self._lock:
            upload = self.uploads.get(key)
        problem = "nothing was uploaded" if upload is None else bundle_problem(upload.body)
        with self._lock:
            self.finalized[key] = Finalize(key, body, problem)
        if problem is not None:
            return JSONResponse({"detail": problem}, status_code=422)
        return JSONResponse({"build_id": key, "state": "ready", "artifact_uri": f"strata://{key}"})

    async def _finalize_fail(self, request: Request) -> Response:
        key = request.path_params["key"]
        body = await request.json()
        with self._lock:
            self.finalized[key] = Finalize(key, body, "refused")
        return JSONResponse({"detail": "build was cancelled"}, status_code=400)

    async def _log(self, request: Request) -> Response:
        key = request.path_params["key"]
        text = (await request.body()).decode("utf-8")
        stream = request.query_params["stream"]
        seq = int(request.query_params["seq"])
        with self._lock:
            self.logs.setdefault(key, []).append((stream, seq, text))
        return JSONResponse({"delivered": True}, status_code=202)

    async def _output_file(self, request: Request) -> Response:
        key = request.path_params["key"]
        folder, path = request.query_params["folder"], request.query_params["path"]
        body = await request.body()
        if path in self.refuse_paths:
            return JSONResponse({"detail": "not accepted"}, status_code=403)
        with self._lock:
            self.output_files.setdefault(key, {})[(folder, path)] = body
        return JSONResponse({"stored": True}, status_code=201)

    async def _slow_log(self, request: Request) -> Response:
        await asyncio.sleep(self.slow_log_seconds)
        return await self._log(request)
