"""Our codecs against the reference serializer, in the interop interpreter (Python >= 3.12).

Skipped only when ``STRATA_INTEROP_PYTHON`` is unset; when it names an interpreter, the
check script must pass there.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "interop" / "reference_codecs_check.py"


@pytest.mark.interop
@pytest.mark.timeout(300)
def test_codecs_match_the_reference_serializer() -> None:
    python = os.environ.get("STRATA_INTEROP_PYTHON")
    if not python:
        pytest.skip("STRATA_INTEROP_PYTHON is not set")
    completed = subprocess.run(
        [python, str(SCRIPT)], capture_output=True, text=True, timeout=280, check=False
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "checks agree" in completed.stdout
