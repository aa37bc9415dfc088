"""Options of the kernel pool: how many kernels, how they start, what they preload, when
they are replaced, and which GPU and uid each one gets."""

from __future__ import annotations

from .model import Option
from .parsing import (
    ENV_PREFIX,
    non_negative_int,
    positive_int,
    positive_seconds,
    size,
    slots,
)

__all__ = ["OPTIONS"]

OPTIONS: tuple[Option, ...] = (
    Option(
        "--pool-size",
        f"{ENV_PREFIX}POOL_SIZE",
        positive_int,
        "kernels that run cells at once",
        details=("Kernels that run cells at once."),
    ),
    Option(
        "--spares",
        f"{ENV_PREFIX}SPARES",
        non_negative_int,
        "extra warm kernels so a restart never makes a request wait",
        details=("Extra warm kernels, so a restart never makes a request wait."),
    ),
    Option(
        "--kernel-name",
        f"{ENV_PREFIX}KERNEL_NAME",
        str,
        "Jupyter kernelspec to run (default: ipykernel of this Python)",
        default="ipykernel of this Python",
        details=(
            "Any installed Jupyter kernelspec (e.g. a conda env with torch). It must be an "
            "IPython kernel."
        ),
    ),
    Option(
        "--kernel-start",
        f"{ENV_PREFIX}KERNEL_START",
        str,
        "'fork' kernels from a process with ipykernel imported (default; ipykernel of this Python"
        " only) or 'spawn' each from a new interpreter",
        default="`fork`",
        details=(
            "`fork`: kernels are forked from a fork server that has ipykernel imported (ipykernel"
            " of this Python; another `--kernel-name` is always spawned). `spawn`: each kernel is"
            " a new interpreter. See [Kernel starts](kernels.md#kernel-starts)."
        ),
    ),
    Option(
        "--preload",
        f"{ENV_PREFIX}PRELOAD",
        str,
        "Python file run once, in the template every kernel is forked from (imports, models; "
        "plain Python, no threads, sockets or GPU); its names are in every kernel",
        default="none",
        details=(
            "Python file run **once**, in the template every kernel is forked from: its names are"
            " in every kernel, its objects' memory is shared. Plain Python: no threads, sockets, "
            "open files or GPU context may be left (see [Preloading "
            "models](kernels.md#preloading-models-template-and-per-kernel-stage)). "
            "Spawned kernels run it "
            "each. A failing preload stops start-up with its error."
        ),
    ),
    Option(
        "--kernel-init",
        f"{ENV_PREFIX}KERNEL_INIT",
        str,
        "Python file run in each kernel at start, as a cell, after the fork: what cannot be "
        "forked (a GPU context, threads, connections); its names stay warm too",
        default="none",
        details=(
            "Python file run in each kernel at start, as a cell, after the fork (with the "
            "kernel's `CUDA_VISIBLE_DEVICES`): what cannot be forked, such as moving the model to"
            " this kernel's GPU or opening a connection. Its names stay warm too; a failing one "
            "stops start-up with its error."
        ),
    ),
    Option(
        "--kernel-start-timeout",
        f"{ENV_PREFIX}KERNEL_START_TIMEOUT",
        positive_seconds,
        "seconds a kernel may take to start, its preload included",
        details=(
            "Seconds a kernel may take to start, the preload (for the first kernel) and its "
            "`--kernel-init` included; a preload that runs longer stops start-up (`the preload … "
            "failed: … did not finish within the kernel start timeout`). A replacement kernel "
            "gets as long; meanwhile requests wait for a warm kernel."
        ),
    ),
    Option(
        "--recycle",
        f"{ENV_PREFIX}RECYCLE",
        str,
        "after a cell: 'reset' the kernel to its warm baseline (default) or use a 'fresh' one",
        default="`reset`",
        details=(
            "`reset`: reuse kernels after resetting them; `fresh`: every request gets a "
            "never-used kernel."
        ),
    ),
    Option(
        "--max-uses",
        f"{ENV_PREFIX}MAX_USES",
        positive_int,
        "restart a kernel after this many cells (default: never)",
        default="unlimited",
        details=("Replace a kernel after this many cells."),
    ),
    Option(
        "--max-kernel-memory",
        f"{ENV_PREFIX}MAX_KERNEL_MEMORY",
        size,
        "restart a kernel whose memory exceeds this after a cell, e.g. 4G (default: no limit)",
        default="unlimited",
        details=(
            "Replace a kernel whose memory (children included) exceeds this after a cell, e.g. "
            "`4G`."
        ),
    ),
    Option(
        "--gpu-slots",
        "STRATA_WORKER_GPU_SLOTS",
        slots,
        "GPUs to pin kernels to: a count N (ids 0..N-1) or a list like 0,2 (default: none)",
        default="none",
        details=(
            "Pin kernels to GPUs: a count `N` (ids `0..N-1`) or ids like `0,2`; sets "
            "`CUDA_VISIBLE_DEVICES` at kernel start."
        ),
    ),
    Option(
        "--kernel-user",
        f"{ENV_PREFIX}KERNEL_USER",
        str,
        "when the worker runs as root: a uid range FIRST-LAST gives each kernel a uid of its own "
        "(kernels cannot reach the worker or one another; no passwd entries needed), a user name "
        "runs every kernel as that one user",
        default="none",
        details=(
            "When the worker runs as root. A uid range `FIRST-LAST` (e.g. `20000-20063`, at least"
            " one more uid than kernels and spares): **each kernel runs as a uid of its own** "
            "(its gid the same number; no passwd entries needed), so no kernel can signal, trace "
            "or read the memory, environment or files of the worker or of another kernel, nor "
            "connect to their sockets; the worker's HTTP port answers any local process, behind "
            "the token (see [Security](security.md)). A user name: every kernel "
            "runs as that one user, kept from the worker but not from each other (logged as a "
            "warning when there is more than one kernel)."
        ),
    ),
)
