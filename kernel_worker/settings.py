"""Worker settings: one frozen value built from the command line and the environment."""

from __future__ import annotations

import errno
import os
import re
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from kernel_pool import RecyclePolicy

from .runs.limits import (
    DEFAULT_MAX_DISPLAY_BYTES,
    DEFAULT_MAX_FOLDER_INPUT_ENTRIES,
    DEFAULT_MAX_OUTPUT_DIR_FILES,
    DEFAULT_MAX_RUN_DISPLAY_BYTES,
    RunLimits,
)

DEFAULT_PORT = 9000
DEFAULT_MAX_INPUT_BYTES = 2 * 1024**3
_MIN_TMPFS_BYTES = 2 * 1024**3
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_TRUE = frozenset({"1", "true", "yes"})


def parse_size(text: str) -> int:
    """``"512M"``, ``"4GiB"``, ``"1048576"`` → bytes."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (use e.g. 512M, 4G or a number of bytes)")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value < 1:
        raise ValueError(f"size must be positive: {text!r}")
    return int(value)


def parse_gpu_slots(text: str) -> tuple[str, ...]:
    """``"2"`` → ``("0", "1")`` (a count, as the reference takes it); ``"0,3"`` → ids."""
    text = text.strip()
    if not text:
        return ()
    if text.isdigit():
        count = int(text)
        if count < 1:
            raise ValueError("--gpu-slots must be at least 1")
        return tuple(str(i) for i in range(count))
    slots = tuple(part.strip() for part in text.split(","))
    if any(not slot for slot in slots):
        raise ValueError(f"empty GPU id in {text!r}")
    return slots


_WORKER_ID = re.compile(r"[A-Za-z0-9-]{1,63}")
_NOT_ID = re.compile(r"[^A-Za-z0-9-]+")
_PEER_DNS = re.compile(r"dns:([A-Za-z0-9.-]+):(\d{1,5})")


def parse_worker_id(text: str) -> str:
    """``--worker-id``: 1 to 63 letters, digits and dashes (it starts every job id)."""
    value = text.strip()
    if not _WORKER_ID.fullmatch(value):
        raise ValueError(f"a worker id is 1 to 63 letters, digits and dashes, got {text!r}")
    return value


def default_worker_id(port: int) -> str:
    """The host's name and the port, so that workers on one host differ: ``gpu-3-9000``."""
    host = _NOT_ID.sub("-", socket.gethostname()).strip("-")[:57] or "worker"
    return f"{host}-{port}"


