"""Check one of our bundles with the real Strata client's own reader (strata-notebook 0.11).

Run it with the interpreter that has ``strata-notebook`` installed (Python >= 3.12)::

    python reference_bundle_check.py BUNDLE OUT_DIR EXPECTED_JSON

It calls, on BUNDLE:

1. ``read_notebook_output_bundle_manifest_path``: the validation the orchestrator's
   finalize route and the pull client run before accepting a bundle;
2. ``unpack_notebook_output_bundle`` into OUT_DIR (must not exist yet, or be empty):
   what the push client does with the response body.

EXPECTED_JSON (a file) holds any of:

``result``     {key: value}: each must equal the same key of the unpacked result.
``manifest``   {key: value}: each must equal the same key of the validated manifest.
``files``      {path relative to OUT_DIR: sha256 hex}: each file must exist with that hash.
``absent``     [path relative to OUT_DIR]: each must not exist.

Exit status: 0 accepted and as expected; 2 the client rejected the bundle; 1 it accepted
it but something differs (each difference is printed, one per line, on stderr).
"""

from __future__ import annotations

import hashlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any

from strata.notebook.remote_bundle import (
    read_notebook_output_bundle_manifest_path,
    unpack_notebook_output_bundle,
)

REJECTED = 2
DIFFERS = 1


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _differences(
    expected: dict[str, Any], result: dict[str, Any], manifest: dict[str, Any], out: Path
) -> list[str]:
    problems: list[str] = []
    for key, value in expected.get("result", {}).items():
        if result.get(key) != value:
            problems.append(f"result[{key!r}] = {result.get(key)!r}, expected {value!r}")
    for key, value in expected.get("manifest", {}).items():
        if manifest.get(key) != value:
            problems.append(f"manifest[{key!r}] = {manifest.get(key)!r}, expected {value!r}")
    for rel, digest in expected.get("files", {}).items():
        path = out / rel
        if not path.is_file():
            problems.append(f"file {rel} was not unpacked")
        elif _sha256(path) != digest:
            problems.append(f"file {rel} differs (sha256 {_sha256(path)}, expected {digest})")
    for rel in expected.get("absent", []):
        if (out / rel).exists():
            problems.append(f"{rel} exists, expected absent")
    harness = out / "harness-result.json"
    if not harness.is_file() or json.loads(harness.read_text("utf-8")) != result:
        problems.append("harness-result.json is missing or differs from the returned result")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 64
    bundle, out, expected_path = Path(argv[0]), Path(argv[1]), Path(argv[2])
    expected = json.loads(expected_path.read_text("utf-8"))
    try:
        manifest = read_notebook_output_bundle_manifest_path(bundle)
        result = unpack_notebook_output_bundle(bundle, out)
    except Exception:
        print("REJECTED by the reference client:", file=sys.stderr)
        traceback.print_exc()
        return REJECTED
    problems = _differences(expected, result, manifest, out)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(json.dumps({"result": result, "manifest": manifest}, sort_keys=True, default=str))
    return DIFFERS if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
