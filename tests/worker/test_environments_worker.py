"""Cells in their notebook's locked environment, through a real worker: warm kernels of the
environment's own interpreter and packages, built once, 202 while a build runs, the
reference's 500s, and what /health and /metrics say."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import WorkerProcess, kernel_uid_unavailable, start_worker
from tests.envfixtures import (  # noqa: F401
    LockedProject,
    Projects,
    gated_build_worker,
    lock_project,
    projects_fixture,
    py312_fixture,
    uv_fixture,
)
from tests.wire import execute, read_bundle, run_ok, v1_metadata

ENV_CELL = (
    "import sys, six\n"
    "minor = '%d.%d' % sys.version_info[:2]\n"
    "six_version = six.__version__\n"
    "prefix = sys.prefix\n"
)


@pytest.fixture(scope="module")
def env_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("worker-envs")


@pytest.fixture(scope="module")
def env_worker(
    tmp_path_factory: pytest.TempPathFactory, env_root: Path, py312: Path, uv: str
) -> Iterator[WorkerProcess]:
    """A worker whose environments go to ``env_root``; Python 3.12 is on its PATH."""
    path = f"{py312.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    worker = start_worker(
        tmp_path_factory, "--pool-size", "1", "--env-root", str(env_root),
        "--queue-wait", "1", "--max-kernels", "3", env={"PATH": path},
    )  # fmt: skip
    yield worker
    worker.stop()


def wait_for_bundle(client: httpx.Client, response: httpx.Response) -> httpx.Response:
    """The answer to ``response``'s cell, polling its job while it was answered 202."""
    if response.status_code != 202:
        return response
    job_url = response.json()["job_url"]
    deadline = time.monotonic() + 600
    while True:
        assert time.monotonic() < deadline, "the job never finished"
        polled = client.get(job_url)
        json_body = polled.headers.get("content-type", "").startswith("application/json")
        if not (json_body and polled.json().get("state") in ("queued", "running")):
            return polled
        time.sleep(0.2)


def failure(response: httpx.Response) -> tuple[int, str]:
    """The status and error of a failed cell, answered inline or to a poll (200 with the
    status in the body)."""
    body = response.json()
    if response.status_code == 200 and body.get("state") == "failed":
        return body["status_code"], body["error"]
    assert body["success"] is False, body
    return response.status_code, body["error"]


def test_health_advertises_locked_environments(env_worker: WorkerProcess) -> None:
    body = httpx.get(env_worker.url + "/health").json()
    assert body["capabilities"]["features"]["locked_environments"] is True
    assert body["environments"]["enabled"] is True


def test_a_cell_runs_warm_in_its_locked_environment(
    env_worker: WorkerProcess, projects: Projects, env_root: Path
) -> None:
    environment = projects.basic.raw()
    with httpx.Client(base_url=env_worker.url, timeout=600) as client:
        first = read_bundle(
            wait_for_bundle(client, execute(client, ENV_CELL, environment=environment))
        )
        assert first.manifest["success"], first.manifest
        values = {name: json.loads(first.file(name)) for name in ("minor", "six_version", "prefix")}
        assert values["minor"] == "3.12"  # the environment's interpreter, not the worker's
        assert values["six_version"] == "1.16.0"  # the lock's pin
        assert Path(values["prefix"]).resolve().is_relative_to(env_root.resolve())
        key = first.manifest["environment"]["key"]
        assert first.manifest["environment"]["installed"] is True
        # the worker's own packages are not the environment's
        missing = read_bundle(execute(client, "import pandas", environment=environment))
        assert missing.manifest["success"] is False
        assert "No module named 'pandas'" in missing.manifest["error"]
        # warm after: the same pool, reset between requests, nothing built again
        second = run_ok(client, "leftover = 'x'\nimport six", environment=environment)
        assert second.manifest["environment"] == {"key": key, "installed": False}
        third = run_ok(client, "seen = 'leftover' in globals()", environment=environment)
        assert json.loads(third.file("seen")) is False
        # the worker's own environment is untouched beside it
        own = run_ok(client, "import sys\nminor = '%d.%d' % sys.version_info[:2]")
        assert "environment" not in own.manifest
        assert json.loads(own.file("minor")) != "" and own.manifest["success"]
        health = client.get("/health").json()["environments"]
    assert health["prepared"].get("built", 0) + health["prepared"].get("fetched", 0) == 1
    assert len(health["pools"]) == 1 and health["pools"][0]["kernels"] == 1
    assert health["on_disk"] >= 1 and health["disk_bytes"] > 0


