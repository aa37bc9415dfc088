"""The wire formats: the push envelopes and the output bundle.

``envelopes`` parses a request's metadata into one ``CellRequest``; ``bundle`` plans and
writes the ``notebook-output-bundle@v1`` tar (``manifest`` says what its manifest holds),
``tarwriter`` and ``stored_gzip`` the bytes of it, and ``streaming`` sends a large one while
it is written.

Knows nothing of HTTP or of kernels: it may import ``mounts`` (a request's mount specs),
``runs`` (what a run left to bundle), ``agent`` (the run plan's types) and the shared
``errors``.
"""

__all__: list[str] = []
