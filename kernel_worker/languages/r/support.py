"""Whether this worker runs R cells, and the kind of kernel that runs them: :class:`RKernels`.

R cells run on IRkernel (the Jupyter kernelspec :data:`KERNELSPEC`). The worker looks once,
at start and off the event loop, for what the R side needs: the kernelspec, R itself
(``Rscript`` beside the kernelspec's ``R``, or on ``PATH``) and the R packages ``IRkernel``
and ``jsonlite``. ``/health`` lists ``"r"`` only when all of them answered.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

from kernel_pool import KernelKind

from ...environments import EnvironmentSpec
from ...errors import EnvironmentFailed, LanguageUnavailable
from .runtime import R_CODE

__all__ = ["KERNELSPEC", "R_UNAVAILABLE", "RKernels", "probe_r"]

log = logging.getLogger(__name__)

KERNELSPEC = "ir"
"""IRkernel's kernelspec (Debian's r-cran-irkernel installs it)."""
R_UNAVAILABLE = "Rscript is not installed on this worker"
"""The answer (500) to an R cell where R cells cannot run: the reference's words."""
R_PACKAGES = ("IRkernel", "jsonlite")
_PROBE_SECONDS = 30.0
_PROBE = (
    "ok <- all(nzchar(vapply(commandArgs(TRUE), function(p) system.file(package = p), ''))); "
    "quit(save = 'no', status = if (ok) 0L else 3L)"
)

R_KIND = KernelKind(name="r", language="r", kernel_name=KERNELSPEC, fork=False, code=R_CODE)
"""IRkernel, set up and reset by the worker's R code (``session.R``, ``cell.R``)."""


def probe_r(kernelspec: str = KERNELSPEC) -> str | None:
    """Why R cells cannot run here, or ``None`` when they can (blocking: runs R)."""
    try:
        spec = KernelSpecManager().get_kernel_spec(kernelspec)
    except NoSuchKernel:
        return f"no Jupyter kernelspec {kernelspec!r} (IRkernel)"
    r = shutil.which(spec.argv[0]) if spec.argv else None
    if r is None:
        return f"the kernelspec {kernelspec!r} names no R that can be found"
    beside = Path(r).with_name("Rscript")
    rscript = str(beside) if beside.exists() else shutil.which("Rscript")
    if rscript is None:
        return "no Rscript"
    try:
        done = subprocess.run(
            [rscript, "--vanilla", "-e", _PROBE, *R_PACKAGES],
            capture_output=True, timeout=_PROBE_SECONDS, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Rscript did not answer: {type(exc).__name__}"
    if done.returncode != 0:
        return f"R lacks one of the packages {', '.join(R_PACKAGES)}"
    return None


class RKernels:
    """R cells on this worker: turned on or off by the settings, found (or not) at start."""

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._missing: str | None = "not looked for yet" if enabled else "turned off"
        self.kind = R_KIND

    async def start(self) -> None:
        """Look for R once (a worker does not gain or lose it later)."""
        if not self._enabled:
            return
        self._missing = await asyncio.to_thread(probe_r)
        if self._missing is None:
            log.info("R cells run on IRkernel kernels")
        else:
            log.info("R cells cannot run here: %s", self._missing)

    @property
    def available(self) -> bool:
        return self._missing is None

    def kind_for(self, environment: EnvironmentSpec | None) -> KernelKind:
        """The kind that runs an R cell.

        Raises:
            LanguageUnavailable: R cells cannot run here (the reference's 500).
            EnvironmentFailed: The cell names a locked environment (never advertised for R).
        """
        if not self.available:
            raise LanguageUnavailable(R_UNAVAILABLE)
        if environment is not None:
            raise EnvironmentFailed("R cells run in the worker's own R library on this worker")
        return self.kind
