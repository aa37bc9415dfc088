"""A client for a running kernel worker: send a cell with Python values, get Python values back.

::

    from kernel_worker.client import Client

    with Client("http://127.0.0.1:9000") as worker:
        result = worker.run("total = int(df['a'].sum())\\nprint(total)", {"df": frame})
        result.raise_for_error()
        result.outputs["total"], result.stdout, result.displays

:class:`AsyncClient` is the same with ``await``. Both speak the executor protocol v1 the way
Strata's own client does: one multipart ``POST /v1/execute`` (the envelope plus one file part
per input), a ``202`` job URL polled until it answers, the answer a gzipped tar bundle. Values
are encoded and decoded with the worker's own codecs (:mod:`kernel_worker.agent.codecs`), so a
DataFrame goes as Arrow IPC and comes back a DataFrame. Outputs are decoded only when read:
decoding a ``pickle/object`` output unpickles it, so read outputs only from workers you trust
as much as the code you send them.

Errors::

    ClientError
    ├── WorkerUnreachable     the worker could not be reached, or the connection broke
    ├── RequestFailed         a non-200 answer: status_code and the worker's detail
    ├── CellTimeout           408/504, or no answer by the client's own deadline
    ├── ProtocolError         the answer is not something this protocol allows
    ├── InputEncodingError    an input value could not be encoded
    ├── OutputDecodingError   an output was not serialized by the worker, or cannot be decoded
    └── CellError             CellResult.raise_for_error() on a cell that raised
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import json
import keyword
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, cast

import httpx

__all__ = [
    "AsyncClient",
    "CellError",
    "CellResult",
    "CellTimeout",
    "Client",
    "ClientError",
    "Display",
    "EncodedInput",
    "InputEncodingError",
    "OutputDecodingError",
    "Outputs",
    "ProtocolError",
    "RequestFailed",
    "WorkerUnreachable",
]

DEFAULT_URL = "http://127.0.0.1:9000"
_EXECUTE_PATH = "/v1/execute"
_PROTOCOL = "v1"
_NOTEBOOK_PROTOCOL = "notebook-cell-v1"
_TRANSFORM_REF = "notebook_cell@v1"
_PENDING_STATES = frozenset({"queued", "provisioning", "starting", "running"})
_CANCEL_TIMEOUT_SECONDS = 5.0
# A display's richest format first: what ``Display.content_type`` picks.
_PREFERENCE = (
    "image/png",
    "image/jpeg",
    "image/svg+xml",
    "text/html",
    "text/markdown",
    "text/latex",
    "application/json",
    "text/plain",
)


# ---- errors --------------------------------------------------------------------------


class ClientError(Exception):
    """Root of everything this client raises on purpose."""


class WorkerUnreachable(ClientError):
    """The worker could not be reached, or the connection broke mid-answer."""


class RequestFailed(ClientError):
    """The worker answered with a status other than 200 (or 202 then a failed job)."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"the worker answered {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class CellTimeout(ClientError):
    """The cell outran its timeout (status 408/504), or the client's deadline passed (None)."""

    def __init__(self, status_code: int | None, detail: str) -> None:
        super().__init__(detail if status_code is None else f"{status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class ProtocolError(ClientError):
    """The answer is not a bundle, a job URL or an error this protocol allows."""


class InputEncodingError(ClientError):
    """An input value could not be encoded (or its name is not a Python identifier)."""


class OutputDecodingError(ClientError):
    """An output was not serialized by the worker, or cannot be decoded here."""


class CellError(ClientError):
    """The cell raised; ``result`` holds its console, error type, message and traceback."""

    def __init__(self, result: CellResult) -> None:
        kind = result.error_type or "Error"
        super().__init__(f"the cell raised {kind}: {result.error or ''}")
        self.result = result


# ---- values in: inputs ---------------------------------------------------------------


class _Codecs(Protocol):
    """The typed view of :mod:`kernel_worker.agent.codecs` this module relies on.

    The codecs also run inside kernels and are not type-checked with the package, so they
    are imported by name and seen through this protocol.
    """

    def serialize(self, name: str, value: object, out_dir: str) -> dict[str, object]: ...
    def load_input(self, path: str, content_type: str) -> object: ...
    def file_stem(self, name: str) -> str: ...
    def extension_for(self, content_type: str) -> str: ...


def _codecs() -> _Codecs:
    return cast(_Codecs, importlib.import_module("kernel_worker.agent.codecs"))


@dataclass(frozen=True, slots=True)
class EncodedInput:
    """A value already encoded in one of the protocol's formats; sent as it is.

    ``content_type`` is the input format (``arrow/ipc``, ``json/object``, ``pickle/object``,
    ``file/path`` …). ``file_name`` is the name it is staged under on the worker (what a
    ``file/path`` input's cell sees); it defaults to the input's name plus the format's
    extension, as Strata names them.
    """

    content_type: str
    data: bytes
    file_name: str | None = None


@dataclass(frozen=True, slots=True)
class _Part:
    descriptor: dict[str, object]
    file_name: str
    data: bytes


def _encode_inputs(inputs: Mapping[str, object]) -> list[_Part]:
    """Each input as an envelope descriptor plus the bytes of its multipart file part."""
    codecs = _codecs()
    parts: list[_Part] = []
    with tempfile.TemporaryDirectory(prefix="skw-client-") as tmp:
        for name, value in inputs.items():
            if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
                raise InputEncodingError(f"input name {name!r} is not a Python identifier")
            if isinstance(value, EncodedInput):
                ext = codecs.extension_for(value.content_type)
                file_name = value.file_name or codecs.file_stem(name) + ext
                parts.append(_part(name, value.content_type, file_name, value.data))
                continue
            meta = codecs.serialize(name, value, tmp)
            if "error" in meta:
                raise InputEncodingError(
                    f"input {name!r} ({type(value).__name__}) cannot be encoded: {meta['error']}"
                )
            file_name = str(meta["file"])
            data = Path(tmp, file_name).read_bytes()
            parts.append(_part(name, str(meta["content_type"]), file_name, data))
    return parts


def _part(name: str, content_type: str, file_name: str, data: bytes) -> _Part:
    descriptor: dict[str, object] = {
        "name": name,
        "format": content_type,
        "file": file_name,
        "byte_size": len(data),
    }
    return _Part(descriptor, file_name, data)


# ---- values out: the bundle ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Display:
    """One display output of the cell (a figure, a table, markdown …) in every format it came in.

    ``formats`` maps content types to data: ``bytes`` for binary formats (``image/png``),
    ``str`` for text ones (``text/html``, ``text/markdown``, ``image/svg+xml``,
    ``text/plain``). ``content_type``/``data`` are the richest of them. In Jupyter a
    ``Display`` renders as itself.
    """

    formats: Mapping[str, bytes | str]
    output_type: str = "display_data"

    @property
    def content_type(self) -> str:
        ranked = [t for t in _PREFERENCE if t in self.formats]
        return ranked[0] if ranked else next(iter(self.formats))

    @property
    def data(self) -> bytes | str:
        return self.formats[self.content_type]

    def _repr_mimebundle_(
        self, include: object = None, exclude: object = None
    ) -> dict[str, object]:
        import base64

        bundle: dict[str, object] = {}
        for kind, value in self.formats.items():
            if isinstance(value, bytes):
                bundle[kind] = base64.b64encode(value).decode("ascii")
            elif kind == "application/json" or kind.endswith("+json"):
                with contextlib.suppress(ValueError):
                    bundle[kind] = json.loads(value)
            else:
                bundle[kind] = value
        return bundle


def _is_text(content_type: str) -> bool:
    return content_type.startswith("text/") or content_type in (
        "image/svg+xml",
        "application/json",
        "application/javascript",
    )


def _as_format(content_type: str, raw: bytes) -> bytes | str:
    return raw.decode("utf-8", "replace") if _is_text(content_type) else raw


class Outputs(Mapping[str, object]):
    """The cell's outputs by name, decoded on first access (then kept).

    Iterating lists every variable the cell made; reading one the worker could not serialize,
    or one that cannot be decoded here, raises :class:`OutputDecodingError`.
    """

    def __init__(
        self, variables: Mapping[str, Mapping[str, object]], members: Mapping[str, bytes]
    ) -> None:
        self._variables = variables
        self._members = members
        self._decoded: dict[str, object] = {}

    def __getitem__(self, name: str) -> object:
        if name not in self._decoded:
            self._decoded[name] = self._decode(name)
        return self._decoded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._variables)

    def __len__(self) -> int:
        return len(self._variables)

    def encoded(self, name: str) -> EncodedInput:
        """Output *name* as the worker encoded it: ready to send on as another cell's input."""
        meta = self._variables[name]
        if "error" in meta:
            raise OutputDecodingError(f"output {name!r} was not serialized: {meta['error']}")
        member = meta.get("file")
        content_type = meta.get("content_type")
        if not isinstance(member, str) or member not in self._members:
            raise OutputDecodingError(f"output {name!r} has no file in the bundle")
        if not isinstance(content_type, str):
            raise OutputDecodingError(f"output {name!r} has no content type")
        return EncodedInput(content_type, self._members[member])

    def _decode(self, name: str) -> object:
        encoded = self.encoded(name)
        if encoded.content_type in ("image/png", "text/markdown"):
            return _as_format(encoded.content_type, encoded.data)
        with tempfile.TemporaryDirectory(prefix="skw-client-") as tmp:
            path = Path(tmp, "value")
            path.write_bytes(encoded.data)
            try:
                return _codecs().load_input(str(path), encoded.content_type)
            except Exception as exc:  # the codec's or the format reader's own error
                raise OutputDecodingError(
                    f"output {name!r} ({encoded.content_type}) cannot be decoded here: {exc}"
                ) from exc


@dataclass(frozen=True, slots=True, eq=False)
class CellResult:
    """What one cell run produced. A cell that raised is a result too (``success`` false)."""

    success: bool
    stdout: str
    stderr: str
    error: str | None
    error_type: str | None
    traceback: str | None
    #: The manifest's per-variable metadata (content_type, file, preview, rows, …).
    variables: Mapping[str, Mapping[str, object]]
    outputs: Outputs
    displays: tuple[Display, ...]
    mutation_warnings: tuple[Mapping[str, object], ...]
    #: The worker's own timing of the cell; None if the bundle does not say.
    duration_seconds: float | None
    #: From sending the request to holding the whole bundle, as this client saw it.
    round_trip_seconds: float
    manifest: Mapping[str, object] = field(repr=False)

    def raise_for_error(self) -> CellResult:
        """Raise :class:`CellError` if the cell raised; return the result otherwise."""
        if not self.success:
            raise CellError(self)
        return self


def _read_members(body: bytes) -> dict[str, bytes]:
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
            for info in tar:
                extracted = tar.extractfile(info) if info.isfile() else None
                if extracted is not None:
                    members[info.name] = extracted.read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ProtocolError(f"the answer is not a readable tar bundle: {exc}") from exc
    return members


def _json_member(members: Mapping[str, bytes], name: str) -> dict[str, object] | None:
    if name not in members:
        return None
    try:
        document = json.loads(members[name])
    except ValueError as exc:
        raise ProtocolError(f"{name} in the bundle is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ProtocolError(f"{name} in the bundle is not a JSON object")
    return document


def _parse_bundle(body: bytes, round_trip_seconds: float) -> CellResult:
    """A :class:`CellResult` from the bytes of a bundle. Pure apart from the tar reading."""
    members = _read_members(body)
    manifest = _json_member(members, "manifest.json")
    if manifest is None or not isinstance(manifest.get("success"), bool):
        raise ProtocolError("the bundle has no manifest.json with a boolean 'success'")
    variables = _mapping(manifest.get("variables"))
    error_doc = _json_member(members, "error.json") or {}
    duration_ms = manifest.get("duration_ms")
    return CellResult(
        success=bool(manifest["success"]),
        stdout=_console(members, manifest.get("stdout_file"), "stdout.txt"),
        stderr=_console(members, manifest.get("stderr_file"), "stderr.txt"),
        error=_optional_str(manifest.get("error")),
        error_type=_optional_str(error_doc.get("type")),
        traceback=_optional_str(manifest.get("traceback")),
        variables=variables,
        outputs=Outputs(variables, members),
        displays=_displays(manifest, members),
        mutation_warnings=tuple(
            w for w in _list(manifest.get("mutation_warnings")) if isinstance(w, dict)
        ),
        duration_seconds=duration_ms / 1000 if isinstance(duration_ms, int | float) else None,
        round_trip_seconds=round_trip_seconds,
        manifest=manifest,
    )


def _displays(manifest: Mapping[str, object], members: Mapping[str, bytes]) -> tuple[Display, ...]:
    """Jupyter displays from ``display[]``; else the reference's ``displays`` (PNG, markdown)."""
    formats: dict[int, dict[str, bytes | str]] = {}
    output_types: dict[int, str] = {}
    for entry in _list(manifest.get("display")):
        if not isinstance(entry, dict):
            continue
        file, kind, index = entry.get("file"), entry.get("content_type"), entry.get("index")
        if not (isinstance(file, str) and isinstance(kind, str) and isinstance(index, int)):
            continue
        if file in members:
            output_types.setdefault(index, str(entry.get("output_type") or "display_data"))
            formats.setdefault(index, {})[kind] = _as_format(kind, members[file])
    if formats:
        return tuple(Display(formats[i], output_types[i]) for i in sorted(formats))
    found = (_reference(entry, members) for entry in _list(manifest.get("displays")))
    return tuple(display for display in found if display is not None)


def _reference(entry: object, members: Mapping[str, bytes]) -> Display | None:
    """One display in the reference worker's convention (``files/__display__<i>.<ext>``)."""
    if not isinstance(entry, dict) or not isinstance(kind := entry.get("content_type"), str):
        return None
    if kind == "text/markdown" and isinstance(text := entry.get("markdown_text"), str):
        return Display({kind: text})
    file = entry.get("file")
    if not isinstance(file, str) or file not in members:
        return None
    return Display({kind: _as_format(kind, members[file])})


def _console(members: Mapping[str, bytes], named: object, default: str) -> str:
    member = named if isinstance(named, str) else default
    return members.get(member, b"").decode("utf-8", "replace")


def _mapping(value: object) -> dict[str, Mapping[str, object]]:
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, dict)}


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _optional_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


