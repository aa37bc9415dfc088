"""Our bundles, read by the real Strata client (strata-notebook 0.11) in its own interpreter.

Set ``STRATA_INTEROP_PYTHON`` to a Python (>= 3.12) with ``strata-notebook`` installed;
``tests/interop/reference_bundle_check.py`` runs there, calling the client's finalize-side
validation and its unpack function on each bundle written here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from kernel_worker.protocol.bundle import CellOutcome, MimeDisplay, write_bundle

INTEROP_PYTHON = os.environ.get("STRATA_INTEROP_PYTHON")
SCRIPT = Path(__file__).parents[1] / "interop" / "reference_bundle_check.py"

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(not INTEROP_PYTHON, reason="STRATA_INTEROP_PYTHON is not set"),
]

ACCEPTED, DIFFERS, REJECTED = 0, 1, 2
FILES = {
    "x.json": b"2",
    "math.module.json": b'{"module_name": "math"}',
    "f.pickle": b"\x80\x05not-really-a-pickle",
    "Big-f69fd263.json": b"5",
    "__display__1.png": b"\x89PNG\r\n\x1a\nfake",
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def json_meta(file: str, preview: object) -> dict[str, Any]:
    return {"content_type": "json/object", "file": file, "bytes": 1, "preview": preview}


def make_run_dir(root: Path) -> Path:
    run = root / "run"
    (run / "files").mkdir(parents=True)
    (run / "display").mkdir()
    for name, data in FILES.items():
        (run / "files" / name).write_bytes(data)
    (run / "display" / "0.png").write_bytes(b"\x89PNG mime")
    (run / "display" / "0.txt").write_bytes(b"<Figure>")
    return run


def success_outcome() -> CellOutcome:
    png = {"content_type": "image/png", "file": "__display__1.png", "width": 1, "height": 1}
    return CellOutcome(
        success=True,
        variables={
            "x": json_meta("x.json", 2),
            "Big": json_meta("Big-f69fd263.json", 5),
            "math": {"content_type": "module/import", "file": "math.module.json"},
            "f": {"content_type": "pickle/object", "file": "f.pickle", "type": "function"},
            "lock": {"error": "cannot pickle '_thread.lock' object", "type": "lock"},
            "_": png,
        },
        displays=[json_meta("x.json", 2), png],
        mime_displays=[
            MimeDisplay("0.png", "image/png", 0, "display_data"),
            MimeDisplay("0.txt", "text/plain", 0, "display_data"),
        ],
        stdout="hi ✓ — ünïcode\n",
        stderr="a warning\n",
        error=None,
        error_type=None,
        traceback=None,
        mutation_warnings=[{"var_name": "df", "message": "mutated", "suggestion": "copy"}],
        build_env="cpython-3.11-linux-x86_64",
        hardware={"cpus": 2, "memory_mb": 2048},
        duration_ms=12,
    )


def check(
    tmp_path: Path, bundle: bytes, expected: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    assert INTEROP_PYTHON is not None
    bundle_path = tmp_path / "bundle.tar.gz"
    bundle_path.write_bytes(bundle)
    expected_path = tmp_path / "expected.json"
    expected_path.write_text(json.dumps(expected))
    return subprocess.run(
        [INTEROP_PYTHON, str(SCRIPT), str(bundle_path), str(tmp_path / "out"), str(expected_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def write(run_dir: Path, result: CellOutcome, level: int = 1) -> bytes:
    buffer = io.BytesIO()
    write_bundle(run_dir, result, buffer, compresslevel=level)
    return buffer.getvalue()


def assert_accepted(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == ACCEPTED, proc.stderr


@pytest.mark.parametrize("level", [1, 0], ids=["deflated", "stored"])
def test_success_bundle(tmp_path: Path, level: int) -> None:
    result = success_outcome()
    # Unpacked, "file" is back to the basename the outcome gave.
    expected_variables = {name: dict(meta) for name, meta in result.variables.items()}
    expected = {
        "result": {
            "success": True,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "error": None,
            "traceback": None,
            "variables": expected_variables,
            "displays": [dict(d) for d in result.displays],
            "mutation_warnings": [dict(w) for w in result.mutation_warnings],
            "build_env": "cpython-3.11-linux-x86_64",
            "hardware": {"cpus": 2, "memory_mb": 2048},
            "mount_writes": [],
        },
        "manifest": {"schema_version": "notebook-output-bundle@v1", "duration_ms": 12},
        "files": {name: sha(data) for name, data in FILES.items()},
        # The client writes only files/ (flattened); our seed extras stay in the tar.
        "absent": ["outputs", "display", "files", "console.json", "error.json", "0.png"],
    }
    assert_accepted(check(tmp_path, write(make_run_dir(tmp_path), result, level), expected))


def test_failure_bundle(tmp_path: Path) -> None:
    result = CellOutcome(
        success=False,
        variables={},
        displays=[],
        mime_displays=[],
        stdout="before the error\n",
        stderr="",
        error="model not loaded",
        error_type="RuntimeError",
        traceback='Traceback (most recent call last):\n  File "<cell>", line 1\nRuntimeError',
        mutation_warnings=[],
        build_env="",
        hardware={"cpus": 2},
        duration_ms=3,
    )
    expected = {
        "result": {
            "success": False,
            "error": "model not loaded",
            "traceback": result.traceback,
            "variables": {},
            "displays": [],
            "stdout": "before the error\n",
            "stderr": "",
            "build_env": "",
        },
        "absent": ["x.json"],
    }
    assert_accepted(check(tmp_path, write(make_run_dir(tmp_path), result), expected))


def test_output_dirs_bundle(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path)
    folder = run_dir / "dirs" / "checkpoints"
    (folder / "epoch1").mkdir(parents=True)
    weights = os.urandom(300_000)
    (folder / "epoch1" / "weights.bin").write_bytes(weights)
    (folder / "README").write_bytes(b"")
    result = dataclasses.replace(
        success_outcome(), output_dirs={"checkpoints": {"epoch1/weights.bin": 0, "README": 0}}
    )
    expected = {
        "result": {"success": True},
        "manifest": {"output_dirs": {"checkpoints": {"README": 0, "epoch1/weights.bin": 300_000}}},
        "files": {
            "output_dirs/checkpoints/epoch1/weights.bin": sha(weights),
            "output_dirs/checkpoints/README": sha(b""),
            "x.json": sha(b"2"),
        },
    }
    assert_accepted(check(tmp_path, write(run_dir, result), expected))


def test_missing_output_file_still_gives_an_accepted_bundle(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path)
    (run_dir / "files" / "f.pickle").unlink()
    (run_dir / "files" / "x.json").unlink()
    (run_dir / "files" / "x.json").symlink_to("/etc/hostname")
    expected = {
        "result": {
            "success": True,
            "variables": {
                **{name: dict(meta) for name, meta in success_outcome().variables.items()},
                "f": {
                    "error": "The output file of variable 'f' was not produced",
                    "type": "function",
                },
                "x": {
                    "error": "The output file of variable 'x' was not produced",
                    "type": "MissingOutputFile",
                },
            },
        },
        "absent": ["f.pickle", "x.json"],
    }
    assert_accepted(check(tmp_path, write(run_dir, success_outcome()), expected))


# ---- the checker itself can fail ------------------------------------------------------


def test_checker_reports_a_rejected_bundle(tmp_path: Path) -> None:
    manifest = {
        "schema_version": "notebook-output-bundle@v1",
        "stdout_file": "stdout.txt",
        "stderr_file": "stderr.txt",
        "variables": {"x": {"content_type": "json/object", "file": "files/x.json"}},
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in [("stdout.txt", b""), ("stderr.txt", b"")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("manifest.json")
        raw = json.dumps(manifest).encode()
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
    proc = check(tmp_path, buffer.getvalue(), {})
    assert proc.returncode == REJECTED
    assert "Bundle member not found: files/x.json" in proc.stderr


def test_checker_reports_a_difference(tmp_path: Path) -> None:
    bundle = write(make_run_dir(tmp_path), success_outcome())
    proc = check(tmp_path, bundle, {"result": {"stdout": "something else"}})
    assert proc.returncode == DIFFERS
    assert "result['stdout']" in proc.stderr
