"""Options of cells in other languages than Python: R cells, and the pool of R kernels."""

from __future__ import annotations

from .environments import on_off
from .model import Option
from .parsing import ENV_PREFIX, positive_int

__all__ = ["OPTIONS"]

OPTIONS: tuple[Option, ...] = (
    Option(
        "--r-kernels",
        f"{ENV_PREFIX}R_KERNELS",
        on_off,
        "'on': run R cells on warm R kernels when R and IRkernel are found at start; "
        "'off': answer them as a worker without R does",
        details=(
            "`on`: `/health` lists `r` in `languages` when the `ir` kernelspec, R, and the R "
            "packages IRkernel and jsonlite were found at start, and R cells run on warm "
            "IRkernel kernels of their own pool. `off` (or R missing): an R cell is answered "
            "500 `Rscript is not installed on this worker`, as the reference answers it. See "
            "[R cells](r.md)."
        ),
    ),
    Option(
        "--r-pool-size",
        f"{ENV_PREFIX}R_POOL_SIZE",
        positive_int,
        "kernels of the R cells' pool (started on the first R cell)",
        details=(
            "R cells that run at once. The pool starts on the first R cell and is kept warm; "
            "its kernels are reset between requests (or replaced, with `--recycle fresh`, "
            "when `--spares` applies to it too)."
        ),
    ),
)
