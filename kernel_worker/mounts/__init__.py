"""Mounts: remote object-store prefixes a cell reads or writes as local folders.

``specs`` checks a request's ``mounts`` list, ``options`` is the allow-list of what a request
may set, ``materialize`` places and syncs the folders, ``cache`` and ``pins`` keep what was
downloaded or listed, ``probe`` answers how much of a listing is cached.

May import ``runs.files`` and the shared ``errors``; nothing of HTTP, the pull model or the
core.
"""

__all__: list[str] = []
