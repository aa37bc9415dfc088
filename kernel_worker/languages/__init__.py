"""Cell languages besides Python: today R (:mod:`.r`), on warm R kernels of their own pool.

A language brings the kind of kernel that runs its cells and its own path through a cell
(plan, one execute_request, outcome), beside the Python one in ``execution.py``; admission,
leasing, cancel, the console and the bundle are the worker's, shared.
"""

from .r import R_UNAVAILABLE, RKernels, run_r_cell

__all__ = ["R_UNAVAILABLE", "RKernels", "run_r_cell"]