# ---- the exchange, without I/O -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Request:
    """One execute request, ready to send."""

    build_id: str
    files: list[tuple[str, tuple[str, bytes, str]]]
    http_timeout_seconds: float
    deadline: float  # monotonic: give up (and cancel) if no bundle by then


def _request(
    source: str,
    parts: list[_Part],
    *,
    timeout_seconds: float,
    env: Mapping[str, str] | None,
    queue_timeout_seconds: float,
) -> _Request:
    build_id = f"client-{uuid.uuid4().hex[:16]}"
    envelope = {
        "protocol_version": _PROTOCOL,
        "build_id": build_id,
        "transform": {
            "ref": _TRANSFORM_REF,
            "params": {
                "source": source,
                "timeout_seconds": timeout_seconds,
                "env": dict(env or {}),
            },
        },
        "inputs": [part.descriptor for part in parts],
    }
    files = [("metadata", ("metadata.json", json.dumps(envelope).encode(), "application/json"))]
    files += [(p.file_name, (p.file_name, p.data, "application/octet-stream")) for p in parts]
    return _Request(
        build_id=build_id,
        files=files,
        # As Strata's client: the cell's time plus slack, never under 30 s without a byte.
        http_timeout_seconds=max(timeout_seconds + 5.0, 30.0),
        deadline=time.monotonic() + queue_timeout_seconds + timeout_seconds + 5.0,
    )


