"""``strata-kernel-worker``: start the worker (a warm kernel pool behind the v1 protocol)."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import pwd
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from kernel_pool import RecyclePolicy

from . import __version__, logs
from .kernel_env import ALLOWLIST_ENV_VAR, parse_allowlist
from .mounts.cache import MountCache
from .options import GROUPS, OPTIONS
from .settings import (
    DEFAULT_PORT,
    Settings,
    allow_local_hosts_from_env,
    allowed_hosts_from_env,
    default_run_root,
    max_input_bytes_from_env,
    prepare_run_root,
)


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
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    for title, group in GROUPS:
        section = parser.add_argument_group(title.lower())
        for option in group:
            text = f"{option.help_line} [env {option.env}]"
            section.add_argument(option.flag, type=option.parse, default=None, help=text)
    return parser


def settings_from(argv: Sequence[str] | None, environ: Mapping[str, str]) -> Settings:
    parser = build_parser()
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for option in OPTIONS:
        dest, env = option.dest, option.env
        value = getattr(args, dest)
        if value is None and environ.get(env, "").strip():
            try:
                value = option.parse(environ[env].strip())
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
    # options named apart from their setting; one not given keeps the setting's default
    renamed = {o.field: values.pop(o.dest) for o in OPTIONS if o.setting and o.dest in values}
    kwargs: dict[str, Any] = {
        **renamed,
        "host": values.pop("host", "0.0.0.0" if token else "127.0.0.1"),
        # with GPU slots and no explicit size, one kernel per GPU
        "pool_size": values.pop("pool_size", len(values.get("gpu_slots") or ()) or 2),
        "recycle": RecyclePolicy(recycle),
        "token": token,
        "max_input_bytes": max_input_bytes_from_env(environ),
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
    if (
        metrics_port
        and metrics_port == kwargs.get("port", DEFAULT_PORT)
        and not values.get("connect")
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
    directory. By default glibc gives each such buffer its own ``mmap`` and returns it on
    ``free``: ~256 page faults per megabyte uploaded (and the kernel zeroing those pages), a
    fifth of the worker's CPU for a 10 MB input. Here buffers up to 1 MiB come from the heap,
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


def _host_given(argv: Sequence[str] | None) -> bool:
    """Whether ``--host`` (or its variable) chose the address, rather than the token."""
    host = next(o for o in OPTIONS if o.flag == "--host")
    args = build_parser().parse_args(argv)
    return args.host is not None or bool(os.environ.get(host.env, "").strip())


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["run"]:  # `strata-kernel-worker run CELL.py …`: the client, not the server
        from .client.cli import main as run_cell

        raise SystemExit(run_cell(args[1:]))
    from .http.app import create_app
    from .http.server import bind, serve

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
    elif settings.token is not None and settings.connect is None and not _host_given(argv):
        log.warning(
            "STRATA_WORKER_TOKEN is set, so the worker binds 0.0.0.0 (every interface), not "
            "127.0.0.1: pass --host 127.0.0.1 to keep it on this machine"
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
        from .http.relay import run_connected

        raise SystemExit(
            asyncio.run(
                run_connected(app, settings.connect, settings.connect_token, settings.drain_seconds)
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