def parse_peers(text: str) -> tuple[str, ...]:
    """``--peers``: base URLs (``http://10.0.0.2:9000``) and ``dns:NAME:PORT`` entries,
    comma-separated; URLs lose a trailing slash."""
    peers: list[str] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        dns = _PEER_DNS.fullmatch(entry)
        if dns is not None:
            if not 0 < int(dns.group(2)) <= 65535:
                raise ValueError(f"peer {entry!r}: the port must be 1-65535")
            peers.append(entry)
            continue
        try:
            parts = urlsplit(entry)
            parts.port  # noqa: B018 (raises for a port out of range)
        except ValueError as exc:
            raise ValueError(f"peer {entry!r}: not a usable URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"peer {entry!r}: use http://HOST:PORT, https://… or dns:NAME:PORT")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(f"peer {entry!r}: a base URL without credentials, query or fragment")
        peers.append(entry.rstrip("/"))
    return tuple(peers)


def max_input_bytes_from_env(environ: Mapping[str, str]) -> int:
    """``STRATA_WORKER_MAX_INPUT_BYTES``; unparsable or non-positive → the default."""
    try:
        value = int(environ.get("STRATA_WORKER_MAX_INPUT_BYTES", ""))
    except ValueError:
        return DEFAULT_MAX_INPUT_BYTES
    return value if value > 0 else DEFAULT_MAX_INPUT_BYTES


def allow_local_hosts_from_env(environ: Mapping[str, str]) -> bool:
    """``STRATA_WORKER_ALLOW_LOCAL_HOSTS``: 1/true/yes lifts the pull model's address rule."""
    return environ.get("STRATA_WORKER_ALLOW_LOCAL_HOSTS", "").strip().lower() in _TRUE


def allowed_hosts_from_env(environ: Mapping[str, str]) -> tuple[str, ...]:
    """``STRATA_WORKER_ALLOWED_HOSTS``: comma-separated names, or ``.suffix`` entries."""
    raw = environ.get("STRATA_WORKER_ALLOWED_HOSTS", "")
    return tuple(entry.strip().lower() for entry in raw.split(",") if entry.strip())


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    pool_size: int = 2
    spares: int = 0
    kernel_name: str | None = None
    kernel_start: str = "fork"
    """'fork' (from the pool's fork server) or 'spawn'; see kernel_pool.KernelKind.fork."""
    preload: str | None = None
    kernel_init: str | None = None
    """A file run in each kernel after the fork (the preload runs once, before it)."""
    locked_environments: bool = True
    """Run cells in their notebook's locked environment, where uv works here."""
    env_root: Path | None = None
    """Where environments are built; None: STRATA_WORKER_ENV_ROOT, else ~/.strata/worker-envs."""
    env_registry_url: str | None = None
    allow_source_builds: bool = False
    env_pool_size: int = 1
    max_kernels: int | None = None
    """Kernels of every pool together; None: the worker's own pool plus 4."""
    env_max_disk: int | None = None
    env_warm_up: bool = True
    """Make the kernel overlay and fork template of uv's first Python at start, beside the
    serving, so a new environment's first cell does not pay them."""
    r_kernels: bool = True
    """Run R cells on IRkernel kernels, where R and what the R side needs are found."""
    r_pool_size: int = 1
    """Kernels of the R cells' pool (started on the first R cell)."""
    kernel_start_timeout: float = 600.0
    """Seconds a kernel may take to start, its preload included (a model may load for long)."""
    recycle: RecyclePolicy = RecyclePolicy.RESET
    max_uses: int | None = None
    max_kernel_memory: int | None = None
    gpu_slots: tuple[str, ...] = ()
    timeout_status: int = 408
    log_level: str = "info"
    log_format: str = "text"
    access_log_probes: bool = False
    """Whether successful ``/ready`` and ``/health`` probes get access-log lines."""
    metrics_port: int | None = None
    token: str | None = field(default=None, repr=False)
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
    queue_wait_seconds: float = 2.0
    queue_depth: int = 32
    max_concurrent: int | None = None
    """Executions admitted at once (running or waiting for a kernel); more get 503."""
    job_ttl_seconds: float = 600.0
    console_cap: int = 16 * 1024 * 1024
    max_folder_input_bytes: int | None = None
    """Bytes a ``dir/tar`` input may unpack to; None: ``max_input_bytes``."""
    max_folder_input_entries: int = DEFAULT_MAX_FOLDER_INPUT_ENTRIES
    max_display_bytes: int = DEFAULT_MAX_DISPLAY_BYTES
    max_run_display_bytes: int = DEFAULT_MAX_RUN_DISPLAY_BYTES
    max_output_dir_files: int = DEFAULT_MAX_OUTPUT_DIR_FILES
    file_reuse_bytes: int = 256 * 1024 * 1024
    """Large files of finished runs kept for later inputs to be written over (file_reuse)."""
    bundle_compresslevel: int | None = None
    """gzip level of bundles; None: chosen by size and a sample (bundle.choose_level)."""
    run_root: Path | None = None
    kernel_user: str | None = None
    kernel_uids: tuple[int, int] | None = None
    """Each kernel its own uid, from this range (``--kernel-user FIRST-LAST``)."""
    launch_id: str | None = None
    interrupt_grace_seconds: float = 2.0
    output_dir_poll_seconds: float = 5.0
    drain_seconds: float = 30.0
    drain_notice_seconds: float = 0.0
    """On SIGTERM, how long ``/ready`` answers 503 while cells are still taken, before the
    drain: the load balancer's health check takes the worker out first."""
    worker_id: str | None = None
    """Starts every job id (``<worker-id>.<random>``); None: :func:`default_worker_id`."""
    peers: tuple[str, ...] = ()
    """The other workers behind the same load balancer: polls and cancels this worker cannot
    answer are forwarded to them (see http/fleet)."""
    heartbeat_seconds: float | None = None
    """``POST /execute`` answers that take longer stream a space this often (strata-pool)."""
    kernel_env_allowlist: tuple[str, ...] = ()
    """``STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST``: when set, kernels see only these variables
    (and a floor any process needs); see kernel_env."""
    body_timeout_seconds: float = 60.0
    """An upload that sends nothing for this long is answered 408 and its inputs removed."""
    header_timeout_seconds: float = 10.0
    """A connection whose request headers are not all in this long after its first byte is
    closed (see connections)."""
    send_timeout_seconds: float = 60.0
    """A connection whose answer could not move for this long (its client stopped reading)
    is closed."""
    max_connections: int = 1024
    """Connections open at once; one more closes the one idle longest (see connections)."""
    max_uploads: int = 16
    """Push-model request bodies received at once; more get 503."""
    connect: str | None = None
    """A relay's ws:// or wss:// URL to dial and serve through, instead of binding a port."""
    connect_token: str | None = field(default=None, repr=False)
    """``STRATA_WORKER_CONNECT_TOKEN``: the relay's bearer token."""
    # pull model (spec §10): where signed URLs may point
    allow_local_hosts: bool = False
    allowed_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.timeout_status not in (408, 504):
            raise ValueError("timeout status must be 408 or 504")
        if self.bundle_compresslevel is not None and not 0 <= self.bundle_compresslevel <= 9:
            raise ValueError("bundle compression level must be 0..9")
        if self.queue_wait_seconds < 0:
            raise ValueError("queue wait must not be negative")
        if self.log_format not in ("text", "json"):
            raise ValueError("log format must be 'text' or 'json'")
        if self.queue_depth < 0:
            raise ValueError("queue depth must not be negative")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError("max concurrent executions must be at least 1")
        if self.job_ttl_seconds <= 0:
            raise ValueError("job TTL must be positive")
        if self.file_reuse_bytes < 0:
            raise ValueError("file reuse bytes must not be negative")
        if self.heartbeat_seconds is not None and not self.heartbeat_seconds > 0:
            raise ValueError("heartbeat interval must be positive")
        if not self.body_timeout_seconds > 0:
            raise ValueError("body timeout must be positive")
        self.limits  # noqa: B018 (raises for a cap below 1)
        if not (self.header_timeout_seconds > 0 and self.send_timeout_seconds > 0):
            raise ValueError("header and send timeouts must be positive")
        if self.max_connections < 1 or self.max_uploads < 1:
            raise ValueError("max connections and max uploads must be at least 1")
        if self.connect is not None:
            _check_relay_url(self.connect)
        if self.drain_notice_seconds < 0:
            raise ValueError("drain notice must not be negative")
        if self.worker_id is not None:
            parse_worker_id(self.worker_id)
        if self.connect and self.connect_token and not _header_safe(self.connect_token):
            # never echoed: it is a secret
            raise ValueError(
                "STRATA_WORKER_CONNECT_TOKEN holds characters an HTTP header cannot carry"
            )

    @property
    def limits(self) -> RunLimits:
        """The caps on what one run may unpack, display and return."""
        return RunLimits(
            folder_input_bytes=self.max_folder_input_bytes or self.max_input_bytes,
            folder_input_entries=self.max_folder_input_entries,
            display_bytes=self.max_display_bytes,
            run_display_bytes=self.max_run_display_bytes,
            output_dir_files=self.max_output_dir_files,
        )


def _check_relay_url(url: str) -> None:
    if not url.startswith(("ws://", "wss://")):
        raise ValueError("--connect takes a ws:// or wss:// URL")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises for a port out of range)
    except ValueError as exc:
        raise ValueError(f"--connect: not a usable URL: {exc}") from None
    if not parts.hostname:
        raise ValueError("--connect: the URL names no host")


