"""``STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST``: kernels see only the listed variables (and a floor)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kernel_worker.kernel_env import kernel_environment, parse_allowlist
from tests.conftest import ROOT, start_worker
from tests.wire import run_ok


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ("", ()),
        ("  ", ()),
        ("A, B_* ,,C", ("A", "B_*", "C")),
        ('["A", " B_* ", ""]', ("A", "B_*")),
        ("[]", ()),
    ],
)
def test_the_allowlist_is_a_comma_list_or_a_json_array(raw: str, names: tuple[str, ...]) -> None:
    assert parse_allowlist(raw) == names


@pytest.mark.parametrize("raw", ["[A, B]", '["A", 2]', '[{"A": 1}]'])
def test_an_allowlist_that_starts_as_json_must_be_an_array_of_names(raw: str) -> None:
    with pytest.raises(ValueError, match="STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST"):
        parse_allowlist(raw)


ENVIRON = {
    "PATH": "/usr/bin",
    "HOME": "/home/w",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "VIRTUAL_ENV": "/venv",
    "UV_CACHE_DIR": "/cache",
    "UV_INDEX_URL": "https://user:pass@index/simple",
    "UV_INDEX_CORP_USERNAME": "me",
    "UV_PUBLISH_TOKEN": "t",
    "PYTHON_API_KEY": "k",  # floor prefix, but named like a credential
    "AWS_SECRET_ACCESS_KEY": "s",
    "MY_APP_MODE": "fast",
    "MY_APP_LEVEL": "3",
    "OTHER": "o",
    "STRATA_PROXY_TOKEN": "p",
    "STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST": "MY_APP_*",
}


def test_without_an_allowlist_kernels_get_everything() -> None:
    assert kernel_environment(ENVIRON, ()) == ENVIRON


def test_an_allowlist_keeps_the_floor_and_the_listed_names_only() -> None:
    kept = kernel_environment(ENVIRON, ("MY_APP_*", "OTHER", "STRATA_*"))
    assert sorted(kept) == [
        "HOME", "LC_ALL", "MY_APP_LEVEL", "MY_APP_MODE", "OTHER", "PATH", "PYTHONHASHSEED",
        "UV_CACHE_DIR", "VIRTUAL_ENV",
    ]  # fmt: skip


def test_a_strata_name_or_a_credential_passes_only_when_listed_exactly() -> None:
    kept = kernel_environment(ENVIRON, ("STRATA_PROXY_TOKEN", "UV_INDEX_URL", "PYTHON_API_KEY"))
    assert {"STRATA_PROXY_TOKEN", "UV_INDEX_URL", "PYTHON_API_KEY"} <= kept.keys()
    assert "STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST" not in kept


SEEN = (
    "import os\n"
    "seen = {n: os.environ.get(n) for n in "
    "('KEEP_ME', 'MY_APP_MODE', 'SECRET_THING', 'STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST', "
    "'FROM_REQUEST')}\n"
    "has_path = bool(os.environ.get('PATH'))\n"
    "import subprocess, sys\n"
    "child = subprocess.run([sys.executable, '-c', "
    '\'import os; print(os.environ.get("SECRET_THING"), os.environ.get("KEEP_ME"))\'], '
    "capture_output=True, text=True).stdout.strip()"
)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_kernels_of_a_worker_with_an_allowlist_see_only_what_it_lets_through(
    tmp_path_factory: pytest.TempPathFactory, start: str
) -> None:
    env = {
        "KEEP_ME": "kept",
        "MY_APP_MODE": "fast",
        "SECRET_THING": "do-not-show",
        "STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST": '["KEEP_ME", "MY_APP_*", "MPLBACKEND"]',
    }
    worker = start_worker(tmp_path_factory, "--pool-size", "1", "--kernel-start", start, env=env)
    try:
        with httpx.Client(base_url=worker.url, timeout=60) as client:
            bundle = run_ok(client, SEEN, env={"FROM_REQUEST": "yes"})
    finally:
        worker.stop()
    assert json.loads(bundle.file("seen")) == {
        "KEEP_ME": "kept",
        "MY_APP_MODE": "fast",
        "SECRET_THING": None,
        "STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST": None,
        "FROM_REQUEST": "yes",  # a request's env is applied whatever the allowlist says
    }
    assert json.loads(bundle.file("has_path")) is True
    assert json.loads(bundle.file("child")) == "None kept"


def test_a_worker_refuses_an_allowlist_it_cannot_read() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kernel_worker", "--port", "0"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST": "[KEEP_ME"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST is not a JSON array" in done.stderr


def test_an_app_built_without_the_cli_reads_the_allowlist_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kernel_worker.http.app import create_app
    from kernel_worker.settings import Settings

    monkeypatch.setenv("STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST", "KEEP_ME")
    monkeypatch.setenv("KEEP_ME", "kept")
    monkeypatch.setenv("SECRET_THING", "do-not-show")
    app = create_app(Settings(run_root=tmp_path, file_reuse_bytes=0))
    env = app.state.worker.pool.config.env
    assert env["KEEP_ME"] == "kept" and "PATH" in env
    assert "SECRET_THING" not in env