def _base_url(url: str) -> httpx.URL:
    """The worker's root URL, from either it or the full ``…/v1/execute`` URL Strata uses."""
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"not an http(s) URL: {url!r}")
    path = parsed.path.rstrip("/")
    for suffix in (_EXECUTE_PATH, "/v1/notebook-execute"):
        path = path.removesuffix(suffix)
    return parsed.copy_with(path=path + "/", query=None, fragment=None)


def _headers(token: str | None) -> dict[str, str]:
    headers = {"x-strata-executor-protocol": _PROTOCOL}
    if token:
        headers["authorization"] = f"Bearer {token}"
    return headers


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("detail", "error"):
            if body.get(key):
                value = body[key]
                return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(body)[:500]


def _failure(status_code: int, detail: str) -> ClientError:
    if status_code in (408, 504):
        return CellTimeout(status_code, detail)
    return RequestFailed(status_code, detail)


def _bundle_of(response: httpx.Response) -> bytes:
    """The bundle bytes of a 200 answer, after the protocol headers are checked."""
    for header, expected in (
        ("x-strata-executor-protocol", _PROTOCOL),
        ("x-strata-notebook-executor-protocol", _NOTEBOOK_PROTOCOL),
    ):
        sent = response.headers.get(header)
        if sent is not None and sent != expected:
            raise ProtocolError(f"the worker speaks {header} {sent!r}, not {expected!r}")
    return response.content


