"""The direct route to the execute endpoints: what it takes, what it leaves to the app.

The worker's own tests (test_worker_http.py) run every execute request through it over
real HTTP; these pin its dispatch rules with a recording application behind it.
"""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from kernel_worker.errors import BadRequest
from kernel_worker.http.fastpath import FastPath

TOKEN = "s3cret"


class Recorder:
    """The application behind the fast path: records what reached it."""

    def __init__(self) -> None:
        self.paths: list[tuple[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.paths.append((scope["method"], scope["path"]))
        await PlainTextResponse("app")(scope, receive, send)


def client(fast: FastPath, *, root_path: str = "") -> httpx.AsyncClient:
    settings = SimpleNamespace(token=TOKEN, timeout_status=408)
    app = SimpleNamespace(state=SimpleNamespace(worker=SimpleNamespace(settings=settings)))

    async def with_app(scope: Scope, receive: Receive, send: Send) -> None:
        # what the framework sets before its middleware runs
        await fast({**scope, "app": app}, receive, send)

    transport = httpx.ASGITransport(app=with_app, root_path=root_path)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return httpx.AsyncClient(transport=transport, base_url="http://w", headers=headers)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def fast(recorder: Recorder) -> FastPath:
    async def execute(request: Request) -> Response:
        body = await request.body()
        if body == b"bad":
            raise BadRequest("metadata part is missing")
        return PlainTextResponse(f"fast {len(body)}")

    return FastPath(recorder, {"/v1/execute": execute})


async def test_a_post_to_an_endpoint_skips_the_app(fast: FastPath, recorder: Recorder) -> None:
    async with client(fast) as http:
        response = await http.post("/v1/execute", content=b"12345")
    assert (response.status_code, response.text) == (200, "fast 5")
    assert recorder.paths == []


async def test_everything_else_reaches_the_app(fast: FastPath, recorder: Recorder) -> None:
    async with client(fast) as http:
        for method, path in [("GET", "/v1/execute"), ("POST", "/v1/execute/"),
                             ("POST", "/v1/other"), ("GET", "/health")]:  # fmt: skip
            response = await http.request(method, path)
            assert response.text == "app", (method, path)
    assert recorder.paths == [
        ("GET", "/v1/execute"), ("POST", "/v1/execute/"), ("POST", "/v1/other"), ("GET", "/health")
    ]  # fmt: skip


async def test_the_token_gate_runs_first(fast: FastPath, recorder: Recorder) -> None:
    async with client(fast) as http:
        missing = await http.post("/v1/execute", content=b"x", headers={"Authorization": ""})
        wrong = await http.post(
            "/v1/execute", content=b"x", headers={"Authorization": "Bearer nope"}
        )
    assert missing.status_code == wrong.status_code == 401
    assert "Bearer" in missing.json()["detail"]
    assert wrong.json()["detail"] == "Invalid worker token"
    assert recorder.paths == []


async def test_a_worker_error_becomes_its_json_answer(fast: FastPath) -> None:
    async with client(fast) as http:
        response = await http.post("/v1/execute", content=b"bad")
    assert response.status_code == 400
    assert response.json() == {"detail": "metadata part is missing"}


async def test_paths_are_matched_below_the_mount_point(fast: FastPath, recorder: Recorder) -> None:
    async with client(fast, root_path="/worker") as http:
        response = await http.post("/worker/v1/execute", content=b"ab")
    assert response.text == "fast 2"
    assert recorder.paths == []
