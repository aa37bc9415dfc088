"""``strata-kernel-worker``: start the worker (a warm kernel pool behind the v1 protocol)."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import math
import os
import pwd
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kernel_pool import RecyclePolicy

from . import logs
from .kernel_env import ALLOWLIST_ENV_VAR, parse_allowlist
from .mount_cache import MountCache
from .settings import (
    DEFAULT_PORT,
    Settings,
    allow_local_hosts_from_env,
    allowed_hosts_from_env,
    default_run_root,
    max_input_bytes_from_env,
    parse_gpu_slots,
    parse_size,
    prepare_run_root,
)

ENV_PREFIX = "STRATA_KERNEL_WORKER_"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (0-65535), got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size_or_zero(text: str) -> int:
    return 0 if text.strip() == "0" else _size(text)


def _slots(text: str) -> tuple[str, ...]:
    try:
        return parse_gpu_slots(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):  # refuses nan and inf too
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more, got {text}")
    return value


_LOG_LEVELS = ("debug", "info", "warning", "error")


def _log_level(text: str) -> str:
    value = text.strip().lower()
    if value not in _LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(_LOG_LEVELS)}, got {text}")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):  # refuses nan and inf too
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _compresslevel(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 9:
        raise argparse.ArgumentTypeError("must be 0 (stored) to 9")
    return value


# flag, environment variable, type, help
_OPTIONS: list[tuple[str, str, Callable[[str], Any], str]] = [
    (
        "--host",
        f"{ENV_PREFIX}HOST",
        str,
        "address to bind (default 127.0.0.1; 0.0.0.0 when a token is set)",
    ),
    ("--port", f"{ENV_PREFIX}PORT", _port, f"port to bind (default {DEFAULT_PORT})"),
    (
        "--connect",
        f"{ENV_PREFIX}CONNECT",
        str,
        "bind no port: dial out to the relay at this ws:// or wss:// URL and serve the requests "
        "it forwards, redialling with backoff; the relay's token is read from "
        "STRATA_WORKER_CONNECT_TOKEN (--host and --port are then unused)",
    ),
    (
        "--pool-size",
        f"{ENV_PREFIX}POOL_SIZE",
        _positive_int,
        "kernels that run cells at once (default 2)",
    ),
    (
        "--spares",
        f"{ENV_PREFIX}SPARES",
        _non_negative_int,
        "extra warm kernels so a restart never makes a request wait (default 0)",
    ),
    (
        "--kernel-user",
        f"{ENV_PREFIX}KERNEL_USER",
        str,
        "when the worker runs as root: a uid range FIRST-LAST gives each kernel a uid of "
        "its own (kernels cannot reach the worker or one another; no passwd entries "
        "needed), a user name runs every kernel as that one user",
    ),
    (
        "--kernel-name",
        f"{ENV_PREFIX}KERNEL_NAME",
        str,
        "Jupyter kernelspec to run (default: ipykernel of this Python)",
    ),
    (
        "--kernel-start",
        f"{ENV_PREFIX}KERNEL_START",
        str,
        "'fork' kernels from a process with ipykernel imported (default; ipykernel of this "
        "Python only) or 'spawn' each from a new interpreter",
    ),
    (
        "--preload",
        f"{ENV_PREFIX}PRELOAD",
        str,
        "Python file run once, in the template every kernel is forked from (imports, "
        "models; plain Python, no threads, sockets or GPU); its names are in every kernel",
    ),
    (
        "--kernel-init",
        f"{ENV_PREFIX}KERNEL_INIT",
        str,
        "Python file run in each kernel at start, as a cell, after the fork: what cannot be "
        "forked (a GPU context, threads, connections); its names stay warm too",
    ),
    (
        "--kernel-start-timeout",
        f"{ENV_PREFIX}KERNEL_START_TIMEOUT",
        _positive_seconds,
        "seconds a kernel may take to start, its preload included (default 600)",
    ),
    (
        "--recycle",
        f"{ENV_PREFIX}RECYCLE",
        str,
        "after a cell: 'reset' the kernel to its warm baseline (default) or use a 'fresh' one",
    ),
    (
        "--max-uses",
        f"{ENV_PREFIX}MAX_USES",
        _positive_int,
        "restart a kernel after this many cells (default: never)",
    ),
    (
        "--max-kernel-memory",
        f"{ENV_PREFIX}MAX_KERNEL_MEMORY",
        _size,
        "restart a kernel whose memory exceeds this after a cell, e.g. 4G (default: no limit)",
    ),
    (
        "--gpu-slots",
        "STRATA_WORKER_GPU_SLOTS",
        _slots,
        "GPUs to pin kernels to: a count N (ids 0..N-1) or a list like 0,2 (default: none)",
    ),
    (
        "--timeout-status",
        f"{ENV_PREFIX}TIMEOUT_STATUS",
        int,
        "HTTP status for a cell that times out: 408 (what Strata expects, default) or 504",
    ),
    (
        "--queue-wait",
        f"{ENV_PREFIX}QUEUE_WAIT",
        _seconds,
        "seconds a request waits inline for a kernel; then it is answered 202 with a job "
        "URL to poll (default 2)",
    ),
    (
        "--queue-depth",
        f"{ENV_PREFIX}QUEUE_DEPTH",
        _non_negative_int,
        "executions that may wait for a kernel; more get 503 + Retry-After (default 32)",
    ),
    (
        "--max-concurrent",
        "STRATA_WORKER_MAX_CONCURRENT",
        _positive_int,
        "executions admitted at once, running or waiting for a kernel; more get 503 + "
        "Retry-After (default: no cap but --queue-depth on those waiting)",
    ),
    (
        "--body-timeout",
        f"{ENV_PREFIX}BODY_TIMEOUT",
        _positive_seconds,
        "seconds an upload may send nothing before it is answered 408 and what it sent is "
        "removed (default 60)",
    ),
    (
        "--max-uploads",
        f"{ENV_PREFIX}MAX_UPLOADS",
        _positive_int,
        "push-model request bodies received at once; more get 503 + Retry-After (default 16)",
    ),
    (
        "--header-timeout",
        f"{ENV_PREFIX}HEADER_TIMEOUT",
        _positive_seconds,
        "seconds a connection may take to send a request's headers, from its first byte "
        "(from the connection, for its first request); then it is closed (default 10)",
    ),
    (
        "--max-connections",
        f"{ENV_PREFIX}MAX_CONNECTIONS",
        _positive_int,
        "connections open at once; one more closes the one idle longest, or is answered 503 "
        "when every one has a request in flight (default 1024)",
    ),
    (
        "--send-timeout",
        f"{ENV_PREFIX}SEND_TIMEOUT",
        _positive_seconds,
        "seconds a client may read nothing of an answer being sent; then the connection is "
        "closed and what the answer held is freed (default 60)",
    ),
    (
        "--job-ttl",
        f"{ENV_PREFIX}JOB_TTL",
        _seconds,
        "seconds a finished job's result is kept for its poller (default 600)",
    ),
    (
        "--console-cap",
        f"{ENV_PREFIX}CONSOLE_CAP",
        _size,
        "characters of stdout/stderr kept per stream (default 16M)",
    ),
    (
        "--max-folder-input-bytes",
        f"{ENV_PREFIX}MAX_FOLDER_INPUT_BYTES",
        _size,
        "bytes a folder input (dir/tar) may unpack to, checked as it unpacks; past it the "
        "cell fails naming the cap (default: the input cap, STRATA_WORKER_MAX_INPUT_BYTES)",
    ),
    (
        "--max-folder-input-entries",
        f"{ENV_PREFIX}MAX_FOLDER_INPUT_ENTRIES",
        _positive_int,
        "files, folders and links a folder input (dir/tar) may unpack to (default 50000)",
    ),
    (
        "--max-display-bytes",
        f"{ENV_PREFIX}MAX_DISPLAY_BYTES",
        _size,
        "bytes of one display, all its formats together; a larger one is dropped and a note "
        "says so (default 64M)",
    ),
    (
        "--max-run-display-bytes",
        f"{ENV_PREFIX}MAX_RUN_DISPLAY_BYTES",
        _size,
        "bytes of all the displays a run keeps; a display past it is dropped and a note says "
        "so (default 256M)",
    ),
    (
        "--max-output-dir-files",
        f"{ENV_PREFIX}MAX_OUTPUT_DIR_FILES",
        _positive_int,
        "files a run's # @output_dir folders return, all folders together; the rest are left "
        "out and the answer says so (default 10000)",
    ),
    (
        "--file-reuse-bytes",
        f"{ENV_PREFIX}FILE_REUSE_BYTES",
        _size_or_zero,
        "on a memory filesystem, large files of finished runs kept (up to this many bytes, "
        "for 60 s) so later large inputs and outputs are written over their pages instead "
        "of new ones (default 256M; 0: off; always off with --kernel-user)",
    ),
    (
        "--bundle-compresslevel",
        f"{ENV_PREFIX}BUNDLE_COMPRESSLEVEL",
        _compresslevel,
        "gzip level of result bundles, 0 (stored) to 9 (default: 2 or stored, chosen per "
        "bundle by whether its largest output compresses)",
    ),
    (
        "--run-dir",
        f"{ENV_PREFIX}RUN_DIR",
        Path,
        "where per-request directories are made (default: /dev/shm when it is a tmpfs with "
        "2 GiB free, else the system temp dir)",
    ),
    (
        "--log-level",
        f"{ENV_PREFIX}LOG_LEVEL",
        _log_level,
        "debug, info (default), warning or error",
    ),
    ("--log-format", f"{ENV_PREFIX}LOG_FORMAT", str, "'text' (default) or 'json' (JSON lines)"),
    (
        "--drain-seconds",
        f"{ENV_PREFIX}DRAIN_SECONDS",
        _seconds,
        "on SIGTERM, how long executions in flight may finish while new ones get 503 (default 30)",
    ),
    (
        "--heartbeat-seconds",
        "STRATA_WORKER_HEARTBEAT_SECONDS",
        _positive_seconds,
        "POST /execute (strata-pool): an answer not ready within this interval is sent as a "
        "200 that streams a space every interval, then the status and body in JSON (default: "
        "off)",
    ),
    (
        "--metrics-port",
        f"{ENV_PREFIX}METRICS_PORT",
        _port,
        "also serve Prometheus /metrics without a token on this port (default: only the "
        "token-gated /metrics route)",
    ),
]


def _poll_seconds(environ: Mapping[str, str]) -> float:
    """``STRATA_WORKER_OUTPUT_DIR_POLL_SECONDS``; unparsable or non-positive → 5."""
    try:
        value = float(environ.get("STRATA_WORKER_OUTPUT_DIR_POLL_SECONDS", ""))
    except ValueError:
        return 5.0
    return value if value > 0 else 5.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="strata-kernel-worker",
        description=(
            "Serve the Strata notebook executor protocol v1 from a pool of warm Jupyter "
            "kernels. Every option can also be set by the environment variable shown."
        ),
        epilog=(
            "To run one cell on a running worker from a shell: strata-kernel-worker run "
            "CELL.py [--input NAME=PATH] [--out DIR] (see strata-kernel-worker run --help)."
        ),
    )
    for flag, env, kind, text in _OPTIONS:
        parser.add_argument(flag, type=kind, default=None, help=f"{text} [env {env}]")
    parser.set_defaults(_env={flag: env for flag, env, _, _ in _OPTIONS})
    return parser


def settings_from(argv: Sequence[str] | None, environ: Mapping[str, str]) -> Settings:
    parser = build_parser()
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for flag, env, kind, _ in _OPTIONS:
        dest = flag[2:].replace("-", "_")
        value = getattr(args, dest)
        if value is None and environ.get(env, "").strip():
            try:
                value = kind(environ[env].strip())
            except (ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"{env}: {exc}")
        if value is not None:
            values[dest] = value
    return _settings(parser, values, environ)


_UID_RANGE = re.compile(r"(\d+)-(\d+)")


def _uid_range(
    parser: argparse.ArgumentParser, match: re.Match[str], values: Mapping[str, Any]
) -> tuple[int, int]:
    first, last = int(match.group(1)), int(match.group(2))
    kernels = values.get("pool_size", len(values.get("gpu_slots") or ()) or 2)
    kernels += values.get("spares", 0)
    if first < 1 or last < first or last >= 2**32 - 1:
        parser.error(f"--kernel-user: {first}-{last} is not a range of uids (first > 0)")
    if last - first + 1 < kernels + 1:
        parser.error(
            f"--kernel-user: {first}-{last} holds {last - first + 1} uids; {kernels} kernels "
            f"need {kernels + 1} (one each and one for a replacement)"
        )
    return first, last


def _settings(
    parser: argparse.ArgumentParser, values: dict[str, Any], environ: Mapping[str, str]
) -> Settings:
    token = environ.get("STRATA_WORKER_TOKEN", "").strip() or None
    recycle = values.pop("recycle", "reset")
    if recycle not in ("reset", "fresh"):
        parser.error("--recycle must be 'reset' or 'fresh'")
    if values.get("kernel_start", "fork") not in ("fork", "spawn"):
        parser.error("--kernel-start must be 'fork' or 'spawn'")
    kernel_user = values.get("kernel_user")
    if kernel_user is not None:
        uids = _UID_RANGE.fullmatch(kernel_user.strip())
        if uids is not None:
            values["kernel_uids"] = _uid_range(parser, uids, values)
            del values["kernel_user"]
        else:
            try:
                pwd.getpwnam(kernel_user)
            except KeyError:
                parser.error(f"--kernel-user: no such user: {kernel_user}")
        if os.geteuid() != 0:
            parser.error("--kernel-user needs the worker to run as root")
    for flag in ("preload", "kernel_init"):
        path = values.get(flag)
        if path is not None and not os.path.isfile(path):
            parser.error(f"--{flag.replace('_', '-')}: no such file: {path}")
    kwargs: dict[str, Any] = {
        "host": values.pop("host", "0.0.0.0" if token else "127.0.0.1"),
        # with GPU slots and no explicit size, one kernel per GPU
        "pool_size": values.pop("pool_size", len(values.get("gpu_slots") or ()) or 2),
        "recycle": RecyclePolicy(recycle),
        "token": token,
        "max_input_bytes": max_input_bytes_from_env(environ),
        "queue_wait_seconds": values.pop("queue_wait", 2.0),
        "job_ttl_seconds": values.pop("job_ttl", 600.0),
        "body_timeout_seconds": values.pop("body_timeout", 60.0),
        "header_timeout_seconds": values.pop("header_timeout", 10.0),
        "send_timeout_seconds": values.pop("send_timeout", 60.0),
        "run_root": values.pop("run_dir", None) or default_run_root(),
        "launch_id": environ.get("STRATA_WORKER_LAUNCH_ID") or None,
        "output_dir_poll_seconds": _poll_seconds(environ),
        "allow_local_hosts": allow_local_hosts_from_env(environ),
        "allowed_hosts": allowed_hosts_from_env(environ),
        "connect_token": environ.get("STRATA_WORKER_CONNECT_TOKEN", "").strip() or None,
        **values,
    }
    try:
        kwargs["kernel_env_allowlist"] = parse_allowlist(environ.get(ALLOWLIST_ENV_VAR, ""))
        MountCache.check_environ(environ)
    except ValueError as exc:
        parser.error(str(exc))
    metrics_port = kwargs.get("metrics_port")
    if metrics_port and metrics_port == kwargs.get("port", DEFAULT_PORT) and not values.get(
        "connect"
    ):
        parser.error(f"--metrics-port {metrics_port} is the worker's own --port")
    try:
        settings = Settings(**kwargs)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        prepare_run_root(settings.run_root)
    except OSError as exc:
        parser.error(f"--run-dir: cannot use {exc.filename or settings.run_root}: {exc.strerror}")
    return settings


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_transfer_buffers() -> bool:
    """Serve request-sized buffers from the heap instead of fresh pages (glibc only).

    A body arrives in 256 KiB reads that are copied a few times on their way to the run
    directory. glibc gives each such buffer its own ``mmap`` and returns it on ``free``, so
    every megabyte uploaded cost ~256 page faults (and the kernel zeroing those pages): a
    fifth of the worker's CPU for a 10 MB input. Buffers up to 1 MiB now come from the heap,
    and up to 32 MiB of freed heap is kept for the next request. Returns whether it applied.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 1 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 32 << 20))


