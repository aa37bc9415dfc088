"""What ``kernel_worker.http.connections`` relies on in uvicorn's private httptools protocol.

``GuardedProtocol`` subclasses ``HttpToolsProtocol``, which uvicorn does not promise to keep:
these fail on a uvicorn whose protocol no longer has the methods it overrides (with the
arguments it passes on) or the attributes it reads, before any connection shows it.
"""

from __future__ import annotations

import asyncio
import inspect

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from kernel_worker.http.connections import ConnectionLimits, GuardedProtocol, guarded_protocol

OVERRIDDEN = {
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "data_received": ["self", "data"],
    "on_message_begin": ["self"],
    "on_headers_complete": ["self"],
    "on_response_complete": ["self"],
    "pause_writing": ["self"],
    "resume_writing": ["self"],
}


async def _app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("no request reaches the app here")


def test_the_methods_it_overrides_take_what_it_passes() -> None:
    for name, parameters in OVERRIDDEN.items():
        method = getattr(HttpToolsProtocol, name, None)
        assert callable(method), f"uvicorn's protocol has no {name}"
        assert list(inspect.signature(method).parameters) == parameters, name
        assert name in vars(GuardedProtocol), f"{name} is no longer overridden: update the list"


def test_a_protocol_has_the_attributes_it_reads() -> None:
    init = inspect.signature(HttpToolsProtocol.__init__).parameters
    assert list(init)[:4] == ["self", "config", "server_state", "app_state"]
    loop = asyncio.new_event_loop()
    try:
        config = uvicorn.Config(_app, http=guarded_protocol(ConnectionLimits()), log_config=None)
        config.load()
        state = ServerState()
        protocol = config.http_protocol_class(config, state, {}, _loop=loop)
        assert isinstance(protocol, GuardedProtocol)
        assert protocol.loop is loop
        assert protocol.connections is state.connections  # a set it joins and leaves
        assert protocol.cycle is None  # no request yet
    finally:
        loop.close()
    assert "transport" in _assigned(HttpToolsProtocol)  # by connection_made
    assert {"more_body", "response_complete"} <= _assigned(RequestResponseCycle)


def _assigned(cls: type) -> set[str]:
    """The attributes ``cls``'s methods assign on ``self``."""
    source = inspect.getsource(cls)
    return {line.split("self.", 1)[1].split(" ", 1)[0].split(":", 1)[0]
            for line in source.splitlines() if line.strip().startswith("self.") and "=" in line}  # fmt: skip
