"""The agent shipped into every kernel: binds a cell's inputs, runs it, writes its outputs.

The modules in this folder run inside kernels, as the package ``strata_kernel_agent``: the
worker names it in the pool's ``KernelSetup`` and the pool ships their sources (so a
kernel from any environment runs it, whether this package is installed there or not), then
calls :data:`INSTALL` in each kernel. Every module here, this one included, uses only the
standard library at import time.
"""

AGENT_PACKAGE = "strata_kernel_agent"
"""The name the agent is imported as in a kernel."""
INSTALL = f"{AGENT_PACKAGE}.runtime:install"
"""Called in each kernel as ``install(shell, hooks)`` (see :mod:`.runtime`)."""

__all__ = ["AGENT_PACKAGE", "INSTALL"]