#: the exit status when the kernels, the preload or the metrics port fail at start (uvicorn's)
STARTUP_FAILURE_STATUS = 3

#: the oldest Python Strata's notebook client runs on (its cells' outputs are read there)
STRATA_PYTHON = (3, 12)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["run"]:  # `strata-kernel-worker run CELL.py …`: the client, not the server
        from .client_cli import main as run_cell

        raise SystemExit(run_cell(args[1:]))
    from .app import create_app
    from .server import bind, serve

    settings = settings_from(argv, os.environ)
    keep_transfer_buffers()
    logs.configure(settings.log_level, settings.log_format)
    log = logging.getLogger("kernel_worker")
    if settings.token is None and settings.connect is not None:
        log.warning(
            "connecting to %s WITHOUT a token (STRATA_WORKER_TOKEN): anyone who can reach "
            "the relay can run code here",
            settings.connect,
        )
    elif settings.token is None and settings.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "binding %s WITHOUT a token: anyone who can reach it can run code", settings.host
        )
    if settings.kernel_user is not None and settings.pool_size + settings.spares > 1:
        log.warning(
            "kernels share the user %s: each is kept from the worker, not from the others (a "
            "cell can signal a sibling or connect to its sockets); give --kernel-user a uid "
            "range (e.g. 20000-20063) for a uid per kernel",
            settings.kernel_user,
        )
    if sys.version_info < STRATA_PYTHON:
        log.warning(
            "kernels run Python %d.%d, and Strata notebooks Python %d.%d or later: functions, "
            "lambdas and classes a cell returns go out pickled and may not load there (pickled "
            "code does not cross minor versions); run the worker on the notebook's Python",
            *sys.version_info[:2],
            *STRATA_PYTHON,
        )
    app = create_app(settings)
    if settings.connect is not None:
        from .relay import run_connected

        raise SystemExit(
            asyncio.run(
                run_connected(
                    app, settings.connect, settings.connect_token, settings.drain_seconds
                )
            )
        )
    # bound before the pool starts: a port in use fails at once, not after every kernel
    # (and a preload that may take minutes) has started
    config, sock = bind(app, settings)
    serve(config, sock, app, settings.drain_seconds)
    state = app.state.worker
    if state.startup_failure is not None:
        log.error("%s", state.startup_failure)
        raise SystemExit(STARTUP_FAILURE_STATUS)


if __name__ == "__main__":  # pragma: no cover
    main()
