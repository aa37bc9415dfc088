"""How a cell is getting on while the client waits for it, without I/O.

Two things are reported to a client's ``on_progress`` callback as :class:`Progress`:

- a busy worker: a ``503`` with ``Retry-After`` ("running 1 of 1 executions", "shutting
  down") is waited out and sent again, within the request's deadline;
- a queued or running cell: about once a second the client asks the worker how the
  execution is getting on (``GET /v1/executions/{build_id}/console``): its state, what it
  waits on (``building environment``), and the console that came since the last ask.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx

__all__ = ["BUSY_WAIT_CAP_SECONDS", "ConsoleWatch", "Progress", "ProgressCallback", "busy_wait"]

BUSY_WAIT_CAP_SECONDS = 30.0
"""The longest wait before sending again to a busy worker, whatever its Retry-After says."""
WATCH_INTERVAL_SECONDS = 1.0
"""How often a watched execution is asked about."""


@dataclass(frozen=True, slots=True)
class Progress:
    """One report on a request still waiting for its answer.

    ``state``: ``busy`` (the worker answered 503; sent again in ``retry_in_seconds``),
    ``waiting`` (sent, the worker says nothing of it yet), ``queued`` (waiting for a kernel,
    or for ``phase``: ``building environment``) or ``running``. ``elapsed_seconds`` counts
    from the first send. ``stdout``/``stderr`` are console text that came since the last
    report; ``missed`` counts characters that came and went unseen between two reports.
    """

    state: str
    elapsed_seconds: float
    detail: str | None = None
    phase: str | None = None
    retry_in_seconds: float | None = None
    stdout: str = ""
    stderr: str = ""
    missed: int = 0


ProgressCallback = Callable[[Progress], None]


def busy_wait(response: httpx.Response, deadline: float) -> float | None:
    """Seconds to wait before sending again, for a ``503`` with ``Retry-After`` that leaves
    time before ``deadline``; None when the answer is final."""
    if response.status_code != 503:
        return None
    raw = response.headers.get("retry-after", "").strip()
    if not raw.isdigit():  # (an HTTP date is not something this worker sends)
        return None
    wait = min(max(float(raw), 0.2), BUSY_WAIT_CAP_SECONDS)
    return wait if time.monotonic() + wait < deadline else None


@dataclass(slots=True)
class ConsoleWatch:
    """What has been seen of one execution's console, and the next ask about it."""

    build_id: str
    started: float = field(default_factory=time.monotonic)
    offsets: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})

    @property
    def path(self) -> str:
        return f"v1/executions/{self.build_id}/console"

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def report(self, response: httpx.Response | None) -> Progress:
        """The worker's answer (None: no answer) as a :class:`Progress`."""
        body = _json(response) if response is not None and response.status_code == 200 else None
        if body is None:  # not (yet, or no longer) running here, or an older worker
            return Progress("waiting", self.elapsed())
        texts: dict[str, str] = {}
        missed = 0
        for stream in ("stdout", "stderr"):
            part = body.get(stream)
            text, start, end = _part(part)
            if end < self.offsets[stream]:  # a different execution of the same build id
                continue
            missed += max(0, start - self.offsets[stream])
            texts[stream] = text
            self.offsets[stream] = end
        phase = body.get("phase")
        state = body.get("state")
        return Progress(
            state if state in ("queued", "running") else "waiting",
            self.elapsed(),
            phase=phase if isinstance(phase, str) else None,
            stdout=texts.get("stdout", ""),
            stderr=texts.get("stderr", ""),
            missed=missed,
        )


def _json(response: httpx.Response) -> Mapping[str, object] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _part(part: object) -> tuple[str, int, int]:
    if not isinstance(part, dict):
        return "", 0, 0
    text, start, end = part.get("text"), part.get("start"), part.get("end")
    if not (isinstance(text, str) and isinstance(start, int) and isinstance(end, int)):
        return "", 0, 0
    return text, start, end
