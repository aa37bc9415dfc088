"""The soak's mix: the requests it sends (:func:`plan`) and the checks of their answers
(:func:`check`). Every request carries a unique token that its answer must carry back, and a
large one's output is checked value by value."""

from __future__ import annotations

import base64
import io
import json
import random
import tarfile
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pyarrow as pa

__all__ = ["MIX", "Planned", "check", "plan"]

# kind -> weight; timeouts and displays cost the most kernel time, so they are rarer
MIX = {"trivial": 40, "json": 15, "arrow": 15, "error": 15, "display": 10, "timeout": 3,
       "large": 4}  # fmt: skip
LARGE_ROWS = (150_000, 420_000)  # float64 values: 1.2-3.4 MB each way
TIMEOUT_SECONDS = 0.25
FILE_PART = tuple[str, tuple[str, bytes, str]]


@dataclass(frozen=True, slots=True)
class Planned:
    """One request of the mix and everything its answer must show."""

    index: int
    kind: str
    token: str
    files: list[FILE_PART]
    variables: dict[str, object]  # name -> expected preview (None: only its presence)
    doubled: tuple[int, int] | None = None
    """A large request's (seed, rows): its ``doubled`` output is twice those random values."""


# ---- the requests -----------------------------------------------------------------------------


def _metadata(source: str, inputs: list[dict[str, str]], **params: object) -> FILE_PART:
    meta = {
        "protocol_version": "v1",
        "transform": {"ref": "notebook_cell@v1", "params": {"source": source, **params}},
        "inputs": inputs,
    }
    return ("metadata", ("metadata.json", json.dumps(meta).encode(), "application/json"))


