"""A client for a running worker, and the ``strata-kernel-worker run`` command.

``session`` is the client (``Client``, ``AsyncClient``), ``values`` what it sends and gets
back, ``errors`` what it raises, ``cli`` the command for humans. Import it as
``kernel_worker.client``: this package re-exports the public names.

Independent of the server: it imports nothing of the worker outside this package.
"""

from .session import *  # noqa: F403
from .session import __all__ as __all__
