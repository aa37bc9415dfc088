"""The worker's lifespan: building the app changes nothing in the process, and a close
that fails in the teardown does not keep the others from running (real kernels, real HTTP).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import httpx
import psutil
import pytest
import uvicorn

from kernel_pool import Pool
from kernel_worker.http.app import create_app
from kernel_worker.settings import Settings
from tests.conftest import alive, free_port


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_building_the_app_changes_nothing_in_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRATA_WORKER_TOKEN", "a-token")
    run_root = tmp_path / "not" / "made"
    app = create_app(Settings(run_root=run_root, kernel_uids=(20000, 20009)))
    assert os.environ["STRATA_WORKER_TOKEN"] == "a-token"  # scrubbed by the lifespan only
    assert not run_root.exists() and not (tmp_path / "not").exists()
    state = app.state.worker
    assert state.settings.token == "a-token" and state.settings.run_root == run_root
    assert state.pool.config.env is not None
    assert "STRATA_WORKER_TOKEN" not in state.pool.config.env  # never handed to a kernel


async def test_a_failing_close_in_the_lifespan_still_closes_the_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    app = create_app(Settings(pool_size=1, port=port, run_root=tmp_path, file_reuse_bytes=0))
    pool: Pool = app.state.worker.pool

    async def failing_close() -> None:
        raise RuntimeError("the fleet could not close")

    monkeypatch.setattr(app.state.fleet, "aclose", failing_close)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, lifespan="on", log_config=None, log_level="warning"
    )
    server = uvicorn.Server(config)
    before = _descendants()
    serving = asyncio.create_task(server.serve())
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert not serving.done() and time.monotonic() < deadline, "the worker did not start"
            await asyncio.sleep(0.05)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/ready")).status_code == 200
        started = _descendants() - before  # the kernel and the fork server
        assert started and set(pool.kernel_pids().values()) <= started
        private_dir = pool.private_dir
        assert private_dir is not None and private_dir.is_dir()
        with caplog.at_level(logging.ERROR):
            server.should_exit = True
            await asyncio.wait_for(serving, 60)
        assert "the fleet could not close" in caplog.text  # it failed, and was reported
        assert not [pid for pid in started if alive(pid)], "the pool was not closed"
        assert not private_dir.exists()
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 60)
        await pool.aclose()  # what a teardown that skipped it left