def _header_safe(value: str) -> bool:
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return value.isprintable()


def default_run_root() -> Path | None:
    """A tmpfs for run directories when there is one with room, else the system temp dir.

    Directory and file churn costs milliseconds per request on a journaling disk and
    microseconds on tmpfs; a small tmpfs (e.g. a container's 64 MiB /dev/shm) is skipped.
    """
    shm = Path("/dev/shm")
    try:
        stats = os.statvfs(shm)
    except OSError:
        return None
    room = stats.f_bavail * stats.f_frsize
    return shm if room >= _MIN_TMPFS_BYTES and os.access(shm, os.W_OK) else None


def prepare_run_root(parent: Path | None) -> Path:
    """The folder run directories go in, made (with its parents) when missing (blocking).

    Raises:
        OSError: it cannot be made, or is not a writable directory; ``strerror`` says why.
    """
    root = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    try:
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file, or a link to one, by that name
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(root)) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "not writable by the worker", str(root))
    return root


_MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def memory_backed(path: Path) -> bool:
    """Whether ``path`` lives on a memory filesystem (tmpfs, ramfs), per ``/proc/self/mountinfo``.

    There, creating, writing and removing a few small files takes microseconds and can never
    wait for a disk, so the worker does it inline instead of paying a thread hop.
    """
    try:
        target = os.path.realpath(path)
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            mounts = fh.read().splitlines()
    except OSError:
        return False
    best, fstype = "", ""
    for line in mounts:
        fields = line.split(" ")
        try:
            point = fields[4].replace("\\040", " ")
            kind = fields[fields.index("-") + 1]
        except (IndexError, ValueError):
            continue
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, kind
    return fstype in _MEMORY_FILESYSTEMS
