"""The HTTP edge: the application, its routes, and what guards them.

``app`` builds the ASGI application and owns the pool's lifetime; ``routes`` and ``fastpath``
answer the protocol's routes; ``auth`` is the token gate; ``staging`` streams multipart bodies
into run directories; ``server``, ``connections`` and ``relay`` serve it on a port or through a
relay; ``heartbeat`` keeps strata-pool's proxy connections alive.

May import everything below it (``pull``, the core, ``protocol``, ``mounts``, ``runs``);
nothing of the worker imports it but the command line.
"""

__all__: list[str] = []
