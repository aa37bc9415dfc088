"""The Strata notebook executor protocol (v1) served from warm Jupyter kernels.

The sub-packages, from the edge inwards: ``http`` (the application and its routes), ``pull``
(the manifest model), ``protocol`` (envelopes and the output bundle), ``mounts`` (object-store
folders), ``runs`` (one run directory and what a cell leaves there) and ``agent`` (the code
shipped into kernels); ``client`` stands alone. The modules at this level tie one execution
together (``service``, ``jobs``, ``execution``, ``state``) or are shared by all (``settings``,
``errors``, ``metrics``, ``logs``). ``docs/architecture.md`` follows a request through them.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