def _job_url(response: httpx.Response, base: httpx.URL) -> httpx.URL:
    """The job URL of a 202 answer; it must stay on the worker (the token goes with it)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    raw = body.get("job_url") if isinstance(body, dict) else None
    if not isinstance(raw, str) or not raw:
        raise ProtocolError("a 202 answer without a job_url")
    url = base.join(raw)
    if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
        raise ProtocolError(f"the job URL {raw!r} points away from the worker")
    return url


def _answer(response: httpx.Response, base: httpx.URL) -> bytes | httpx.URL:
    """The bundle of a 200, the job URL of a 202; anything else raises."""
    if response.status_code == 200:
        return _bundle_of(response)
    if response.status_code == 202:
        return _job_url(response, base)
    raise _failure(response.status_code, _detail(response))


def _poll_answer(response: httpx.Response) -> bytes | None:
    """A job poll's bundle; None while the job is pending; a failed job raises."""
    if response.status_code != 200:
        raise _failure(response.status_code, _detail(response))
    if not response.headers.get("content-type", "").startswith("application/json"):
        return _bundle_of(response)
    body = response.json()
    state = body.get("state") if isinstance(body, dict) else None
    if state in _PENDING_STATES:
        return None
    if state == "failed":
        status = body.get("status_code")
        raise _failure(status if isinstance(status, int) else 502, _detail(response))
    raise ProtocolError(f"a job poll answered state {state!r} without a bundle")


