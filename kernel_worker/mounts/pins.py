"""What a pinned read-only mount was listed with, remembered per worker.

A mount with a ``pin`` promises that its contents do not change while the pin stays the
same, so the worker lists it once: later runs with the same pin, URI and options place the
remembered listing (see :mod:`kernel_worker.mounts.materialize`), as the reference reuses a
pinned view.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from hashlib import sha256
from typing import Generic, TypeVar

__all__ = ["PinnedListings", "pin_key"]

Placement = TypeVar("Placement")
"""What one listed object is placed as (the mount cache's ``Placement``)."""

_MAX_PINS = 256


def pin_key(protocol: str, scope: str, path: str, pin: str) -> str:
    """The identity of a pinned mount's contents: where it points, seen with which
    options (*scope*), at which pin."""
    return sha256("\0".join(["pin", protocol, scope, path, pin]).encode()).hexdigest()


class PinnedListings(Generic[Placement]):
    """The most recent 256 pinned listings, safe to use from worker threads."""

    def __init__(self) -> None:
        self._listings: OrderedDict[str, tuple[Placement, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[Placement, ...] | None:
        with self._lock:
            found = self._listings.get(key)
            if found is not None:
                self._listings.move_to_end(key)
            return found

    def remember(self, key: str, placements: Sequence[Placement]) -> None:
        with self._lock:
            self._listings[key] = tuple(placements)
            self._listings.move_to_end(key)
            while len(self._listings) > _MAX_PINS:
                self._listings.popitem(last=False)

    def forget(self, key: str) -> None:
        with self._lock:
            self._listings.pop(key, None)
