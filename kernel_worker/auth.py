"""The bearer-token gate and the worker secrets that must never reach a cell.

:func:`check_bearer` runs before any body is read, so a bad token with a bad body is a
401, not a 400. :func:`scrub_secrets` removes the worker's own secrets from an
environment (the process's at start-up, and every kernel's before it is spawned).
"""

from __future__ import annotations

import hmac
from collections.abc import MutableMapping

from kernel_worker.errors import Unauthorized

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
    """Remove every name in :data:`SECRET_ENV_VARS` from *environ*; return what was removed."""
    return {name: environ.pop(name) for name in SECRET_ENV_VARS if name in environ}
