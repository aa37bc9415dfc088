"""The deployment files parse, and their commands, flags and ports match the CLI
(deploy/kubernetes: tests/worker/test_kubernetes_manifests.py)."""

from __future__ import annotations

import configparser
import fnmatch
import re
import shlex
import tomllib
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet

from kernel_pool.config import PoolConfig
from kernel_worker.cli import build_parser, settings_from
from kernel_worker.http.server import CLOSE_SECONDS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
#: after the drain: answers still being sent, then the pool's bounded shutdown (leases,
#: resets and kills, kernel stops; see docs/deployment.md, "Shutdown and draining")
SHUTDOWN_AFTER_DRAIN = CLOSE_SECONDS + 3 * PoolConfig().shutdown_timeout_seconds + 1


def _flags_are_known(args: list[str]) -> None:
    settings_from(args, {})  # argparse exits on an unknown flag or a bad value


def test_dockerfile() -> None:
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    instructions = [line.split()[0] for line in lines if line and not line.startswith((" ", "#"))]
    assert instructions[0] == "FROM" and "USER" in instructions and "HEALTHCHECK" in instructions
    user = next(line.split()[1] for line in lines if line.startswith("USER"))
    assert user != "root"
    entry = next(line for line in lines if line.startswith("ENTRYPOINT"))
    assert yaml.safe_load(entry.removeprefix("ENTRYPOINT ")) == [
        "tini",
        "--",
        "strata-kernel-worker",
    ]
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
    assert float(unit["Service"]["TimeoutStopSec"]) > drain + SHUTDOWN_AFTER_DRAIN
    # it binds every interface: no start without the file that holds the token
    assert not unit["Service"]["EnvironmentFile"].startswith("-")
    assert build_parser().prog == "strata-kernel-worker"


def test_dockerfile_builds_what_pyproject_declares() -> None:
    """The image's Python satisfies requires-python, and it copies every package that
    setuptools finds and the readme the metadata reads."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    text = (DEPLOY / "Dockerfile").read_text()
    python = re.search(r"^FROM python:(\d+\.\d+)", text, re.MULTILINE)
    assert python is not None
    assert python.group(1) + ".0" in SpecifierSet(project["project"]["requires-python"])
    copies = [line.split()[1:-1] for line in text.splitlines() if line.startswith("COPY ")]
    copied = {part for parts in copies for part in parts}
    assert project["project"]["readme"] in copied and "pyproject.toml" in copied
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert pattern.rstrip("*") in copied, f"{pattern} is not copied into the image"
    # packages hold Python, and what package-data declares (the R cells' R sources)
    declared = project["tool"]["setuptools"].get("package-data", {})

    def listed(path: Path) -> bool:
        package = ".".join(path.parent.relative_to(ROOT).parts)
        return any(fnmatch.fnmatch(path.name, pattern) for pattern in declared.get(package, ()))

    for package in ("kernel_pool", "kernel_worker"):
        files = [p for p in (ROOT / package).rglob("*") if p.is_file()]
        others = [p for p in files if p.suffix not in (".py", ".pyc") and not listed(p)]
        assert not others, others
    # the stop time the header recommends covers the drain and the shutdown after it
    stop = re.search(r"docker stop -t (\d+)", text)
    assert stop is not None
    cmd = next(line for line in text.splitlines() if line.startswith("CMD"))
    drain = settings_from(yaml.safe_load(cmd.removeprefix("CMD ")), {}).drain_seconds
    assert int(stop.group(1)) > drain + SHUTDOWN_AFTER_DRAIN
