"""The client and ``strata-kernel-worker run`` while a cell waits or runs, and what ``run``
prints and saves: busy workers waited out, the live console, the last value, the outputs,
hints in the command's own terms, a saved manifest whose paths exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernel_worker.client.session import Client, Progress
from tests.conftest import ROOT, WorkerProcess, start_worker
from tests.envfixtures import (  # noqa: F401
    gated_build_worker,
    py312_fixture,
    uv_fixture,
)
from tests.wire import Background, execute, read_bundle, v1_metadata, wait_active

WAIT_FOR_FILE = (
    "import os, time\n"
    "print('tick', flush=True)\n"
    "deadline = time.monotonic() + 60\n"
    "while not os.path.exists({path!r}) and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
    "print('done')\n"
)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One kernel, one execution at a time: a second cell is answered 503 + Retry-After."""
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--max-concurrent", "1")
    yield w
    w.stop()


def _cli(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernel_worker", "run", *args],
        cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, **env},
    )  # fmt: skip


def _popen(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kernel_worker", "run", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _console(w: WorkerProcess, build_id: str) -> httpx.Response:
    return httpx.get(f"{w.url}/v1/executions/{build_id}/console", timeout=10)


@pytest.mark.slow
def test_a_busy_worker_is_waited_out_and_said_so(single: WorkerProcess, tmp_path: Path) -> None:
    """``run`` holds the only execution slot until a file appears (its console shown live);
    a second cell from the client is answered 503 + Retry-After, reported, and sent again
    until it runs."""
    release = tmp_path / "release"
    cell = tmp_path / "hold.py"
    cell.write_text(WAIT_FOR_FILE.format(path=str(release)))
    first = _popen(str(cell), "--url", single.url, "--timeout", "90")
    try:
        assert first.stdout is not None
        assert first.stdout.readline() == "tick\n"  # shown live: the cell is still running
        reports: list[Progress] = []
        results: list[Any] = []
        refused = threading.Event()

        def on_progress(progress: Progress) -> None:
            reports.append(progress)
            if progress.state == "busy":
                refused.set()

        def second() -> None:
            with Client(single.url, on_progress=on_progress) as client:
                results.append(client.run("z = 6 * 7", timeout_seconds=30))

        sender = threading.Thread(target=second)
        sender.start()
        try:
            assert first.stderr is not None  # its status line, while the cell still runs
            assert first.stderr.readline().startswith("[running: ")
            assert refused.wait(60), "the second cell was never refused"
        finally:
            release.touch()
            sender.join()
        out, err = first.communicate(timeout=60)
        (result,) = results
        assert result.raise_for_error().outputs["z"] == 42
        busy = [r for r in reports if r.state == "busy"]
        assert busy and "running 1 of 1 executions" in str(busy[0].detail)
        assert busy[0].retry_in_seconds is not None and busy[0].retry_in_seconds > 0
    finally:
        release.touch()
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err
    assert out == "done\n"  # 'tick' was read above; nothing printed twice


def test_run_says_a_busy_worker_is_waited_for(single: WorkerProcess, tmp_path: Path) -> None:
    release = tmp_path / "release"
    with httpx.Client(base_url=single.url, timeout=120) as http:
        holder = Background(http, WAIT_FOR_FILE.format(path=str(release)), timeout_seconds=90)
        try:
            wait_active(http, 1, 60)
            cell = tmp_path / "second.py"
            cell.write_text("y = 1\ny")
            proc = _popen(str(cell), "--url", single.url)
            assert proc.stderr is not None
            line = proc.stderr.readline()  # the first thing it says: the worker is busy
            release.touch()
            out, err = proc.communicate(timeout=60)
        finally:
            release.touch()
            holder.response(60)
    assert proc.returncode == 0, line + err
    assert line.startswith("[worker busy: Worker is running 1 of 1 executions; sending the cell")
    assert out == "1\n"


def test_run_prints_the_last_value_and_a_line_per_output(worker: WorkerProcess) -> None:
    proc = _cli(
        "-", "--url", worker.url,
        stdin="import pandas as pd\ny = 6 * 7\nframe = pd.DataFrame({'a': [1, 2]})\ny",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "42\n"
    lines = proc.stderr.splitlines()
    assert "output y: json/object = 42" in lines
    (frame,) = [line for line in lines if line.startswith("output frame: ")]
    assert "arrow" in frame and "2 rows" in frame
    assert not [line for line in lines if line.startswith("output _")]


def _file_fields(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("file", "stdout_file", "stderr_file", "console") and isinstance(value, str):
                yield value
            else:
                yield from _file_fields(value)
    elif isinstance(node, list):
        for item in node:
            yield from _file_fields(item)


def test_the_saved_manifest_names_paths_that_exist(worker: WorkerProcess, tmp_path: Path) -> None:
    cell = (
        "import matplotlib.pyplot as plt\nfrom IPython.display import HTML, display\n"
        "y = 6 * 7\ntext = 'hi'\nprint('out')\nplt.plot([1, 2])\nplt.show()\n"
        "display(HTML('<b>x</b>'))\ny"
    )
    out = tmp_path / "out"
    proc = _cli("-", "--url", worker.url, "--out", str(out), stdin=cell)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    named = sorted(set(_file_fields(manifest)))
    assert len(named) >= 5, named  # outputs, displays, stdout, stderr, console
    missing = [path for path in named if not (out / path).is_file()]
    assert not missing, f"the manifest names {missing}, not under {out}"
    assert json.loads((out / "files" / "y.json").read_text()) == 42


def test_a_timeout_hint_names_the_flag(worker: WorkerProcess) -> None:
    proc = _cli("-", "--url", worker.url, "--timeout", "0.5", stdin="import time\ntime.sleep(30)")
    assert proc.returncode == 3
    assert "--timeout" in proc.stderr and "@timeout" not in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def token_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", env={"STRATA_WORKER_TOKEN": "progress-token"}
    )
    yield w
    w.stop()


def test_a_token_hint_names_the_variable(token_worker: WorkerProcess) -> None:
    without = {k: v for k, v in os.environ.items() if k != "STRATA_WORKER_TOKEN"}
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_worker", "run", "-", "--url", token_worker.url],
        cwd=ROOT, input="x = 1", capture_output=True, text=True, timeout=120, check=False,
        env=without,
    )  # fmt: skip
    assert proc.returncode == 3
    assert "set STRATA_WORKER_TOKEN" in proc.stderr, proc.stderr
    wrong = _cli("-", "--url", token_worker.url, stdin="x = 1", STRATA_WORKER_TOKEN="nope")
    assert wrong.returncode == 3 and "STRATA_WORKER_TOKEN" in wrong.stderr, wrong.stderr
    right = _cli(
        "-", "--url", token_worker.url, stdin="x = 1", STRATA_WORKER_TOKEN="progress-token"
    )
    assert right.returncode == 0, right.stderr


def test_the_console_route_of_a_running_cell(single: WorkerProcess, tmp_path: Path) -> None:
    """What the watchers read: state, elapsed time, and the console after an offset."""
    release = tmp_path / "release"
    source = WAIT_FOR_FILE.format(path=str(release))
    metadata = {**v1_metadata(source, timeout_seconds=90), "build_id": "watched-build"}
    with httpx.Client(base_url=single.url, timeout=120) as http:
        request = Background(http, source, metadata=metadata)
        try:
            body: dict[str, Any] = {}
            for _ in range(1200):
                answer = _console(single, "watched-build")
                body = answer.json() if answer.status_code == 200 else {}
                if body.get("stdout", {}).get("text"):
                    break
                threading.Event().wait(0.05)
            assert body["state"] == "running" and body["elapsed_seconds"] >= 0
            assert body["stdout"] == {"text": "tick\n", "start": 0, "end": 5}
            later = http.get("/v1/executions/watched-build/console", params={"stdout": 5}).json()
            assert later["stdout"] == {"text": "", "start": 5, "end": 5}
        finally:
            release.touch()
            assert request.response(60).status_code == 200
    assert _console(single, "watched-build").status_code == 404  # ended: nothing runs by it


@pytest.mark.parametrize("offset", ["x", "-1", "1.5", "", "9" * 40])
def test_a_console_offset_that_is_not_a_whole_number_is_a_400(
    worker: WorkerProcess, offset: str
) -> None:
    answer = httpx.get(worker.url + "/v1/executions/b/console", params={"stdout": offset})
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("stdout must be a character offset")


def test_a_build_says_what_it_is_doing(
    tmp_path_factory: pytest.TempPathFactory, uv: str, py312: Path, tmp_path: Path
) -> None:
    """A cell waiting on its locked environment's build (held at a gate here): its job poll
    and the console route name the phase; Strata's client shows the poll's ``detail``."""
    with gated_build_worker(tmp_path_factory, tmp_path, uv, py312, "phase") as gated:
        worker, project, gate = gated.worker, gated.project, gated.gate
        with httpx.Client(base_url=worker.url, timeout=600) as client:
            cell = "import idna\nv = idna.__version__"
            metadata = {**v1_metadata(cell, environment=project.raw()), "build_id": "built"}
            waiting = execute(client, "", metadata=metadata)
            assert waiting.status_code == 202, waiting.text
            polled = client.get(waiting.json()["job_url"]).json()
            assert polled["state"] == "queued"
            assert polled["phase"] == polled["detail"] == "building environment"
            watched = _console(worker, "built").json()
            assert (watched["state"], watched["phase"]) == ("queued", "building environment")
            gate.touch()
            job_url = waiting.json()["job_url"]
            for _ in range(6000):
                answer = client.get(job_url)
                if not answer.headers["content-type"].startswith("application/json"):
                    break
                assert "phase" not in answer.json() or answer.json()["state"] == "queued"
                threading.Event().wait(0.1)
            assert json.loads(read_bundle(answer).file("v")) == "3.7"
