"""The agent shipped into every kernel, and the code that ships it.

The other modules in this folder run inside kernels: they are sent as source text at kernel
start-up (so a kernelspec from any environment works, with or without this package installed
there) and become the in-kernel package ``strata_kernel_agent``. They use only the standard
library at import time.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

AGENT_PACKAGE = "strata_kernel_agent"
# in dependency order
_MODULES = (
    "arrow_codec",
    "arrow_read",
    "figures",
    "archives",
    "content_types",
    "objects",
    "mutations",
    "codecs",
    "tracebacks",
    "rebinding",
    "rundir",
    "display_files",
    "run_state",
    "displays",
    "plain_process",
    "inputs",
    "outputs",
    "runtime",
)


@cache
def _load_code() -> str:
    """Kernel source that makes the agent package from its sources (no request data in it).

    Idempotent: where the package is already loaded (a kernel forked from a fork server that
    ran :func:`fork_setup_code`) it does nothing.
    """
    here = Path(__file__).parent
    sources = {name: (here / f"{name}.py").read_text(encoding="utf-8") for name in _MODULES}
    return (
        "def __strata_agent_load(sources):\n"
        "    import sys, types\n"
        f"    if {AGENT_PACKAGE!r} in sys.modules:\n"
        "        return\n"
        f"    package = types.ModuleType({AGENT_PACKAGE!r})\n"
        "    package.__path__ = []\n"
        f"    package.__package__ = {AGENT_PACKAGE!r}\n"
        f"    sys.modules[{AGENT_PACKAGE!r}] = package\n"
        "    for name, source in sources.items():\n"
        f"        full = {AGENT_PACKAGE!r} + '.' + name\n"
        "        module = types.ModuleType(full)\n"
        f"        module.__package__ = {AGENT_PACKAGE!r}\n"
        "        sys.modules[full] = module\n"
        "        exec(compile(source, '<' + full + '>', 'exec'), module.__dict__)\n"
        "        setattr(package, name, module)\n"
        f"__strata_agent_load({sources!r})\n"
        "del __strata_agent_load\n"
    )


_INSTALL = f"__import__('sys').modules[{AGENT_PACKAGE!r}].runtime.install(get_ipython())\n"


@cache
def setup_code() -> str:
    """Kernel source that installs the agent, loading it first where it is not loaded yet."""
    return _load_code() + _INSTALL


def forked_setup_code() -> str:
    """Kernel source that installs the agent in a kernel forked after :func:`fork_setup_code`
    ran (the agent is loaded there): one line instead of the agent's whole source."""
    return _INSTALL


def fork_setup_code() -> str:
    """Source for a fork server to run once: forked kernels then start with the agent loaded
    (its modules import only the standard library when loaded), and :func:`setup_code`
    only installs it, instead of compiling ~1,700 lines in every new kernel."""
    return _load_code()


__all__ = ["AGENT_PACKAGE", "fork_setup_code", "forked_setup_code", "setup_code"]