def _poll_delays(deadline: float) -> Iterator[float]:
    """Seconds to wait before each job poll (quick at first, then 1 s) until *deadline*."""
    delay = 0.05
    while time.monotonic() + delay <= deadline:
        yield delay
        delay = min(delay * 2, 1.0)


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """httpx's exceptions as this module's: the one place they are translated."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise CellTimeout(None, f"{what}: no answer from the worker in time") from exc
    except httpx.HTTPError as exc:
        raise WorkerUnreachable(f"{what}: {exc}") from exc


def _past_deadline() -> CellTimeout:
    return CellTimeout(None, "no result by the client's deadline; the cell was cancelled")


# ---- the two clients -----------------------------------------------------------------


class _ClientBase:
    """What both clients hold: where the worker is, and the timeouts."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout_seconds: float = 30.0,
        queue_timeout_seconds: float = 600.0,
    ) -> None:
        self.base_url = _base_url(url)
        self.timeout_seconds = timeout_seconds
        self.queue_timeout_seconds = queue_timeout_seconds
        self._headers = _headers(token)
        self._connect()

    def _connect(self) -> None:
        raise NotImplementedError

    def _request(
        self, source: str, parts: list[_Part], timeout: float | None, env: Mapping[str, str] | None
    ) -> _Request:
        return _request(
            source,
            parts,
            timeout_seconds=self.timeout_seconds if timeout is None else timeout,
            env=env,
            queue_timeout_seconds=self.queue_timeout_seconds,
        )


