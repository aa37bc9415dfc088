"""The deployment files parse, and their commands, flags and ports match the CLI."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import yaml

from kernel_worker.cli import build_parser, settings_from

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def _flags_are_known(args: list[str]) -> None:
    settings_from(args, {})  # argparse exits on an unknown flag or a bad value


def test_kubernetes_manifest() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "worker.yaml").read_text()))
    kinds = {doc["kind"]: doc for doc in docs}
    assert set(kinds) == {"Deployment", "Service", "HorizontalPodAutoscaler"}
    container = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    _flags_are_known(container["args"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert int(env["STRATA_KERNEL_WORKER_PORT"]) == ports["http"]
    assert container["args"][container["args"].index("--metrics-port") + 1] == str(ports["metrics"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    # liveness checks wait for start-up, which a preload may make last minutes
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"]
    drain = settings_from(container["args"], {}).drain_seconds
    assert pod["terminationGracePeriodSeconds"] > drain  # the drain ends before SIGKILL
    settings = settings_from(container["args"], {})
    kernels = settings.pool_size + settings.spares
    assert settings.max_kernel_memory is not None
    limit = _bytes(container["resources"]["limits"]["memory"])
    assert limit > kernels * settings.max_kernel_memory  # the per-kernel cap acts first
    metric = kinds["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric == "strata_kernel_worker_active_executions"


def _bytes(quantity: str) -> int:
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}
    return int(quantity[:-2]) * units[quantity[-2:]]


def test_dockerfile() -> None:
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    instructions = [line.split()[0] for line in lines if line and not line.startswith((" ", "#"))]
    assert instructions[0] == "FROM" and "USER" in instructions and "HEALTHCHECK" in instructions
    user = next(line.split()[1] for line in lines if line.startswith("USER"))
    assert user != "root"
    entry = next(line for line in lines if line.startswith("ENTRYPOINT"))
    assert yaml.safe_load(entry.removeprefix("ENTRYPOINT ")) == ["tini", "--", "strata-kernel-worker"]
    assert "install -y --no-install-recommends tini" in "\n".join(lines)  # PID 1 reaps
    cmd = next(line for line in lines if line.startswith("CMD"))
    _flags_are_known(yaml.safe_load(cmd.removeprefix("CMD ")))
    text = "\n".join(lines)
    assert "EXPOSE 9000 9100" in text and "127.0.0.1:9000/health" in text


def test_systemd_unit() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(DEPLOY / "strata-kernel-worker.service")
    exec_start = shlex.split(unit["Service"]["ExecStart"])
    assert exec_start[0].endswith("/strata-kernel-worker")
    _flags_are_known(exec_start[1:])
    assert unit["Service"]["User"] != "root"
    drain = settings_from(exec_start[1:], {}).drain_seconds
    assert float(unit["Service"]["TimeoutStopSec"]) > drain
    # it binds every interface: no start without the file that holds the token
    assert not unit["Service"]["EnvironmentFile"].startswith("-")
    assert build_parser().prog == "strata-kernel-worker"
