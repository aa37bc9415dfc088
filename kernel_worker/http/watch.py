"""``GET /v1/executions/{build_id}/console``: how a running execution is getting on.

A watcher (``strata-kernel-worker run``, :mod:`kernel_worker.client`) asks while its own
request waits for the answer: the execution's state (``queued``, with the phase it waits on,
or ``running``), the seconds since it was admitted and since it got its kernel, and the
console that came since the offsets it saw last (the tail kept by
:class:`~kernel_worker.runs.live.LiveConsole`). Only this worker's executions are known
here: a poll is never forwarded to peers. An execution that ended (or never came) is 404.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse

from ..errors import BadRequest, NotFound
from ..runs.live import STREAMS
from .routes import require_token

if TYPE_CHECKING:
    from ..state import WorkerState

__all__ = ["watch_router"]

watch_router = APIRouter(dependencies=[Depends(require_token)])


@watch_router.get("/v1/executions/{build_id}/console")
async def execution_console(
    build_id: str, request: Request, stdout: str = "0", stderr: str = "0"
) -> JSONResponse:
    """State, elapsed time and the console after the given character offsets (``stdout``,
    ``stderr``: whole numbers, 0 by default; anything else is a 400 naming it)."""
    offsets = {"stdout": _offset("stdout", stdout), "stderr": _offset("stderr", stderr)}
    state: WorkerState = request.app.state.worker
    found = [e for e in state.executions if e.build_id == build_id]
    if not found:
        raise NotFound("No execution of this build id runs on this worker")
    execution = found[-1]
    now = time.monotonic()
    body: dict[str, object] = {
        "build_id": build_id,
        "state": "queued" if execution.started_at is None else "running",
        "elapsed_seconds": round(now - execution.admitted_at, 3),
    }
    if execution.started_at is not None:
        body["running_seconds"] = round(now - execution.started_at, 3)
    if execution.phase is not None:
        body["phase"] = execution.phase
    for stream in STREAMS:
        live = execution.console.since(stream, offsets[stream])
        body[stream] = {"text": live.text, "start": live.start, "end": live.end}
    return JSONResponse(body)


def _offset(name: str, value: str) -> int:
    """A character offset from the query: a whole number, at least 0."""
    text = value.strip()
    if not text.isdigit() or len(text) > 18:
        raise BadRequest(f"{name} must be a character offset (a whole number), not {value[:40]!r}")
    return int(text)
