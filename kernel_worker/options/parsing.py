"""How an option's text becomes its value: each parser raises ``ArgumentTypeError`` with a
message that names what was wrong, which the command line prints after the flag."""

from __future__ import annotations

import argparse
import math

from ..settings import parse_gpu_slots, parse_peers, parse_size, parse_worker_id

__all__ = [
    "ENV_PREFIX",
    "LOG_LEVELS",
    "compresslevel",
    "log_level",
    "non_negative_int",
    "peer_list",
    "port",
    "positive_int",
    "positive_seconds",
    "seconds",
    "size",
    "size_or_zero",
    "slots",
    "worker_id",
]

ENV_PREFIX = "STRATA_KERNEL_WORKER_"
"""Every option's environment variable but the few shared with Strata's own worker."""


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (0-65535), got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def size_or_zero(text: str) -> int:
    return 0 if text.strip() == "0" else size(text)


def slots(text: str) -> tuple[str, ...]:
    try:
        return parse_gpu_slots(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seconds(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):  # refuses nan and inf too
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more, got {text}")
    return value


LOG_LEVELS = ("debug", "info", "warning", "error")


def log_level(text: str) -> str:
    value = text.strip().lower()
    if value not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)}, got {text}")
    return value


def positive_seconds(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):  # refuses nan and inf too
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def compresslevel(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 9:
        raise argparse.ArgumentTypeError("must be 0 (stored) to 9")
    return value


def worker_id(text: str) -> str:
    try:
        return parse_worker_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def peer_list(text: str) -> tuple[str, ...]:
    try:
        return parse_peers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
