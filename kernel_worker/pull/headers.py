"""The headers a pull manifest may put on the worker's outgoing requests.

Of the four requests a manifest points the worker at (the bundle upload to ``output.url``,
``finalize_url``, ``log_url``, ``output_file_url``), only the upload carries headers the
manifest chose: ``output.headers``, sent with a ``PUT`` (a presigned URL's ``x-amz-*``,
``x-ms-blob-type``, ``x-goog-*``). The other three carry the worker's own headers only.

The worker frames every request itself: its ``Host`` is the URL's (the address the SSRF
check passed), its body length is its ``Content-Length`` or chunked encoding, one of the
two. So a manifest header that would frame or route the request is **refused** while the
manifest is validated (a ``400`` naming the header, before any input is fetched or any
cell runs), rather than dropped: an orchestrator that sends one learns so at once, and no
upload goes out shaped other than it asked. Refused, in any letter case:

* ``Host``, ``Content-Length``, ``Transfer-Encoding``, ``TE``, ``Trailer``, ``Expect``;
* hop-by-hop ``Connection``, ``Keep-Alive``, ``Upgrade``, and every ``Proxy-*``.

A header name must be an HTTP token and a value may hold no CR, LF or NUL, so nothing a
manifest sends can start a second header or a second request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from kernel_worker.errors import BadRequest

__all__ = ["REFUSED_HEADERS", "upload_headers"]

REFUSED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "te",
        "trailer",
        "expect",
        "connection",
        "keep-alive",
        "upgrade",
    }
)
"""Lower-cased names a manifest may not set (and any name starting ``proxy-``)."""

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 field-name
_BREAKS = re.compile(r"[\r\n\0]")
_MAX_ECHO = 200


def upload_headers(raw: Mapping[object, object]) -> dict[str, str]:
    """``output.headers`` as the upload will send them (values as text, as the reference).

    Raises:
        BadRequest: A header frames or routes the request, or is not a well-formed header.
    """
    headers: dict[str, str] = {}
    for key, value in raw.items():
        name, text = str(key), str(value)
        if not _TOKEN.fullmatch(name):
            raise BadRequest(f"Manifest output header {_echo(name)!r} is not a valid header name")
        lowered = name.lower()
        if lowered in REFUSED_HEADERS or lowered.startswith("proxy-"):
            raise BadRequest(
                f"Manifest output header {_echo(name)!r} may not be set: the worker frames "
                "and routes its own requests (Host, Content-Length, Transfer-Encoding, TE, "
                "Trailer, Expect, Connection, Keep-Alive, Upgrade and Proxy-* are refused)"
            )
        if _BREAKS.search(text):
            raise BadRequest(
                f"Manifest output header {_echo(name)!r} has a line break or NUL in its value"
            )
        headers[name] = text
    return headers


def _echo(text: str) -> str:
    return text if len(text) <= _MAX_ECHO else f"{text[:_MAX_ECHO]}…"