def _arrow(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def plan(index: int, seed: int) -> Planned:
    """Request *index* of the mix (deterministic for a seed; the token is always fresh)."""
    rng = random.Random(seed * 1_000_003 + index)
    kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
    tok = f"tok-{uuid.uuid4().hex}"
    values = [rng.randint(-1000, 1000) for _ in range(rng.randint(1, 40))]
    octet = "application/octet-stream"
    if kind == "json":
        source = "token = cfg['token']\ntotal = sum(cfg['values'])\nprint(token)"
        data = json.dumps({"token": tok, "values": values}).encode()
        files = [_metadata(source, [{"name": "cfg", "format": "json/object", "file": "cfg.json"}]),
                 ("cfg.json", ("cfg.json", data, octet))]  # fmt: skip
        return Planned(index, kind, tok, files, {"token": tok, "total": sum(values)})
    if kind == "arrow":
        source = "token = str(t['tok'].iloc[0])\ntotal = int(t['v'].sum())\nprint(token)"
        data = _arrow(pa.table({"v": values, "tok": [tok] * len(values)}))
        files = [_metadata(source, [{"name": "t", "format": "arrow/ipc", "file": "t.arrow"}]),
                 ("t.arrow", ("t.arrow", data, octet))]  # fmt: skip
        return Planned(index, kind, tok, files, {"token": tok, "total": sum(values)})
    if kind == "large":
        seed, rows = rng.randrange(2**32), rng.randint(*LARGE_ROWS)
        source = f"token = {tok!r}\ndoubled = t * 2\nprint(token)"
        data = _arrow(pa.table({"v": _large_values(seed, rows)}))
        files = [_metadata(source, [{"name": "t", "format": "arrow/ipc", "file": "t.arrow"}]),
                 ("t.arrow", ("t.arrow", data, octet))]  # fmt: skip
        return Planned(index, kind, tok, files, {"token": tok, "doubled": None}, (seed, rows))
    if kind == "error":
        source = f"print({tok!r})\nraise ValueError('boom-' + {tok!r})"
        return Planned(index, kind, tok, [_metadata(source, [])], {})
    if kind == "timeout":
        source = f"print({tok!r})\nimport time\ntime.sleep(30)"
        files = [_metadata(source, [], timeout_seconds=TIMEOUT_SECONDS)]
        return Planned(index, kind, tok, files, {})
    if kind == "display":
        source = (
            "import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 2))\n"
            f"plt.plot({values!r})\nplt.title({tok!r})\nplt.show()\n"
            f"token = {tok!r}\nprint(token)"
        )
        return Planned(
            index, kind, tok, [_metadata(source, [])], {"token": tok, "plt": None, "_": None}
        )
    source = f"token = {tok!r}\nprint(token)"
    return Planned(index, kind, tok, [_metadata(source, [])], {"token": tok})


# ---- checking the answers ---------------------------------------------------------------------


def check(planned: Planned, response: httpx.Response) -> str | None:
    """Why *response* is not a right answer to *planned*, or None.

    Right answers: a 200 bundle with exactly this request's data (a cell that raises is
    ``success: false`` with its exact message); 408 for the timeout cells; 502 whose
    ``detail`` says the kernel died (the chaos task killed it).
    """
    status = response.status_code
    if status == 200:
        try:
            manifest, members = _open_bundle(response.content)
        except (tarfile.TarError, KeyError, ValueError, OSError) as exc:
            return f"200 with an unreadable bundle: {exc!r}"
        return _check_bundle(planned, manifest, members)
    try:
        body = response.json()
    except ValueError:
        return f"{status} with a non-JSON body {response.text[:200]!r}"
    detail = body.get("detail") if isinstance(body, dict) else None
    if not isinstance(detail, str) or not detail:
        return f"{status} without a detail: {body!r}"
    if status == 502:
        return None if "died" in detail else f"502 whose detail does not say died: {detail!r}"
    if status == 408 and planned.kind == "timeout":
        return None if "timed out" in detail else f"408 with detail {detail!r}"
    return f"unexpected {status}: {detail!r}"


def _open_bundle(data: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for info in tar.getmembers():
            extracted = tar.extractfile(info) if info.isfile() else None
            if extracted is not None:
                members[info.name] = extracted.read()
    return json.loads(members["manifest.json"]), members


def _check_bundle(planned: Planned, m: dict[str, Any], members: dict[str, bytes]) -> str | None:
    if planned.kind == "timeout":
        return "the timeout cell answered 200"
    stdout = members.get("stdout.txt", b"").decode("utf-8", "replace")
    if stdout != planned.token + "\n":
        return f"stdout is {stdout[:300]!r}, not this request's token"
    if planned.kind == "error":
        if m.get("success") is not False or m.get("error") != f"boom-{planned.token}":
            return f"error cell: success={m.get('success')!r} error={m.get('error')!r}"
        return None if m.get("variables") == {} else f"error cell has variables {m['variables']}"
    if m.get("success") is not True:
        return f"success={m.get('success')!r} error={m.get('error')!r}"
    variables = m.get("variables") or {}
    if set(variables) != set(planned.variables):
        return f"variables {sorted(variables)} != {sorted(planned.variables)}"
    for name, expected in planned.variables.items():
        if expected is not None and variables[name].get("preview") != expected:
            return f"{name} = {variables[name].get('preview')!r}, expected {expected!r}"
    if planned.doubled is not None:
        return _check_doubled(planned.doubled, variables["doubled"], members)
    if planned.kind == "display":
        pngs = [d for d in m.get("displays", []) if d.get("content_type") == "image/png"]
        if len(pngs) != 1:
            return f"{len(pngs)} PNG displays, expected 1"
        data = base64.b64decode(str(pngs[0].get("inline_data_url", "")).split(",", 1)[-1])
        if not data.startswith(b"\x89PNG"):
            return "the PNG display is not a PNG"
    return None


def _large_values(seed: int, rows: int) -> np.ndarray:
    return np.random.default_rng(seed).random(rows)


def _check_doubled(
    planned: tuple[int, int], meta: dict[str, Any], members: dict[str, bytes]
) -> str | None:
    """Whether the ``doubled`` output is exactly twice this request's input, and no more."""
    data = members.get(str(meta.get("file")))
    if data is None:
        return f"doubled: no member {meta.get('file')!r}"
    if meta.get("bytes") != len(data):
        return f"doubled: {len(data)} bytes, the manifest says {meta.get('bytes')}"
    try:
        values = pa.ipc.open_stream(data).read_all().column("v").to_numpy()
    except (pa.ArrowException, KeyError) as exc:
        return f"doubled: not this Arrow table: {exc!r}"
    if not np.array_equal(values, 2 * _large_values(*planned)):
        return f"doubled: {len(values)} values, not twice this request's {planned[1]}"
    return None
