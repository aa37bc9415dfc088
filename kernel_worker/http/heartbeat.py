"""strata-pool's heartbeat on ``POST /execute`` (``--heartbeat-seconds``).

A proxy in front of a pool may end a request that sends nothing for a while (RunPod's does
after 125 s), which would cut off a long cell's answer. With an interval set, an answer
ready within one interval (a quick refusal included) is sent as it is. Otherwise the worker
answers 200 ``application/json`` with ``X-Strata-Status-In-Body: 1`` at once, sends one
space every interval while the run goes on, and ends with ``{"status_code": <int>,
"content": "<the answer's JSON body, as a string>"}``. The spaces are JSON whitespace, so
the body parses as it is.

A caller that leaves mid-stream cancels the run, as leaving without the heartbeat does; the
run directory is removed either way.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..errors import WorkerError, error_response
from ..jobs import Job
from ..protocol.streaming import watching_for_disconnect

log = logging.getLogger(__name__)

STATUS_IN_BODY_HEADER = "X-Strata-Status-In-Body"


class HeartbeatResponse(Response):
    """The streamed answer of a run that outlived the first interval (see the module)."""

    media_type = "application/json"

    def __init__(
        self, job: Job, interval: float, deliver: Callable[[], Response], timeout_status: int
    ) -> None:
        self.job = job
        self.interval = interval
        self.deliver = deliver
        self.timeout_status = timeout_status
        self.status_code = 200
        self.background = None
        self.init_headers({STATUS_IN_BODY_HEADER: "1"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with watching_for_disconnect(receive, self.job.execution.cancel.set) as gone:
            await self._send(send, gone)

    async def _send(self, send: Send, gone: asyncio.Event) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        while not await ended_within(self.job, self.interval):
            if not gone.is_set():
                await send({"type": "http.response.body", "body": b" ", "more_body": True})
        answer = self._answer()
        status, content = answer.status_code, bytes(answer.body).decode("utf-8")
        final = json.dumps({"status_code": status, "content": content}).encode("utf-8")
        try:
            if not gone.is_set():
                await send({"type": "http.response.body", "body": final})
        finally:
            if answer.background is not None:
                await answer.background()

    def _answer(self) -> Response:
        """What the run's answer would have been, had it been ready within the interval."""
        try:
            return self.deliver()
        except WorkerError as exc:
            return error_response(exc, timeout_status=self.timeout_status)
        except Exception:
            log.exception("building the answer of a heartbeat stream failed")
            return Response(
                json.dumps({"detail": "Internal Server Error"}),
                status_code=500,
                media_type="application/json",
            )


async def ended_within(job: Job, interval: float) -> bool:
    """Whether *job* is done, waiting for it at most *interval* seconds."""
    try:
        await asyncio.wait_for(job.done.wait(), interval)
    except TimeoutError:
        return False
    return True
