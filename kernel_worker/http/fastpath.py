"""A direct route to the execute endpoints, ahead of the framework's router.

A trivial cell costs the worker a few milliseconds of CPU, and about a quarter of that was
the router: matching every route of every included router, dependency resolution and the
exception-handling wrappers around one endpoint. :class:`FastPath` answers the hot
``POST`` endpoints itself, with the same token gate and the same error answers, and hands
every other request to the application unchanged (so the schema, the docs and the 404/405
answers stay the framework's).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import WorkerError, error_response
from .routes import require_token

Endpoint = Callable[[Request], Awaitable[Response]]


class FastPath:
    """ASGI middleware: ``POST`` to one of ``endpoints`` goes straight to its function.

    A :class:`WorkerError` becomes its JSON answer here, as the application's handler
    would make it; any other exception propagates to the application's error middleware.
    """

    def __init__(self, app: ASGIApp, endpoints: Mapping[str, Endpoint]) -> None:
        self.app = app
        self.endpoints = dict(endpoints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = None
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.endpoints.get(_route_path(scope))
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        state = request.app.state.worker
        try:
            await require_token(request)  # the routes' own gate
            response = await endpoint(request)
        except WorkerError as exc:
            response = error_response(exc, timeout_status=state.settings.timeout_status)
        await response(scope, receive, send)


def _route_path(scope: Scope) -> str:
    """The request's path below the application's mount point (``root_path``)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