def test_cells_that_ask_at_once_share_one_build_and_may_get_a_202(
    env_worker: WorkerProcess, projects: Projects
) -> None:
    environment = projects.other.raw()
    with httpx.Client(base_url=env_worker.url, timeout=600) as client:
        before = client.get("/health").json()["environments"]["prepared"]

        def one(_: int) -> httpx.Response:
            response = execute(client, "import six\nv = six.__version__", environment=environment)
            return wait_for_bundle(client, response)

        with concurrent.futures.ThreadPoolExecutor(3) as threads:
            answers = list(threads.map(one, range(3)))
        after = client.get("/health").json()["environments"]["prepared"]
    for answer in answers:
        bundle = read_bundle(answer)
        assert json.loads(bundle.file("v")) == "1.17.0"
    built = after.get("built", 0) - before.get("built", 0)
    assert built == 1, (before, after)


def test_a_first_request_that_must_build_is_answered_202_and_polled(
    env_worker: WorkerProcess, projects: Projects
) -> None:
    environment = projects.old_traitlets.raw()
    with httpx.Client(base_url=env_worker.url, timeout=600) as client:
        response = execute(
            client, "import traitlets\nv = traitlets.__version__", environment=environment
        )
        assert response.status_code == 202, response.text  # a build takes longer than --queue-wait
        bundle = read_bundle(wait_for_bundle(client, response))
    assert json.loads(bundle.file("v")) == "5.9.0"  # the lock's pin beats the kernel's own


def test_a_key_that_does_not_match_its_lock_is_the_references_500(
    env_worker: WorkerProcess, projects: Projects
) -> None:
    environment = {**projects.basic.raw(), "key": "0" * 64}
    with httpx.Client(base_url=env_worker.url, timeout=60) as client:
        response = execute(client, "x = 1", environment=environment)
        assert response.status_code == 500
        body = response.json()
        assert body["success"] is False
        assert body["error"] == (
            "locked environment: environment.lockfile does not match environment.key"
        )
        bad = execute(client, "x = 1", environment="not an object")
        assert bad.status_code == 500
        assert bad.json()["error"] == "locked environment: environment must be an object"


def test_a_lock_that_needs_a_source_build_is_refused_with_its_name(
    env_worker: WorkerProcess, projects: Projects
) -> None:
    with httpx.Client(base_url=env_worker.url, timeout=600) as client:
        response = wait_for_bundle(
            client, execute(client, "x = 1", environment=projects.sdist.raw())
        )
        status, error = failure(response)
    assert status == 500
    assert error.startswith("locked environment: ")
    assert "tinypkg" in error and "--allow-source-builds on" in error


def test_an_incompatible_pin_is_a_clear_500_and_the_environment_is_left_alone(
    env_worker: WorkerProcess, projects: Projects, env_root: Path
) -> None:
    environment = projects.ancient_traitlets.raw()
    with httpx.Client(base_url=env_worker.url, timeout=600) as client:
        response = wait_for_bundle(client, execute(client, "x = 1", environment=environment))
        status, error = failure(response)
    assert status == 500
    assert error.startswith("locked environment: ") and "traitlets" in error


def test_metrics_show_environments(env_worker: WorkerProcess, projects: Projects) -> None:
    with httpx.Client(base_url=env_worker.url, timeout=600) as client:
        for _ in range(2):  # built (or found), then cached
            response = execute(client, "import six", environment=projects.basic.raw())
            assert read_bundle(wait_for_bundle(client, response)).manifest["success"]
        text = client.get("/metrics").text
    assert 'strata_kernel_worker_environments_prepared_total{origin="cached"}' in text
    assert "strata_kernel_worker_environment_pools " in text


def test_locked_environments_off(
    tmp_path_factory: pytest.TempPathFactory, projects: Projects
) -> None:
    worker = start_worker(tmp_path_factory, "--pool-size", "1", "--locked-environments", "off")
    try:
        with httpx.Client(base_url=worker.url, timeout=60) as client:
            features = client.get("/health").json()["capabilities"]["features"]
            assert features["locked_environments"] is False
            response = execute(client, "x = 1", environment=projects.basic.raw())
        assert response.status_code == 500
        assert response.json()["error"] == (
            "locked environment: locked environments are turned off on this worker"
        )
    finally:
        worker.stop()


def test_a_failed_build_fails_every_waiter_with_its_message(
    env_worker: WorkerProcess, projects: Projects
) -> None:
    """Cells that wait on one build that fails all get its message; the next cell tries
    again (and fails the same way: nothing half-made is trusted)."""
    environment = projects.ancient_traitlets.raw()
    with httpx.Client(base_url=env_worker.url, timeout=600) as client:

        def one(_: int) -> tuple[int, str]:
            return failure(
                wait_for_bundle(client, execute(client, "x = 1", environment=environment))
            )

        with concurrent.futures.ThreadPoolExecutor(3) as threads:
            answers = list(threads.map(one, range(4)))
    assert {status for status, _ in answers} == {500}
    assert len({error for _, error in answers}) == 1, answers
    assert "traitlets==4.3.3" in answers[0][1]


