"""The memory of the pool's processes, as the kernel accounts for shared pages.

A forked kernel shares the template's pages (the preloaded model) until it writes to them,
so resident size (RSS) counts a shared model once per kernel. ``/proc/PID/smaps_rollup``
tells the truth: PSS charges each shared page to its sharers in equal parts (the kernels'
PSS adds up to what they really use), USS is what only that process holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass

_FIELDS = {b"Rss:": "rss", b"Pss:": "pss", b"Private_Clean:": "uss", b"Private_Dirty:": "uss"}


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """Bytes: resident, proportional share (PSS), unique to the process (USS)."""

    rss: int
    pss: int
    uss: int


@dataclass(frozen=True, slots=True)
class PoolMemory:
    """The template's (the fork server, where the preload ran) and each kernel's memory."""

    template: ProcessMemory | None
    kernels: Mapping[str, ProcessMemory]

    def as_dict(self) -> dict[str, object]:
        kernels = {kernel: asdict(memory) for kernel, memory in self.kernels.items()}
        return {
            "template": asdict(self.template) if self.template is not None else None,
            "kernels": kernels,
            "kernels_pss_total": sum(memory.pss for memory in self.kernels.values()),
        }


def process_memory(pid: int | None) -> ProcessMemory | None:
    """The process's memory from ``smaps_rollup``; None if it is gone or unreadable."""
    if pid is None:
        return None
    totals = {"rss": 0, "pss": 0, "uss": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] in _FIELDS:
            with contextlib.suppress(ValueError):
                totals[_FIELDS[parts[0]]] += int(parts[1]) * 1024  # kB
    return ProcessMemory(**totals)
