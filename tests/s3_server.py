"""A real S3-compatible server for the mount tests: moto's standalone server on loopback.

It runs as a subprocess (``python -m moto.server``), so its state and its botocore
patches stay out of the test process. Readiness is read from the server's own log line,
not polled for; a thread keeps draining its log so a chatty server never blocks on a full
pipe, and records each request line of its access log (:meth:`S3Server.requests_so_far`:
what reached it). :meth:`S3Server.stop` ends exactly the process it started, by its PID.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from typing import IO, Any

import boto3  # type: ignore[import-untyped]

from .conftest import stop_process

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


# the access log's request line (coloured by status: an escape sequence may come first)
_REQUEST_LINE = re.compile(r'"(?:\x1b\[[\d;]*m)*([A-Z]+ \S+ HTTP/[\d.]+)')


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class S3Server:
    """``moto.server`` on ``127.0.0.1:<free port>``; use as a context manager."""

    def __init__(self, *, startup_seconds: float = 60.0) -> None:
        self.port = _free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._startup_seconds = startup_seconds
        self._ready = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._drain: threading.Thread | None = None
        self.log_tail: list[str] = []
        self._requests: list[str] = []  # every request line it logged ("GET /b HTTP/1.1")
        self._logged = threading.Condition()

    def start(self) -> None:
        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        assert self._proc.stderr is not None
        self._drain = threading.Thread(target=self._read_log, args=(self._proc.stderr,))
        self._drain.start()
        if not self._ready.wait(self._startup_seconds) or self._proc.poll() is not None:
            self.stop()
            raise RuntimeError("moto server did not start:\n" + "".join(self.log_tail))

    def _read_log(self, stream: IO[str]) -> None:
        for line in stream:  # ends at EOF, when the server exits
            self.log_tail = [*self.log_tail[-20:], line]
            if request := _REQUEST_LINE.search(line):
                with self._logged:
                    self._requests.append(request.group(1))
                    self._logged.notify_all()
            if "Running on" in line:
                self._ready.set()
        self._ready.set()  # wake start() if the server died before it was ready

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc, 15)
        if self._drain is not None:
            self._drain.join(timeout=15)
            self._drain = None
        if proc is not None and proc.stderr is not None:
            proc.stderr.close()

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- talking to it, independently of the code under test ---

    def client(self) -> Any:
        """A boto3 S3 client for this server (test credentials, path-style)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def storage_options(self) -> dict[str, object]:
        """fsspec/s3fs options that reach this server: what an operator puts in a credential
        (``STRATA_NOTEBOOK_CREDENTIALS``); a request's mount ``options`` may not name them."""
        return {
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": REGION},
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
        }

    def requests_so_far(self, timeout_seconds: float = 30.0) -> list[str]:
        """Every request this server has received until now, as access-log request lines.

        The log is written after each answer and read by another thread, so a marker
        request is sent and waited for: everything logged before it is complete.
        """
        marker = f"/skw-marker-{uuid.uuid4().hex}"
        with contextlib.suppress(urllib.error.HTTPError):  # moto: no such bucket
            urllib.request.urlopen(f"{self.endpoint_url}{marker}", timeout=timeout_seconds)
        with self._logged:
            seen = self._logged.wait_for(
                lambda: any(f" {marker} " in line for line in self._requests), timeout_seconds
            )
            assert seen, "the marker request never reached the server's log"
            return [line for line in self._requests if "/skw-marker-" not in line]

    def credential_environ(self, name: str = "moto") -> dict[str, str]:
        """A worker environment whose ``s3://`` mounts reach this server by default, as an
        operator configures it: a named credential, the scheme default naming it."""
        return {
            "STRATA_NOTEBOOK_CREDENTIALS": json.dumps({name: self.storage_options()}),
            "STRATA_NOTEBOOK_MOUNT_CREDENTIALS": json.dumps({"s3": name}),
        }

    def make_bucket(self, objects: Mapping[str, bytes] | None = None) -> str:
        """A new uniquely named bucket holding *objects* (key -> bytes); its name."""
        name = f"b-{uuid.uuid4().hex[:16]}"
        client = self.client()
        client.create_bucket(Bucket=name)
        for key, body in (objects or {}).items():
            client.put_object(Bucket=name, Key=key, Body=body)
        return name

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=body)

    def get(self, bucket: str, key: str) -> bytes:
        body: bytes = self.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    def keys(self, bucket: str) -> set[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return {obj["Key"] for page in pages for obj in page.get("Contents", [])}
