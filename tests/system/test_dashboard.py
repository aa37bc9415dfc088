"""The Grafana dashboard against a real Prometheus scraping real workers under load.

Prometheus (Debian's package, installed by ``.ci/run``) scrapes the ``--metrics-port`` of
two workers every second: ``front``, which takes the load and has ``back`` as its peer, and
``back``, which holds a job whose polls ``front`` forwards. The load covers every panel:
cells that succeed, raise and time out (a retirement), ``202`` answers, a cell in a locked
environment (its pool), polls forwarded to a peer that holds the job or to none, a
forwarded cancel. Then every query of every panel of ``deploy/grafana/``'s dashboard, with
Grafana's variables filled in, is sent to Prometheus's HTTP API and must return data.
The Kubernetes ConfigMap must hold the same dashboard.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kernel_worker.client import CellTimeout, Client
from tests.conftest import ROOT, WorkerProcess, free_port, start_worker, stop_process
from tests.envfixtures import lock_project, py312_fixture, uv_fixture  # noqa: F401
from tests.wire import execute, v1_metadata

pytestmark = pytest.mark.timeout(180)

DASHBOARD = ROOT / "deploy" / "grafana" / "strata-kernel-worker.json"
CONFIGMAP = ROOT / "deploy" / "kubernetes" / "monitoring" / "grafana-dashboard.yaml"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning" / "strata-kernel-worker.yaml"
#: what Grafana puts in place of each variable the queries use
VARIABLES = {"$__rate_interval": "30s", "$job": ".*", "$instance": ".*"}


def _prometheus() -> str | None:
    found = shutil.which("prometheus") or "/usr/bin/prometheus"
    return found if os.access(found, os.X_OK) else None


PROMETHEUS = _prometheus()


def _panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def _queries() -> list[tuple[str, str]]:
    """(panel title, PromQL with the variables filled in) for every target of every panel."""
    found = []
    for panel in _panels():
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            found.append((panel["title"], expr))
    return found


# -- the files alone ---------------------------------------------------------------------------


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    assert defined == {"datasource", "job", "instance"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in _panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$\w+", target["expr"]))
            assert used <= {"$__rate_interval", "$job", "$instance"}, (panel["title"], used)
            assert 'job=~"$job", instance=~"$instance"' in target["expr"], panel["title"]


def test_the_configmap_holds_the_same_dashboard() -> None:
    (configmap,) = [d for d in yaml.safe_load_all(CONFIGMAP.read_text()) if d]
    assert configmap["kind"] == "ConfigMap"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    held = json.loads(configmap["data"]["strata-kernel-worker.json"])
    assert held == json.loads(DASHBOARD.read_text()), (
        "the ConfigMap is stale: run python3 scripts/grafana-configmap.py"
    )
    generated = subprocess.run(
        [sys.executable, "-c", "import runpy; print(runpy.run_path('scripts/grafana-configmap.py')['configmap'](), end='')"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert generated == CONFIGMAP.read_text()


def test_the_provisioning_file_points_at_a_dashboard_folder() -> None:
    provisioning = yaml.safe_load(PROVISIONING.read_text())
    assert provisioning["apiVersion"] == 1
    (provider,) = provisioning["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert DASHBOARD.name in PROVISIONING.read_text()  # its comment says what to copy there


# -- the real thing ----------------------------------------------------------------------------


def _metrics_port(args: list[str]) -> tuple[list[str], int]:
    port = free_port()
    return [*args, "--metrics-port", str(port)], port


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, uv: str, py312: Path
) -> Iterator[tuple[WorkerProcess, WorkerProcess, list[int]]]:
    """``back`` and ``front`` (``--peers`` back), each one kernel, every cell answered 202."""
    back_args, back_port = _metrics_port(["--pool-size", "1", "--queue-wait", "0"])
    back = start_worker(tmp_path_factory, *back_args)
    try:
        envs = tmp_path_factory.mktemp("dashboard-envs")
        path = f"{py312.parent}{os.pathsep}{os.environ.get('PATH', '')}"
        front_args, front_port = _metrics_port([
            "--pool-size", "1", "--queue-wait", "0", "--peers", back.url,
            "--env-root", str(envs), "--max-kernels", "3",
        ])  # fmt: skip
        front = start_worker(tmp_path_factory, *front_args, env={"PATH": path})
    except BaseException:
        back.stop()
        raise
    try:
        yield front, back, [front_port, back_port]
    finally:
        front.stop()
        back.stop()


@pytest.fixture
def prometheus(
    fleet: tuple[WorkerProcess, WorkerProcess, list[int]], tmp_path: Path
) -> Iterator[str]:
    """A real Prometheus scraping both workers every second; its base URL."""
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus; .ci/run does)")
    targets = [f"127.0.0.1:{port}" for port in fleet[2]]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "strata-kernel-worker", "static_configs": [{"targets": targets}]}
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=log,
    )  # fmt: skip
    log.close()
    url = f"http://127.0.0.1:{port}"
    try:
        _until(lambda: _ready(url, proc), "Prometheus did not become ready", tmp_path)
        yield url
    finally:
        stop_process(proc, 10)


def _ready(url: str, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.poll() is None, "Prometheus exited"
    try:
        return httpx.get(url + "/-/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _until(condition: Any, what: str, logs: Path | None = None, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            log = (logs / "prometheus.log").read_text()[-3000:] if logs else ""
            raise AssertionError(f"{what}\n{log}")
        time.sleep(0.2)


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def _load(front: WorkerProcess, back: WorkerProcess, uv: str, py312: Path, tmp: Path) -> None:
    """Work that gives every panel something to show."""
    project = lock_project(tmp / "project", uv, py312, "dashboard", ["idna==3.7"])
    cells = ["x = 1", "raise ValueError('on purpose')", "import numpy as np\nv = np.ones(3)"]
    with (
        Client(front.url, timeout_seconds=30) as client,
        concurrent.futures.ThreadPoolExecutor(3) as pool,
    ):
        results = list(pool.map(client.run, cells * 2))  # one kernel: most are answered 202
        assert [r.success for r in results] == [True, False, True] * 2
        with pytest.raises(CellTimeout):  # its kernel is retired (reason: timeout)
            client.run("import time\ntime.sleep(30)", timeout_seconds=0.5)
    with httpx.Client(timeout=120) as http:
        env_cell = execute(http, "", route=front.url + "/v1/execute",
                           metadata=v1_metadata("import idna", environment=project.raw()))  # fmt: skip
        assert env_cell.status_code == 202, env_cell.text
        _until(lambda: _polled(http, front.url + env_cell.json()["job_url"]), "no env bundle")
        for _ in range(10):  # back's job (answered 202: --queue-wait 0), polled at front
            held = execute(http, "x = 2", route=back.url + "/v1/execute")
            if held.status_code == 202:
                break
            assert held.status_code == 200, held.text
        job_url = held.json()["job_url"]
        _until(lambda: _polled(http, front.url + job_url), "no forwarded bundle")
        owner = job_url.rsplit("/", 1)[-1].split(".")[0]
        assert http.get(f"{front.url}/v1/jobs/{owner}.gone").status_code == 404  # on no peer
        cancel = http.post(front.url + "/v1/executions/nothing-runs/cancel").json()
        assert cancel["cancelled"] is False  # asked of the peers too


def _polled(http: httpx.Client, job_url: str) -> bool:
    """Poll once: True once the answer is the bundle."""
    answer = http.get(job_url)
    assert answer.status_code == 200, answer.text
    return not answer.headers["content-type"].startswith("application/json")


def test_every_panel_shows_data_from_a_real_prometheus(
    fleet: tuple[WorkerProcess, WorkerProcess, list[int]],
    prometheus: str,
    uv: str,
    py312: Path,
    tmp_path: Path,
) -> None:
    front, back, ports = fleet
    _load(front, back, uv, py312, tmp_path)
    exposed = httpx.get(f"http://127.0.0.1:{ports[0]}/metrics", timeout=10).text
    for title, expr in _queries():  # every metric a query names is one the worker serves
        for name in set(re.findall(r"strata_kernel_worker_\w+", expr)):
            assert re.search(rf"^{name}[{{ ]", exposed, re.M), (title, name)
    # the load is over: wait until Prometheus has scraped what it left
    found = 'strata_kernel_worker_forwarded_total{request="poll", outcome="found"} > 0'
    _until(lambda: bool(_query(prometheus, found)), "no forwarded poll scraped", tmp_path)
    _until(lambda: bool(_query(prometheus, "strata_kernel_worker_environment_kernels")),
           "no environment pool scraped", tmp_path)  # fmt: skip
    empty: dict[str, str] = {}

    def all_answer() -> bool:
        empty.clear()
        for title, expr in _queries():
            if not _query(prometheus, expr):
                empty[expr] = title
        return not empty

    try:
        _until(all_answer, "", seconds=30)  # a rate() needs two scrapes of a new series
    except AssertionError:
        pytest.fail(f"queries that returned no data: {json.dumps(empty, indent=2)}")
    retired = _query(
        prometheus, 'sum(strata_kernel_worker_kernel_retirements_total{reason="timeout"})'
    )
    assert float(retired[0]["value"][1]) >= 1
    workers = _query(prometheus, _queries()[0][1])
    assert float(workers[0]["value"][1]) == 2
