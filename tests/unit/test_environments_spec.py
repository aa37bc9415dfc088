"""The ``environment`` a request carries: validation, its messages, the lock key."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import kernel_worker.environments as environments
from kernel_worker.environments import (
    EnvironmentSpec,
    EnvironmentSpecError,
    lock_key,
    parse_environment,
    probe_uv,
)
from tests.envfixtures import INTEROP_PYTHON, Projects, projects_fixture, py312_fixture, uv_fixture  # noqa: F401

LOCK = """\
version = 1
requires-python = ">=3.12"

[[package]]
name = "{project}"
version = "{version}"
source = {{ virtual = "." }}
dependencies = [{{ name = "six" }}]

[package.metadata]
requires-dist = [{{ name = "six" }}]

[[package]]
name = "six"
version = "1.16.0"
source = {{ registry = "https://pypi.org/simple" }}
wheels = [{{ url = "https://example.invalid/six-1.16.0-py2.py3-none-any.whl", hash = "sha256:00" }}]
"""


def raw(lockfile: str, **overrides: object) -> dict[str, object]:
    return {
        "key": lock_key(lockfile),
        "python": "3.12",
        "lockfile": lockfile,
        "pyproject": "[project]\n",
        **overrides,
    }


def test_the_package_exports_exactly_its_api() -> None:
    assert sorted(environments.__all__) == [
        "BuiltEnvironment",
        "EnvironmentBuildError",
        "EnvironmentOrigin",
        "EnvironmentSpec",
        "EnvironmentSpecError",
        "EnvironmentStore",
        "EnvironmentUsage",
        "KERNEL_REQUIREMENTS",
        "LockedEnvironmentError",
        "SourceBuildRefused",
        "archive_url",
        "default_registry_url",
        "default_root",
        "lock_key",
        "parse_environment",
        "probe_uv",
    ]


def test_a_well_formed_spec_is_parsed() -> None:
    lockfile = LOCK.format(project="nb", version="0.1.0")
    spec = parse_environment(raw(lockfile))
    assert spec == EnvironmentSpec(lock_key(lockfile), "3.12", lockfile, "[project]\n")
    assert lockfile not in repr(spec)


def test_no_environment_is_the_workers_own() -> None:
    assert parse_environment(None) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "environment must be an object"),
        ("abc", "environment must be an object"),
        ({}, "environment.key must be a sha256 hex digest"),
        ({"key": "ABC"}, "environment.key must be a sha256 hex digest"),
        ({"key": "0" * 63}, "environment.key must be a sha256 hex digest"),
        ({"key": "0" * 64}, "environment needs lockfile and pyproject text"),
        (
            {"key": "0" * 64, "lockfile": "", "pyproject": 3},
            "environment needs lockfile and pyproject text",
        ),
        (
            {"key": "0" * 64, "lockfile": "x = 1", "pyproject": ""},
            "environment.lockfile does not match environment.key",
        ),
    ],
)
def test_malformed_specs_are_refused_with_the_reference_messages(
    value: object, message: str
) -> None:
    with pytest.raises(EnvironmentSpecError) as caught:
        parse_environment(value)
    assert str(caught.value) == message


def test_a_lock_that_is_not_toml_is_refused() -> None:
    with pytest.raises(EnvironmentSpecError, match=r"^environment\.lockfile is not TOML: "):
        parse_environment({"key": "0" * 64, "lockfile": "[[package", "pyproject": ""})


def test_a_key_of_another_lock_is_refused() -> None:
    ours = LOCK.format(project="nb", version="0.1.0")
    theirs = ours.replace("1.16.0", "1.17.0")
    with pytest.raises(EnvironmentSpecError, match=r"does not match environment\.key"):
        parse_environment(raw(ours, key=lock_key(theirs)))


def test_python_is_a_request_or_empty() -> None:
    lockfile = LOCK.format(project="nb", version="0.1.0")
    assert parse_environment(raw(lockfile, python=None)).python == ""  # type: ignore[union-attr]
    assert parse_environment(raw(lockfile, python=3.12)).python == "3.12"  # type: ignore[union-attr]
    with pytest.raises(EnvironmentSpecError, match="not a Python version request"):
        parse_environment(raw(lockfile, python="--system"))


def test_the_key_ignores_the_projects_own_name_and_version() -> None:
    one = lock_key(LOCK.format(project="alpha", version="0.1.0"))
    assert one == lock_key(LOCK.format(project="zeta", version="2.0.0"))
    assert one != lock_key(
        LOCK.format(project="alpha", version="0.1.0").replace("1.16.0", "1.16.1")
    )


def test_a_lock_of_the_wrong_shape_is_a_spec_error() -> None:
    with pytest.raises(EnvironmentSpecError, match=r"not a uv\.lock"):
        lock_key('package = [{ source = { virtual = "." } }]')


@pytest.mark.skipif(not INTEROP_PYTHON.exists(), reason="no interop environment")
def test_keys_match_the_reference(projects: Projects) -> None:
    locks = [
        LOCK.format(project="nb", version="0.1.0"),
        projects.basic.lockfile,
        projects.other.lockfile,
        projects.sdist.lockfile,
    ]
    reference = subprocess.run(
        [
            str(INTEROP_PYTHON),
            "-c",
            "import json, sys\n"
            "from strata.notebook.env import uv_lock_key\n"
            "print(json.dumps([uv_lock_key(lock) for lock in json.load(sys.stdin)]))\n",
        ],
        input=json.dumps(locks),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(reference.stdout) == [lock_key(lock) for lock in locks]


def test_locked_projects_round_trip(projects: Projects) -> None:
    spec = projects.basic.spec()
    assert spec.key == lock_key(Path(projects.basic.directory / "uv.lock").read_text())


def test_uv_is_found_on_path_or_in_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    found = probe_uv()
    assert found is not None
    assert subprocess.run([found, "--version"], capture_output=True, check=True).stdout.startswith(
        b"uv "
    )
    monkeypatch.setenv("PATH", "/nonexistent")
    from uv import find_uv_bin

    assert probe_uv() == find_uv_bin()