def test_a_cancel_while_the_environment_builds_stops_the_wait(
    tmp_path_factory: pytest.TempPathFactory, uv: str, py312: Path, tmp_path: Path
) -> None:
    """The cancel route answers a cell still waiting on its build: 409 to its poll, at
    once, while the build (held at a gate here) goes on, and a later cell finds it."""
    with gated_build_worker(tmp_path_factory, tmp_path, uv, py312, "cancelled") as gated:
        project = gated.project
        with httpx.Client(base_url=gated.worker.url, timeout=600) as client:
            metadata = {**v1_metadata("import idna", environment=project.raw()), "build_id": "b1"}
            waiting = execute(client, "", metadata=metadata)
            assert waiting.status_code == 202, waiting.text
            assert client.post("/v1/executions/b1/cancel").status_code == 200
            status, error = failure(wait_for_bundle(client, waiting))
            assert (status, error) == (409, "execution was cancelled")
            assert client.get("/health").json()["status"] == "healthy"
            gated.gate.touch()  # the build goes on: the next cell gets the environment
            cell = "import idna\nv = idna.__version__"
            later = wait_for_bundle(client, execute(client, cell, environment=project.raw()))
            assert json.loads(read_bundle(later).file("v")) == "3.7"
        assert len(gated.counter.read_text().split()) == 1  # built once, for both


def test_kernels_of_an_environment_run_as_their_own_uids(
    tmp_path_factory: pytest.TempPathFactory, projects: Projects, py312: Path, uv: str
) -> None:
    """Security stays as it is: with ``--kernel-user FIRST-LAST`` an environment's kernels
    run as uids of the range, from the scrubbed environment, like the worker's own."""
    first = 64300
    reason = kernel_uid_unavailable(first)
    if reason is not None:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="skw-envs-"))  # reachable by the kernels' uids
    root.chmod(0o755)
    runs = Path(tempfile.mkdtemp(prefix="skw-test-runs-"))
    runs.chmod(0o711)
    path = f"{py312.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    worker = start_worker(
        tmp_path_factory, "--pool-size", "1", "--env-root", str(root), "--env-pool-size", "1",
        "--kernel-user", f"{first}-{first + 5}",
        env={"PATH": path, "STRATA_WORKER_TOKEN": "t0ken-for-env-uids"}, run_dir=runs,
    )  # fmt: skip
    headers = {"Authorization": "Bearer t0ken-for-env-uids"}
    cell = "import os, six\nuid = os.getuid()\ntoken = os.environ.get('STRATA_WORKER_TOKEN')\n"
    try:
        with httpx.Client(base_url=worker.url, timeout=600, headers=headers) as client:
            env_run = read_bundle(
                wait_for_bundle(client, execute(client, cell, environment=projects.basic.raw()))
            )
            assert env_run.manifest["success"], env_run.manifest
            own = run_ok(client, "import os\nuid = os.getuid()")
        uid = json.loads(env_run.file("uid"))
        assert first <= uid <= first + 5
        assert uid != json.loads(own.file("uid"))  # kernels of two pools: two uids
        assert json.loads(env_run.file("token")) is None
    finally:
        worker.stop()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(runs, ignore_errors=True)


FORK_CELL = (
    "import sys, importlib\n"
    "forked = sys.flags.no_site == 1\n"  # only the shared template runs without site
    "executable = sys.executable\n"
    "prefix = sys.prefix\n"
    "module = importlib.import_module(NAME)\n"
    "version = module.__version__\n"
    "where = module.__file__\n"
)


def _fork_facts(client: httpx.Client, project: LockedProject, name: str) -> dict[str, object]:
    response = execute(client, f"NAME = {name!r}\n" + FORK_CELL, environment=project.raw())
    bundle = read_bundle(wait_for_bundle(client, response))
    assert bundle.manifest["success"], bundle.manifest
    names = ("forked", "executable", "prefix", "version", "where")
    return {n: json.loads(bundle.file(n)) for n in names}


def test_environments_fork_from_a_shared_template_unless_a_pin_conflicts(
    env_worker: WorkerProcess, projects: Projects, env_root: Path
) -> None:
    with httpx.Client(base_url=env_worker.url, timeout=600) as client:
        basic = _fork_facts(client, projects.basic, "six")
        other = _fork_facts(client, projects.other, "six")
        pinned = _fork_facts(client, projects.old_traitlets, "traitlets")
    # two environments, one template (six is not among what it imported): each kernel
    # imports its own environment's six, and is that environment's interpreter
    for facts, version in ((basic, "1.16.0"), (other, "1.17.0")):
        assert facts["forked"] is True
        assert facts["version"] == version
        prefix = Path(str(facts["prefix"]))
        assert prefix.parent == env_root and str(facts["where"]).startswith(str(prefix))
        assert facts["executable"] == str(prefix / "bin" / "python")
    assert basic["prefix"] != other["prefix"]
    # a lock pinning what the template imported at another version: spawned, its pin
    assert pinned["forked"] is False
    assert pinned["version"] == "5.9.0"
    assert str(pinned["where"]).startswith(str(pinned["prefix"]))
