"""Which fsspec options a request's mount may set: an allow-list per scheme.

A mount's ``options`` come from the request, but they are handed to the same filesystem
as the worker's own credentials (``STRATA_NOTEBOOK_CREDENTIALS``). So a request may set
only options that shape how data is read, never where the worker's identity goes: no
endpoint, proxy, region, client or session settings, credential, profile or token file,
and nothing nested (a nested dict such as ``client_kwargs`` would replace the operator's
one whole, endpoint included). Those belong to the operator, in a named credential that
a request picks by its ``credential`` name.

Allowed, by scheme (values of exactly the type shown; anything else is refused):

* ``s3``: ``anon``, ``requester_pays``, ``version_aware`` (booleans);
* ``gs``: ``token`` only as ``"anon"`` (no credentials at all), ``requester_pays``,
  ``version_aware`` (booleans), ``consistency`` (``none``/``size``/``md5``/``crc32c``);
* ``az``: ``anon``, ``version_aware``, ``assume_container_exists`` (booleans).

:func:`check_options` refuses anything else with a :class:`BadRequest` naming the mount and
the option (the name echoed at most 200 characters, the value never: it may be a secret).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kernel_worker.errors import BadRequest

__all__ = ["ALLOWED_OPTIONS", "check_options"]

_MAX_ECHO = 200


@dataclass(frozen=True, slots=True)
class _Values:
    """The values an allowed option takes: booleans, or one of a few strings."""

    choices: tuple[str, ...] = ()  # empty: a boolean

    def accept(self, value: object) -> bool:
        if not self.choices:
            return isinstance(value, bool)
        return isinstance(value, str) and value in self.choices

    def __str__(self) -> str:
        return " or ".join(repr(c) for c in self.choices) if self.choices else "true or false"


_BOOLEAN = _Values()

ALLOWED_OPTIONS: Mapping[str, Mapping[str, _Values]] = {
    "s3": {"anon": _BOOLEAN, "requester_pays": _BOOLEAN, "version_aware": _BOOLEAN},
    "gs": {
        "token": _Values(("anon",)),
        "requester_pays": _BOOLEAN,
        "version_aware": _BOOLEAN,
        "consistency": _Values(("none", "size", "md5", "crc32c")),
    },
    "az": {"anon": _BOOLEAN, "version_aware": _BOOLEAN, "assume_container_exists": _BOOLEAN},
}
"""Per scheme (``s3``, ``gs``, ``az``): each option a request may set, and its values."""


def check_options(mount: str, scheme: str, options: Mapping[str, object]) -> None:
    """Refuse any option of mount *mount* (a *scheme* mount) that a request may not set.

    Raises:
        BadRequest: Naming the mount and the first refused option, and saying what the
            scheme's mounts may set.
    """
    allowed = ALLOWED_OPTIONS.get(scheme, {})
    for key, value in options.items():
        values = allowed.get(key)
        if values is None:
            raise BadRequest(
                f"Mount '{mount}' option {_echo(key)!r} may not be set by a request "
                f"({scheme} mounts may set {', '.join(allowed) or 'none'}); endpoints, "
                "proxies and credentials come from a credential defined on the worker "
                "(STRATA_NOTEBOOK_CREDENTIALS), named by the mount's 'credential'"
            )
        if not values.accept(value):
            raise BadRequest(f"Mount '{mount}' option {key!r} must be {values}")


def _echo(text: str) -> str:
    return text if len(text) <= _MAX_ECHO else f"{text[:_MAX_ECHO]}…"
