"""The agent shipped into every kernel, and the code that ships it.

``codecs.py`` and ``runtime.py`` in this folder run inside kernels: they are sent as source
text at kernel start-up (so a kernelspec from any environment works, with or without this
package installed there) and become the in-kernel package ``strata_kernel_agent``. They use
only the standard library at import time.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

AGENT_PACKAGE = "strata_kernel_agent"
_MODULES = ("arrow_codec", "codecs", "runtime")  # dependency order


@cache
def setup_code() -> str:
    """Kernel source that installs the agent (our own fixed code; no request data in it)."""
    here = Path(__file__).parent
    sources = {name: (here / f"{name}.py").read_text(encoding="utf-8") for name in _MODULES}
    return (
        "def __strata_agent_boot(sources):\n"
        "    import sys, types\n"
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
        "    package.runtime.install(get_ipython())\n"
        f"__strata_agent_boot({sources!r})\n"
        "del __strata_agent_boot\n"
    )


__all__ = ["AGENT_PACKAGE", "setup_code"]
