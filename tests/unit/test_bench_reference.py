"""Where the benchmark finds the reference worker when ``--with-reference`` is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.processes import build_reference, find_reference_bin
from tests.envfixtures import INTEROP_PYTHON


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_one_beside_the_interop_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    worker = _executable(tmp_path / "interop" / "bin" / "strata-worker")
    monkeypatch.setenv("STRATA_INTEROP_PYTHON", str(worker.with_name("python")))
    assert find_reference_bin(None) == worker


def test_path_first_and_an_explicit_one_only_if_it_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_path = _executable(tmp_path / "path" / "strata-worker")
    monkeypatch.setenv("PATH", str(on_path.parent))
    _executable(tmp_path / "interop" / "bin" / "strata-worker")
    monkeypatch.setenv("STRATA_INTEROP_PYTHON", str(tmp_path / "interop" / "bin" / "python"))
    assert find_reference_bin(None) == on_path
    assert find_reference_bin(str(tmp_path / "missing")) is None
    assert find_reference_bin(str(on_path)) == on_path


def test_with_none_found_the_interop_environment_is_built(tmp_path: Path) -> None:
    """``--with-reference`` as documented, on a machine without one: the script that builds
    the interop environment runs, and the strata-worker beside its interpreter is used."""
    worker = _executable(tmp_path / "venv" / "bin" / "strata-worker")
    script = tmp_path / "interop-env.sh"
    script.write_text(f"echo building >&2\necho {worker.with_name('python')}\n")
    assert build_reference(script) == worker
    script.write_text("echo 'no Python >= 3.12 found' >&2\nexit 1\n")
    assert build_reference(script) is None


def test_the_documented_script_gives_a_reference_worker() -> None:
    """The real scripts/interop-env.sh (it reuses a built .venv-interop/, else builds one)."""
    if not INTEROP_PYTHON.exists():
        pytest.skip("no .venv-interop/ here: building it takes minutes (.ci/run does)")
    found = build_reference()
    assert found is not None and found.name == "strata-worker" and found.is_file()
