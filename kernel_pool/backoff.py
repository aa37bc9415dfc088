"""How a pool waits after kernel starts fail: never a restart in a tight loop.

Failed starts are counted until the refill loop looks; it then logs the last failure and
waits before its next round of starts, twice as long each time in a row, from the first
delay of ``PoolConfig.restart_backoff_seconds`` up to its largest. A start that succeeds
brings the wait back to the first delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging


class StartBackoff:
    """The failed starts of one pool, and the wait they call for."""

    def __init__(self, delays: tuple[float, float], log: logging.Logger) -> None:
        """``delays``: the first and the largest wait; ``log``: the owner's logger."""
        self._first, self._largest = delays
        self._log = log
        self._delay = self._first
        self._failed = 0  # since the refill loop last looked
        self._last_failure: BaseException | None = None

    @property
    def backing_off(self) -> bool:
        """Starts failed lately: a replacement is left to the refill loop's next round."""
        return bool(self._failed) or self._delay > self._first

    def failed(self, exc: BaseException) -> None:
        """Count a failed start (the refill loop is woken by its caller)."""
        self._failed += 1
        self._last_failure = exc

    def succeeded(self) -> None:
        """A start succeeded: the next failure waits the first delay again."""
        self._delay = self._first

    async def wait_out(self, closing: asyncio.Event) -> None:
        """If starts failed since the last call: log it, then wait (or until ``closing``)."""
        failed, self._failed = self._failed, 0
        if not failed:
            return
        delay = self._delay
        self._log.error("kernel start failed (retrying in %.1fs): %s", delay, self._last_failure)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closing.wait(), delay)
        self._delay = min(delay * 2, self._largest)
