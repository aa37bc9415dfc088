"""Large bundles written while they are sent (BundleStream), alone and through the worker."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from typing import BinaryIO

import httpx
import pyarrow as pa
import pytest

from kernel_worker.protocol.streaming import BundleStream
from tests.conftest import WorkerProcess, start_worker
from tests.wire import first_block_stored, read_bundle, run_ok, v1_metadata


async def collect(stream: BundleStream) -> list[bytes]:
    return [chunk async for chunk in stream.chunks()]


async def test_the_chunks_are_what_the_writer_wrote() -> None:
    pieces = [b"a" * 10, b"b" * 5000, bytes(range(256)) * 40, b"c" * 3000, b"d"]

    def write(fh: BinaryIO) -> None:
        for piece in pieces:
            fh.write(piece)

    counted: list[int] = []
    chunks = await collect(BundleStream(write, on_bytes=counted.append, chunk_bytes=4096))
    assert b"".join(chunks) == b"".join(pieces)
    assert counted == [len(chunk) for chunk in chunks]


async def test_small_writes_are_gathered_and_big_ones_go_as_they_are() -> None:
    big = b"B" * 3000

    def write(fh: BinaryIO) -> None:
        for _ in range(100):
            fh.write(b"s" * 100)  # under a quarter chunk: gathered
        fh.write(big)  # a quarter chunk or more: handed over as is

    chunks = await collect(BundleStream(write, chunk_bytes=4096))
    assert b"".join(chunks) == b"s" * 10_000 + big
    assert [len(c) for c in chunks] == [4100, 4100, 1800, 3000]  # from 4096 on, a chunk goes
    assert chunks[-1] is big


async def test_a_writer_is_never_more_than_depth_chunks_ahead() -> None:
    handed = 0
    ahead: list[int] = []
    consumed = 0

    def write(fh: BinaryIO) -> None:
        nonlocal handed
        for _ in range(40):
            fh.write(b"x" * 1000)  # one chunk each
            handed += 1
            ahead.append(handed - consumed)

    stream = BundleStream(write, chunk_bytes=1000, depth=3)
    async for _chunk in stream.chunks():
        await asyncio.sleep(0.002)  # a slow client
        consumed += 1
    assert consumed == 40
    assert max(ahead) <= 3 + 1  # the slots, plus the chunk just written


async def test_a_writer_failure_comes_after_what_it_wrote() -> None:
    def write(fh: BinaryIO) -> None:
        fh.write(b"first part")
        raise OSError("files/x: unexpected end of data")

    received: list[bytes] = []
    with pytest.raises(OSError, match="unexpected end of data"):
        async for chunk in BundleStream(write, chunk_bytes=4).chunks():
            received.append(chunk)
    assert b"".join(received) == b"first part"


async def test_closing_early_stops_the_writer() -> None:
    threads: list[threading.Thread] = []

    def write(fh: BinaryIO) -> None:
        threads.append(threading.current_thread())
        while True:  # an endless bundle: only the reader can end it
            fh.write(b"y" * 100)

    stream = BundleStream(write, chunk_bytes=100, depth=2)
    chunks = stream.chunks()
    assert await anext(chunks) == b"y" * 100
    await chunks.aclose()
    assert threads and not threads[0].is_alive()  # joined before aclose returned
    with pytest.raises(RuntimeError, match="read once"):
        await anext(stream.chunks())


async def test_a_reader_cancelled_twice_still_waits_for_the_writer() -> None:
    """Cancelled once, the reader stops the writer and waits for it; cancelled again
    meanwhile (a shutdown), it still ends only after the writer has."""
    threads: list[threading.Thread] = []
    reading = asyncio.Event()

    def write(fh: BinaryIO) -> None:
        threads.append(threading.current_thread())
        fh.write(b"y" * 100)
        time.sleep(0.4)  # a large file read before the next write
        fh.write(b"z" * 100)

    async def reader() -> None:
        async for _ in BundleStream(write, chunk_bytes=100, depth=1).chunks():
            reading.set()

    task = asyncio.create_task(reader())
    await reading.wait()
    await asyncio.sleep(0.05)  # waiting for the next chunk
    task.cancel()
    await asyncio.sleep(0.05)  # waiting for the writer to stop
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert threads and not threads[0].is_alive()


# -- through the worker --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = start_worker(tmp_path_factory, "--pool-size", "1")
    try:
        yield w
    finally:
        w.stop()  # fails if any run directory was left behind


def post(client: httpx.Client, source: str) -> httpx.Request:
    files = {
        "metadata": ("metadata.json", json.dumps(v1_metadata(source)).encode(), "application/json")
    }
    return client.build_request("POST", "/v1/execute", files=files)


def test_large_bundles_are_sent_as_they_are_written(worker: WorkerProcess) -> None:
    source = (
        "import hashlib, os\n"
        "noise = os.urandom(5_000_000)\n"
        "digest = hashlib.sha256(noise).hexdigest()"
    )
    with httpx.Client(base_url=worker.url, timeout=60) as client:
        response = client.send(post(client, source))
        assert response.status_code == 200
        # incompressible, so stored: its length is known before it is written
        assert response.headers["content-length"] == str(len(response.content))
        assert first_block_stored(response.content)
        bundle = read_bundle(response)
        assert bundle.manifest["success"], bundle.manifest
        digest = bundle.variables["digest"]["preview"]
        table = pa.ipc.open_stream(bundle.file("noise")).read_all()  # bytes travel as Arrow
        data = table.column(0)[0].as_py()
        assert len(data) == 5_000_000 and hashlib.sha256(data).hexdigest() == digest
        small = client.send(post(client, "x = 1"))  # small bundles keep their length
        assert small.headers.get("content-length") == str(len(small.content))
        text = client.send(post(client, "text = 'a,b,c\\n1,2,3\\n' * 300_000"))
        assert text.headers.get("transfer-encoding") == "chunked"  # deflated: length unknown
        assert "content-length" not in text.headers and not first_block_stored(text.content)
        assert read_bundle(text).variables["text"]["content_type"]


def test_a_client_leaving_mid_bundle_stops_it_and_frees_everything(worker: WorkerProcess) -> None:
    source = "blob = bytes(300_000_000)"
    with httpx.Client(base_url=worker.url, timeout=60) as client:
        with client.stream("POST", "/v1/execute", files={
            "metadata": ("metadata.json", json.dumps(v1_metadata(source)).encode(), "application/json")
        }) as response:  # fmt: skip
            assert response.status_code == 200
            first = next(response.iter_raw(1 << 20))
            assert first[:2] == b"\x1f\x8b"  # the gzip stream had begun
        # the response is closed unread: the worker stops writing and removes the run dir
        deadline = time.monotonic() + 20
        while list(worker.run_dir.glob("skw-run-*")):
            assert time.monotonic() < deadline, "the abandoned bundle's run directory stayed"
            time.sleep(0.05)
        assert run_ok(client, "ok = 2").variables["ok"]["preview"] == 2
        metrics = client.get("/metrics").text
    sent = [
        line
        for line in metrics.splitlines()
        if line.startswith("strata_kernel_worker_bundle_bytes_total")
    ]
    assert sent, metrics[:500]
    assert float(sent[0].split()[-1]) < 300_000_000  # what was not sent is not counted


def test_a_bundle_fetched_by_polling_streams_too(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A job answered with 202 hands over its large bundle on the poll, streamed."""
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--spares", "0", "--queue-wait", "0.05")
    try:
        with httpx.Client(base_url=w.url, timeout=60) as client:
            busy = threading.Thread(target=lambda: run_ok(client, "import time\ntime.sleep(1.5)"))
            busy.start()  # the only kernel is taken: the next cell waits in the queue
            deadline = time.monotonic() + 10
            while client.get("/health").json()["pool"]["kernels"].get("busy", 0) < 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            accepted = client.send(post(client, "import os\nb = os.urandom(3_000_000)"))
            busy.join()
            assert accepted.status_code == 202, accepted.text
            url = accepted.json()["job_url"]
            deadline = time.monotonic() + 30
            while (
                (polled := client.get(url))
                .headers.get("content-type", "")
                .startswith("application/json")
            ):
                assert polled.json()["state"] in ("queued", "running"), polled.text
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert polled.headers["content-length"] == str(len(polled.content))
            bundle = read_bundle(polled)
            assert len(bundle.file("b")) > 3_000_000
    finally:
        w.stop()
