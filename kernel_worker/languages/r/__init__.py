"""R cells on warm IRkernel kernels.

``support`` finds R and names the kernel kind; ``runtime`` is the R code the kernels run
(``session.R``: the baseline and the reset between requests; ``cell.R``: one cell);
``plan`` prepares a run, ``execution`` runs it on a lease, ``outputs`` and ``frames`` turn
what R left into the bundle's entries (data frames to and from Arrow, on the worker's side).
See docs/r.md.
"""

from .execution import run_r_cell
from .support import R_UNAVAILABLE, RKernels

__all__ = ["R_UNAVAILABLE", "RKernels", "run_r_cell"]
