"""Options of locked environments: whether cells may name one, where they are built, what
may be built, and how many kernels their pools may hold."""

from __future__ import annotations

import argparse
from pathlib import Path

from .model import Option
from .parsing import ENV_PREFIX, positive_int, size

__all__ = ["OPTIONS", "on_off"]


def on_off(text: str) -> bool:
    value = text.strip().lower()
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"must be 'on' or 'off', got {text!r}")


OPTIONS: tuple[Option, ...] = (
    Option(
        "--locked-environments",
        f"{ENV_PREFIX}LOCKED_ENVIRONMENTS",
        on_off,
        "'on': run a notebook's cells in its own uv.lock environment when uv works here; "
        "'off': always in the worker's",
        details=(
            "`on`: `/health` advertises `locked_environments` when uv was found and answered at"
            " start, and a cell whose notebook has a `uv.lock` runs on warm kernels of that "
            "environment (built once per host). `off`: never advertised; a cell that names one"
            " anyway is answered 500. See [Locked environments](environments.md)."
        ),
    ),
    Option(
        "--env-root",
        "STRATA_WORKER_ENV_ROOT",
        Path,
        "folder of built environments, shared with other workers on the host "
        "(default ~/.strata/worker-envs)",
        default="`~/.strata/worker-envs`",
        details=(
            "Where environments are built: the reference worker's layout, directory keys, "
            "marker and lock, so workers of either kind on one host share it and never build "
            "one environment twice."
        ),
    ),
    Option(
        "--env-registry-url",
        "STRATA_WORKER_ENV_REGISTRY_URL",
        str,
        "a registry of prebuilt environment archives, tried before building (default none)",
        default="none",
        details=(
            "Base URL of prebuilt environment archives (the reference's naming). A missing or "
            "unusable archive falls back to a local build."
        ),
    ),
    Option(
        "--allow-source-builds",
        f"{ENV_PREFIX}ALLOW_SOURCE_BUILDS",
        on_off,
        "'off': refuse locks that need a package built from source; 'on' builds it, running "
        "its build code as the worker's user",
        details=(
            "A source distribution's build runs arbitrary code. `off`: a lock that needs one "
            "is answered 500 naming the package (wheels install without running code). `on`: "
            "uv builds it as the worker's user."
        ),
    ),
    Option(
        "--env-pool-size",
        f"{ENV_PREFIX}ENV_POOL_SIZE",
        positive_int,
        "kernels of each locked environment's pool",
        details=(
            "Kernels of each environment's pool, started on the environment's first cell and "
            "kept warm after."
        ),
    ),
    Option(
        "--max-kernels",
        f"{ENV_PREFIX}MAX_KERNELS",
        positive_int,
        "kernels of all pools together; idle environment pools used least recently stop "
        "first (default: the worker's pool plus 4)",
        default="the worker's pool (size and spares) plus 4",
        details=(
            "A cap on live kernels across the worker's pool and every environment's pool. To "
            "start another environment's pool, the idle ones used least recently are stopped "
            "first (never the worker's own); a cell waits while none is idle."
        ),
    ),
    Option(
        "--env-warm-up",
        f"{ENV_PREFIX}ENV_WARM_UP",
        on_off,
        "'on': at start, in the background, make the kernel overlay and fork template of the "
        "Python uv finds first, so a new environment's first cell does not pay for them",
        details=(
            "`on`: after start, beside the serving (readiness does not wait), the kernel "
            "overlay of the Python uv finds first is resolved (this asks the package index) "
            "and installed once per host, and a fork template of it started: a new "
            "environment's first cell then costs its `uv sync` and a fork. `/health` "
            "`environments.warm_up` says `running`, `done` or `failed` (logged). `off`: the "
            "first cell of the first environment pays for them."
        ),
    ),
    Option(
        "--env-max-disk",
        f"{ENV_PREFIX}ENV_MAX_DISK",
        size,
        "remove environments used least recently past this many bytes on disk (default: keep all)",
        default="none (keep all)",
        details=(
            "Opt-in eviction after each new build: environments used least recently are "
            "removed until the root holds at most this much. Never one with a live pool, nor "
            "one another process holds the lock of."
        ),
    ),
)