class Client(_ClientBase):
    """A synchronous client for one worker.

    *url* is the worker's root (``http://127.0.0.1:9000``) or the execute URL a Strata
    notebook uses (``…/v1/execute``); *token* is sent as a bearer token. A cell's timeout
    defaults to *timeout_seconds*; a queued cell (``202``) is waited for up to
    *queue_timeout_seconds* more, then cancelled.
    """

    _http: httpx.Client

    def _connect(self) -> None:
        self._http = httpx.Client(base_url=self.base_url, headers=self._headers)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def health(self) -> dict[str, object]:
        """``GET /health``: capabilities and pool state (also while unhealthy: 503)."""
        with _translated("GET /health"):
            return _health(self._http.get("health", timeout=10.0))

    def run(
        self,
        source: str,
        inputs: Mapping[str, object] | None = None,
        *,
        timeout_seconds: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CellResult:
        """Run *source* with *inputs* bound as variables. A cell that raises is a result;
        everything else that goes wrong raises a :class:`ClientError`.
        """
        started = time.perf_counter()
        request = self._request(source, _encode_inputs(inputs or {}), timeout_seconds, env)
        try:
            body = self._exchange(request)
        except RequestFailed:  # the worker's final word: nothing runs
            raise
        except BaseException:  # interrupted, timed out, cut off: stop the cell if it runs
            with contextlib.suppress(httpx.HTTPError):
                self._http.post(_cancel_path(request), timeout=_CANCEL_TIMEOUT_SECONDS)
            raise
        return _parse_bundle(body, time.perf_counter() - started)

    def _exchange(self, request: _Request) -> bytes:
        with _translated("POST /v1/execute"):
            response = self._http.post(
                _EXECUTE_PATH[1:], files=request.files, timeout=request.http_timeout_seconds
            )
        answer = _answer(response, self.base_url)
        if isinstance(answer, bytes):
            return answer
        for delay in _poll_delays(request.deadline):
            time.sleep(delay)  # the protocol's job polling: the worker cannot push
            with _translated("polling the job"):
                bundle = _poll_answer(self._http.get(answer, timeout=30.0))
            if bundle is not None:
                return bundle
        raise _past_deadline()


class AsyncClient(_ClientBase):
    """:class:`Client` for asyncio: the same arguments, coroutines instead of calls.

    Inputs are encoded and bundles read in a thread, off the event loop. Cancelling a
    ``run`` cancels the cell on the worker too.
    """

    _http: httpx.AsyncClient

    def _connect(self) -> None:
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self._headers)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def health(self) -> dict[str, object]:
        """As :meth:`Client.health`."""
        with _translated("GET /health"):
            return _health(await self._http.get("health", timeout=10.0))

    async def run(
        self,
        source: str,
        inputs: Mapping[str, object] | None = None,
        *,
        timeout_seconds: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CellResult:
        """As :meth:`Client.run`."""
        started = time.perf_counter()
        parts = await asyncio.to_thread(_encode_inputs, dict(inputs or {}))
        request = self._request(source, parts, timeout_seconds, env)
        try:
            body = await self._exchange(request)
        except RequestFailed:
            raise
        except BaseException:
            # Shielded, so a cancelled run still reaches the worker (bounded by its timeout).
            await asyncio.shield(self._cancel(request))
            raise
        return await asyncio.to_thread(_parse_bundle, body, time.perf_counter() - started)

    async def _exchange(self, request: _Request) -> bytes:
        with _translated("POST /v1/execute"):
            response = await self._http.post(
                _EXECUTE_PATH[1:], files=request.files, timeout=request.http_timeout_seconds
            )
        answer = _answer(response, self.base_url)
        if isinstance(answer, bytes):
            return answer
        for delay in _poll_delays(request.deadline):
            await asyncio.sleep(delay)  # the protocol's job polling: the worker cannot push
            with _translated("polling the job"):
                bundle = _poll_answer(await self._http.get(answer, timeout=30.0))
            if bundle is not None:
                return bundle
        raise _past_deadline()

    async def _cancel(self, request: _Request) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self._http.post(_cancel_path(request), timeout=_CANCEL_TIMEOUT_SECONDS)


def _cancel_path(request: _Request) -> str:
    return f"v1/executions/{request.build_id}/cancel"


def _health(response: httpx.Response) -> dict[str, object]:
    if response.status_code not in (200, 503):
        raise RequestFailed(response.status_code, _detail(response))
    try:
        body = response.json()
    except ValueError as exc:
        raise ProtocolError("/health did not answer JSON") from exc
    if not isinstance(body, dict):
        raise ProtocolError("/health did not answer a JSON object")
    return body
