"""Settings read only from the environment: secrets, and values shared with Strata's own
worker (``STRATA_WORKER_*``) or with a Strata server (``STRATA_NOTEBOOK_*``)."""

from __future__ import annotations

from .model import Setting

__all__ = ["SETTINGS"]

SETTINGS: tuple[Setting, ...] = (
    Setting(
        ("STRATA_WORKER_CONNECT_TOKEN",),
        default="none",
        details=(
            "With `--connect`: the token the relay expects from this worker. Removed from the "
            "environment at start, so kernels never see it."
        ),
    ),
    Setting(
        ("STRATA_WORKER_TOKEN",),
        default="none",
        details=(
            "Bearer token required on every `/v1/*` route (`/health` stays open). Removed from "
            "the environment at start, so kernels never see it."
        ),
    ),
    Setting(
        ("STRATA_WORKER_MAX_INPUT_BYTES",),
        default="2 GiB",
        details=(
            "Largest accepted input part; larger ones get `413` while streaming. The `metadata` "
            "part (the envelope, with the cell's source) is capped at 16 MiB, also `413` past it."
            " Also what a folder input may unpack to, unless `--max-folder-input-bytes` says "
            "otherwise."
        ),
    ),
    Setting(
        ("STRATA_WORKER_LAUNCH_ID",),
        default="none",
        details=("Echoed in `/health` as `launch_id`."),
    ),
    Setting(
        ("STRATA_WORKER_ALLOW_LOCAL_HOSTS",),
        default="off",
        details=(
            "`1`/`true`/`yes`: pull-model URLs may point at loopback/private addresses (local "
            "development and tests only)."
        ),
    ),
    Setting(
        ("STRATA_WORKER_ALLOWED_HOSTS",),
        default="none",
        details=(
            "Comma list of host names (or `.suffix` entries) that pull-model URLs may use without"
            " the address check."
        ),
    ),
    Setting(
        ("STRATA_WORKER_OUTPUT_DIR_POLL_SECONDS",),
        default="`5`",
        details=("How often a pull run's `# @output_dir` folders are scanned for settled files."),
    ),
    Setting(
        ("STRATA_NOTEBOOK_CREDENTIALS", "STRATA_NOTEBOOK_MOUNT_CREDENTIALS"),
        default="none",
        details=(
            "Named mount credentials (JSON of fsspec options with `${VAR}` references) and "
            "per-scheme defaults. Read at start, then removed from the environment. The only "
            "place a mount's endpoint, proxy, region, keys or token are set: a request's mount "
            "`options` may not name them (see [Mounts](protocol.md#mounts-and-output-folders))."
        ),
    ),
    Setting(
        ("STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST",),
        default="none",
        details=(
            "Comma list or JSON array of the variables kernels may see, as on a Strata server; "
            "unset, they see the worker's whole environment minus its secrets. See "
            "[Security](security.md). A value that starts like a JSON array but is not one stops "
            "start-up."
        ),
    ),
    Setting(
        (
            "STRATA_NOTEBOOK_MOUNT_CACHE_DIR",
            "STRATA_NOTEBOOK_MOUNT_CACHE_MAX_BYTES",
            "STRATA_NOTEBOOK_MOUNT_CACHE_MAX_IDLE_DAYS",
        ),
        default="`~/.strata/mount_cache`, 20 GiB, 30 days",
        details=("The machine-wide cache behind read-only mounts."),
    ),
)
