"""The worker-level cases: each cell, its request body, its raw-kernel twin and its check.

A case's raw twin does the same work on a bare kernel without HTTP, staging, bundling or
reset: inputs are read from a local Arrow file, outputs written to one. So ``ours / raw`` is
what the worker adds on top of the kernel doing the work.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa

from .plan import MB

COLUMNS = 8  # float64 columns: a row is 64 bytes of data
TIMEOUT_SECONDS = 600

_PANDAS_MPL = """\
import pandas as pd
import matplotlib.pyplot as plt
frame = pd.DataFrame({"x": range(200), "y": [i * i for i in range(200)]})
fig, ax = plt.subplots()
ax.plot(frame["x"], frame["y"])
plt.close(fig)
del fig, ax
result = float(frame["y"].sum())
"""
_PNG = """\
import matplotlib.pyplot as plt
plt.plot([1, 2, 3, 4], [1, 4, 9, 16])
plt.show()
result = 1
"""
_OUTPUT = """\
import numpy as np
import pandas as pd
out = pd.DataFrame(np.random.default_rng(0).random(({rows}, {columns})), columns=list("abcdefgh"))
del np, pd
"""
_PREDICT = """\
import numpy as np
result = float(predict(np.linspace(-1.0, 1.0, 256 * 32).reshape(256, 32)).mean())
"""
PRELOAD_FILE = Path(__file__).resolve().with_name("model_preload.py")
PRELOAD_LABEL = "preloaded model (2s build)"
_RAW_READ = """\
import pyarrow as _pa
with _pa.OSFile({path!r}, "rb") as _f:
    df = _pa.ipc.open_stream(_f).read_all().combine_chunks().to_pandas()
del _pa, _f
"""
_RAW_WRITE = """\
import pyarrow as _pa
_t = _pa.Table.from_pandas(out, preserve_index=False)
with _pa.OSFile({path!r}, "wb") as _f, _pa.ipc.new_stream(_f, _t.schema) as _w:
    _w.write_table(_t)
del _pa, _t, _f, _w
"""


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    label: str
    source: str
    size: str  # which repetition table applies: small, medium, large, huge
    input_bytes: int = 0
    output_bytes: int = 0
    expect_variable: str = "result"
    expect_png: bool = False

    @property
    def heavy(self) -> bool:
        return self.size in ("large", "huge")


def _size_label(nbytes: int) -> str:
    return f"{nbytes // 1000**3} GB" if nbytes >= 1000**3 else f"{nbytes // MB} MB"


def _rows(nbytes: int) -> int:
    return max(1, nbytes // (8 * COLUMNS))


def worker_cases(*, full: bool) -> list[Case]:
    sizes = [(1 * MB, "small"), (10 * MB, "medium"), (100 * MB, "large")]
    if full:
        sizes.append((1000 * MB, "huge"))
    cases = [
        Case("trivial", "trivial `result = 1`", "result = 1\n", "small"),
        Case("pandas_mpl", "pandas + matplotlib", _PANDAS_MPL, "small"),
        Case("png_display", "PNG display (plt.show)", _PNG, "small", expect_png=True),
    ]
    for nbytes, size in sizes:
        label = _size_label(nbytes)
        cases.append(
            Case(f"input_{label.replace(' ', '').lower()}", f"input {label} arrow",
                 "result = len(df)\n", size, input_bytes=nbytes)
        )  # fmt: skip
    for nbytes, size in sizes:
        label = _size_label(nbytes)
        cases.append(output_case(f"output_{label.replace(' ', '').lower()}", nbytes, size))
    return cases


def output_case(name: str, nbytes: int, size: str) -> Case:
    """The cell builds an ``nbytes`` DataFrame ``out`` that comes back as an Arrow output."""
    source = _OUTPUT.format(rows=_rows(nbytes), columns=COLUMNS)
    return Case(name, f"output {_size_label(nbytes)} arrow", source, size,
                output_bytes=nbytes, expect_variable="out")  # fmt: skip


def preloaded_model_cases() -> tuple[Case, Case]:
    """The cell that calls the preloaded model, and the reference's twin that rebuilds it.

    Our worker (``--preload``) and the raw kernels (preloaded once) run the call alone; the
    reference has no preload, so its cell is the preload file's code followed by the call.
    """
    call = Case("preloaded_model", PRELOAD_LABEL, _PREDICT, "small")
    rebuild = PRELOAD_FILE.read_text(encoding="utf-8") + "\n" + _PREDICT
    return call, Case("preloaded_model", PRELOAD_LABEL, rebuild, "small")


KILL_CASE = Case("churn_kill", "the cell kills its kernel", "import os; os._exit(1)\n", "small")
"""Every n-th request of the churn case: our worker answers 502, the reference a 5xx."""


def raw_source(case: Case, input_path: Path | None, output_path: Path) -> str:
    """The raw kernel's version of the cell (benchmark-owned paths, not user data)."""
    parts = []
    if case.input_bytes and input_path is not None:
        parts.append(_RAW_READ.format(path=str(input_path)))
    parts.append(case.source)
    if case.output_bytes:
        parts.append(_RAW_WRITE.format(path=str(output_path)))
    return "".join(parts)


