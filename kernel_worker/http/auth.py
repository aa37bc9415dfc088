"""The bearer-token gate and the worker secrets that must never reach a cell.

:func:`check_bearer` runs before any body is read, so a bad token with a bad body is a
401, not a 400. :func:`scrub_secrets` removes the worker's own secrets from an
environment (the process's at start-up, and every kernel's before it is spawned).
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Iterable, Iterator, MutableMapping

from kernel_worker.errors import Unauthorized

log = logging.getLogger(__name__)

__all__ = ["SECRET_ENV_VARS", "check_bearer", "scrub_secrets"]

#: Worker-side secrets (spec §2.3): read once at start-up, never inherited by a kernel.
SECRET_ENV_VARS: tuple[str, ...] = (
    "STRATA_WORKER_TOKEN",
    "STRATA_WORKER_CONNECT_TOKEN",
    "STRATA_NOTEBOOK_CREDENTIALS",
    "STRATA_NOTEBOOK_MOUNT_CREDENTIALS",
    "STRATA_PROXY_TOKEN",
    "STRATA_NOTEBOOK_REMOTE_STORE_HEADERS",
)

_PREFIX = "Bearer "
_MALFORMED = "Missing or malformed Authorization header (expected Bearer token)"
_WRONG = "Invalid worker token"


def check_bearer(authorization: str | None, token: str | None) -> None:
    """Admit the request, or raise :class:`Unauthorized` with the reference's details.

    Args:
        authorization: The ``Authorization`` header as received, or None when absent.
        token: The configured worker token; None or blank turns the gate off.

    Raises:
        Unauthorized: The header is absent or does not start with exactly ``Bearer ``,
            or it names another token. The comparison is constant-time on UTF-8 bytes.
    """
    expected = (token or "").strip()
    if not expected:
        return
    if authorization is None or not authorization.startswith(_PREFIX):
        raise Unauthorized(_MALFORMED)
    presented = authorization[len(_PREFIX) :]
    # Bytes: compare_digest refuses non-ASCII str, and a header may carry anything.
    if not hmac.compare_digest(
        presented.encode("utf-8", "surrogateescape"), expected.encode("utf-8")
    ):
        raise Unauthorized(_WRONG)


def scrub_secrets(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Remove every name in :data:`SECRET_ENV_VARS` from *environ*; return what was removed.

    When *environ* is the process's own, the values are also wiped from the environment
    block the process started with, which ``/proc/<pid>/environ`` keeps showing otherwise
    (and which a cell running as the same user could read).
    """
    removed = {name: environ.pop(name) for name in SECRET_ENV_VARS if name in environ}
    if removed and environ is os.environ:
        wipe_initial_environment(removed)
    return removed


def wipe_initial_environment(names: Iterable[str]) -> bool:
    """Overwrite ``NAME=value`` entries of this process's initial environment block.

    Linux only (``/proc/self/stat`` gives the block's bounds, ``/proc/self/mem`` writes
    it); returns False where that is not possible.
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (fields 50-51)
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            block = mem.read(end - start)
            for offset, length in _value_spans(block, names):
                mem.seek(start + offset)
                mem.write(b"\0" * length)
    except (OSError, ValueError, IndexError):
        log.warning("could not wipe secrets from the initial environment block")
        return False
    return True


def _value_spans(block: bytes, names: Iterable[str]) -> Iterator[tuple[int, int]]:
    """(offset, length) of the value of each ``NAME=value`` entry of a NUL-separated block."""
    for name in names:
        prefix = name.encode() + b"="
        at = block.find(prefix)
        while at != -1:
            if at == 0 or block[at - 1] == 0:
                value = at + len(prefix)
                stop = block.find(b"\0", value)
                yield value, (len(block) if stop == -1 else stop) - value
            at = block.find(prefix, at + 1)
