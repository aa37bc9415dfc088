"""Where the benchmark finds the reference worker when ``--with-reference`` is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.processes import find_reference_bin


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