def arrow_stream(nbytes: int) -> bytes:
    """A pandas DataFrame of ``nbytes`` of float64 data, as an Arrow IPC stream."""
    data = np.random.default_rng(1).random((_rows(nbytes), COLUMNS))
    table = pa.Table.from_pandas(pd.DataFrame(data, columns=list("abcdefgh")), preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One case's multipart body, encoded once and sent as is to every target."""

    body: bytes
    content_type: str
    description: str


def prepare_request(
    case: Case,
    payload: bytes | None,
    environment: dict[str, str] | None = None,
    language: str | None = None,
) -> PreparedRequest:
    """``environment``: a locked environment for ``params.environment``, as Strata sends it;
    ``language``: ``params.language`` (none: Python, the default)."""
    inputs: list[dict[str, str]] = []
    files: dict[str, tuple[str, bytes, str]] = {}
    if payload is not None:
        inputs.append({"name": "df", "format": "arrow/ipc", "file": "df.arrow"})
        files["df.arrow"] = ("df.arrow", payload, "application/vnd.apache.arrow.stream")
    params: dict[str, Any] = {"source": case.source, "timeout_seconds": TIMEOUT_SECONDS}
    if environment is not None:
        params["environment"] = environment
    if language is not None:
        params["language"] = language
    metadata = {
        "protocol_version": "v1",
        "transform": {
            "ref": "notebook_cell@v1",
            "params": params,
        },
        "inputs": inputs,
    }
    parts = {"metadata": ("metadata.json", json.dumps(metadata).encode(), "application/json")}
    request = httpx.Request("POST", "http://127.0.0.1/v1/execute", files={**parts, **files})
    body = request.read()
    sizes = ", ".join(f"{name}: {len(part[1])} bytes" for name, part in files.items())
    description = f"POST /v1/execute metadata={json.dumps(metadata)}" + (
        f" files=[{sizes}]" if sizes else ""
    )
    return PreparedRequest(body, request.headers["content-type"], description)


def read_manifest(content: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """A response bundle's manifest, or why it could not be read (blocking: thread)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(content), mode="r:*") as tar:
            member = tar.extractfile("manifest.json")
            if member is None:
                return None, "manifest.json is not a file"
            manifest: dict[str, Any] = json.loads(member.read())
    except (tarfile.TarError, KeyError, ValueError, OSError) as exc:
        return None, f"not a readable bundle: {exc!r}"
    return manifest, None


def manifest_problem(case: Case, manifest: dict[str, Any]) -> str | None:
    """What is wrong with a manifest for this case, or ``None``."""
    if manifest.get("success") is not True:
        return f"success={manifest.get('success')!r} error={manifest.get('error')!r}"
    variables = manifest.get("variables") or {}
    if case.expect_variable not in variables:
        return f"variable {case.expect_variable!r} missing from {sorted(variables)}"
    if case.expect_png:
        displays = manifest.get("displays") or []
        if not any(d.get("content_type") == "image/png" for d in displays):
            return f"no image/png display in {displays!r:.300}"
    return None


def check_bundle(case: Case, content: bytes) -> str | None:
    """What is wrong with a response bundle for this case, or ``None`` (blocking: thread)."""
    manifest, problem = read_manifest(content)
    return problem if manifest is None else manifest_problem(case, manifest)
